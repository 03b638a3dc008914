"""Patch bookkeeping: which SGLang functions each patch replaces, and applying them reversibly.

Every patch names its targets by dotted path and records the sha256 of each target's source
(`installed_source.target_source`) in a known-good SGLang release; `patches check` compares
them with the installed SGLang, and the engine refuses a mismatch unless forced. A patch is
a set of attribute rebindings; removing it puts back the exact objects that were there, so
apply/remove/apply leaves SGLang as found.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

KNOWN_GOOD_VERSIONS: tuple[str, ...] = ("0.5.23",)
_MISSING = object()


@dataclass(frozen=True)
class Target:
    """One SGLang object a patch depends on: replaced, or relied on to behave as read."""

    path: str
    sha256: str
    role: str = "replaced"


def resolve(path: str) -> Any:
    """Import the longest module prefix of `path`, then walk the remaining attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name is not None and ".".join(parts[:cut]).startswith(e.name):
                continue
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


@dataclass
class Rebinding:
    """`owner.name = replacement`, remembering whether `name` lived in owner's own __dict__."""

    owner_path: str
    name: str
    make: Callable[[Any], Any]
    """Builds the replacement from the original object (None when `adds`)."""
    adds: bool = False
    """True: `name` is new on owner (a method specdash adds); it must not exist yet."""
    _owner: Any = field(default=None, repr=False)
    _own: Any = field(default=_MISSING, repr=False)
    _original: Any = field(default=_MISSING, repr=False)

    @property
    def applied(self) -> bool:
        return self._owner is not None

    def apply(self) -> None:
        if self.applied:
            return
        owner = resolve(self.owner_path)
        original = None if self.adds else getattr(owner, self.name)
        own = vars(owner).get(self.name, _MISSING)
        setattr(owner, self.name, self.make(original))
        self._owner, self._own, self._original = owner, own, original

    def remove(self) -> None:
        if not self.applied:
            return
        if self._own is _MISSING:
            delattr(self._owner, self.name)
        else:
            setattr(self._owner, self.name, self._own)
        self._owner, self._own, self._original = None, _MISSING, _MISSING

    @property
    def original(self) -> Any:
        """The object the patch replaced (an inherited value included)."""
        if not self.applied:
            return getattr(resolve(self.owner_path), self.name)
        return self._original


@dataclass
class Patch:
    """A named group of rebindings applied and removed together."""

    name: str
    summary: str
    targets: tuple[Target, ...]
    rebindings: tuple[Rebinding, ...]
    checked_versions: tuple[str, ...] = KNOWN_GOOD_VERSIONS

    @property
    def applied(self) -> bool:
        return all(r.applied for r in self.rebindings)

    def apply(self) -> None:
        done: list[Rebinding] = []
        try:
            for r in self.rebindings:
                r.apply()
                done.append(r)
        except BaseException:
            for r in reversed(done):
                r.remove()
            raise

    def remove(self) -> None:
        for r in reversed(self.rebindings):
            r.remove()

    def rebinding(self, name: str) -> Rebinding:
        return next(r for r in self.rebindings if r.name == name)


def all_patches() -> list[Patch]:
    """The four patches, in the order they are applied."""
    from specdash.engine_patches import (
        gdn_verify_as_decode,
        gemm_routing,
        telemetry,
        verify_attention_as_decode_rows,
    )

    return [
        gdn_verify_as_decode.PATCH,
        verify_attention_as_decode_rows.PATCH,
        gemm_routing.PATCH,
        telemetry.PATCH,
    ]


def target_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Dotted path -> (expected source hash, SGLang versions it was checked against)."""
    return {t.path: (t.sha256, p.checked_versions) for p in all_patches() for t in p.targets}


def apply_all(names: list[str] | None = None) -> list[str]:
    """Apply the named patches (all by default); returns the names applied."""
    applied = []
    for p in all_patches():
        if names is None or p.name in names:
            p.apply()
            applied.append(p.name)
    return applied


def remove_all() -> None:
    for p in reversed(all_patches()):
        p.remove()
