"""Patch bookkeeping: which SGLang functions each patch replaces, and applying them reversibly.

Every patch carries one `Variant` per supported SGLang release (0.5.17, 0.5.23): the targets
it replaces or relies on, by dotted path with the sha256 of each target's source
(`installed_source.target_source`) in that release, and the rebindings that apply it there.
`patches check` compares the installed SGLang with the matching release's row, and the engine
refuses a mismatch unless forced. A variant is a set of attribute rebindings; removing it puts
back the exact objects that were there, so apply/remove/apply leaves SGLang as found.
The patches themselves, and applying them all: `patch_set`.
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

SUPPORTED_VERSIONS: tuple[str, ...] = ("0.5.17", "0.5.23")
ROW_ENV = "SPECDASH_SGLANG_PATCH_ROW"
"""The release row to apply on an SGLang outside SUPPORTED_VERSIONS (with --force-patches, the
row `patches check` matched best): set for a session's SGLang processes by
`process.session_environment`, read by the scheduler process."""
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


def patch_row() -> str:
    """The release whose variants apply here: the installed SGLang when supported, else the
    row --force-patches chose."""
    version = sglang_version()
    if version in SUPPORTED_VERSIONS:
        return version
    row = os.environ.get(ROW_ENV)
    if row in SUPPORTED_VERSIONS:
        return row
    raise RuntimeError(
        f"sglang {version}: no patch row (supported: {', '.join(SUPPORTED_VERSIONS)})"
    )


@dataclass
class Rebinding:
    """`owner.name = replacement`, remembering whether `name` lived in owner's own __dict__."""

    owner_path: str
    name: str
    make: Callable[[Any], Any]
    """Builds the replacement from the original object (None when `adds`)."""
    adds: bool = False
    """True: `name` is new on owner (a method specdash adds); it must not exist yet."""
    if_bound: bool = False
    """True: owner binds `name` only on some machines (an import under `if _is_cuda:`); where
    it does not, there is nothing to replace and the rebinding stays unapplied."""
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
        if self.if_bound and not hasattr(owner, self.name):
            return
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


class Change(Protocol):
    """What a variant applies: a `Rebinding`, or a patch's own reversible change."""

    @property
    def applied(self) -> bool: ...

    def apply(self) -> None: ...

    def remove(self) -> None: ...


@dataclass
class Variant:
    """A patch as it applies to one SGLang release."""

    targets: tuple[Target, ...]
    rebindings: tuple[Change, ...]


@dataclass
class Patch:
    """A named group of rebindings applied and removed together, per SGLang release."""

    name: str
    flag: str
    """Its name for `--sglang-unpatch`."""
    summary: str
    variants: dict[str, Variant]
    """SGLang release -> the variant for it."""
    always: bool = False
    """A fix SGLang needs to start a configuration, not an exactness patch: applied in every
    engine, stock included; not an `--sglang-unpatch` choice."""
    _applied: Variant | None = field(default=None, repr=False)

    def variant(self, row: str | None = None) -> Variant:
        return self.variants[row or patch_row()]

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.variant().targets

    @property
    def applied(self) -> bool:
        return self._applied is not None

    def apply(self, row: str | None = None) -> None:
        if self._applied is not None:
            return
        variant = self.variant(row)
        done: list[Change] = []
        try:
            for r in variant.rebindings:
                r.apply()
                done.append(r)
        except BaseException:
            for r in reversed(done):
                r.remove()
            raise
        self._applied = variant

    def remove(self) -> None:
        if self._applied is None:
            return
        for r in reversed(self._applied.rebindings):
            r.remove()
        self._applied = None


def edited_source(source: str, edits: tuple[tuple[str, str], ...], what: str) -> str:
    """`source` with each (old, new) of `edits` replaced; ValueError naming `what` unless each
    old text is there exactly once (a release that moved it needs the patch redone, not half
    applied)."""
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"{what} found {source.count(old)}x")
        source = source.replace(old, new)
    return source


def compiled_from_edited(fn: Any, edits: tuple[tuple[str, str], ...], patch: str) -> Any:
    """`fn` compiled again from its source with `edits` applied, in a copy of its module's
    globals. The text goes into linecache under its own file name, so tracebacks show its lines
    and Triton (and its interpreter) can read a kernel back with `inspect`."""
    what = f"{patch}: {fn.__module__}.{fn.__qualname__}"
    text = textwrap.dedent(edited_source(inspect.getsource(fn), edits, what))
    filename = f"<specdash {what}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    namespace = dict(fn.__globals__)
    exec(compile(text, filename, "exec"), namespace)
    return namespace[fn.__name__]
