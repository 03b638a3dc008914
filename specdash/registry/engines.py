"""The engines a session runs on: `--engine`'s choices and the settings' `engine`. Each
`implementation` takes (settings, engine options) and returns the session's backend
(`specdash.runs.session.Backend`)."""

from __future__ import annotations

from specdash.registry import Entry, names

ENGINES: tuple[Entry, ...] = (
    Entry("native", "specdash's own engine", "specdash.runs.native:backend"),
    Entry("sglang", "a patched sglang.Engine", "specdash.runs.sglang.backend:backend"),
)

NAMES = names(ENGINES)


def engine(name: str) -> Entry:
    return next(e for e in ENGINES if e.name == name)
