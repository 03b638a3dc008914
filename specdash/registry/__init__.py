"""What specdash can run, one list per concept: `engines`, `gemm` (GEMM backends), `drafters`
and `algorithms` (SGLang's speculative algorithms). An entry is a name, one line of help and
where its implementation lives, imported only when it runs, so the command line's choices and
`--help`, the settings, the dashboard and the tests read the names without importing torch or
SGLang. Nothing here imports anything of specdash but this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    """One name of a registry."""

    name: str
    help: str
    """One line: what choosing it means."""
    implementation: str | None
    """Where it lives, "module:attribute", imported by `load`; None where nothing of specdash
    implements it (an SGLang algorithm, "auto")."""

    def load(self) -> Any:
        """The implementation (its module imported now)."""
        assert self.implementation is not None, f"{self.name} has no implementation of its own"
        module, _, attribute = self.implementation.partition(":")
        return getattr(importlib.import_module(module), attribute)


def names(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The entries' names, in the registry's order (the command line's choices)."""
    return tuple(e.name for e in entries)


def help_lines(entries: Iterable[Entry]) -> str:
    """ "name: help" for each entry, for a flag's `--help`."""
    return "; ".join(f"{e.name}: {e.help}" for e in entries)
