"""The native engine's drafters: `--drafter`'s choices and the settings' `drafter`. Each is
one of SGLang's speculative algorithms run by specdash's own engine (`algorithm`), which the
session's header names."""

from __future__ import annotations

from dataclasses import dataclass

from specdash.registry import Entry, names


@dataclass(frozen=True, slots=True)
class DrafterEntry(Entry):
    """`implementation`: the `Drafter` class, built with the draft model where `draft_model`,
    else with no arguments."""

    algorithm: str = ""
    """The speculative algorithm it is (`specdash.registry.algorithms`)."""
    draft_model: bool = False
    """It drafts with a draft model (`--draft`, or the embedded one), loaded for it."""


DRAFTERS: tuple[DrafterEntry, ...] = (
    DrafterEntry(
        "model",
        "draft with a small model",
        "specdash.engine.drafters:ModelDrafter",
        "STANDALONE",
        draft_model=True,
    ),
    DrafterEntry(
        "ngram", "draft by prompt lookup (n-gram)", "specdash.engine.drafters:NgramDrafter", "NGRAM"
    ),
)

NAMES = names(DRAFTERS)


def drafter(name: str) -> DrafterEntry:
    return next(d for d in DRAFTERS if d.name == name)


def uses_draft_model(name: str) -> bool:
    """Whether drafter `name` drafts with a draft model (the settings name a known one)."""
    return drafter(name).draft_model


def algorithm(drafter: str) -> str | None:
    """The speculative algorithm `drafter` runs (None: no drafter of that name)."""
    return next((d.algorithm for d in DRAFTERS if d.name == drafter), None)
