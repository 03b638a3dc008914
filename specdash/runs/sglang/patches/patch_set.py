"""The patches specdash applies to SGLang, in order: the two start-up fixes, then the six that
`--sglang-unpatch` can leave off; one looked up by its flag; applying and removing them together.

Each patch is its own module, built from `registry`'s bookkeeping (targets, rebindings,
per-release variants); this module is the one that knows them all.
"""

from __future__ import annotations

from specdash.runs.sglang.patches import (
    dflash_logprobs,
    fp8_routing,
    gdn_verify_as_decode,
    gemm_routing,
    lazy_dsa_import,
    memory_pools_in_turn,
    telemetry,
    verify_attention_as_decode_rows,
)
from specdash.runs.sglang.patches.registry import Patch


def all_patches() -> list[Patch]:
    """Every patch, in the order they are applied: the start-up fixes, then the six that can
    be left off."""
    return [
        lazy_dsa_import.PATCH,
        memory_pools_in_turn.PATCH,
        gdn_verify_as_decode.PATCH,
        verify_attention_as_decode_rows.PATCH,
        gemm_routing.PATCH,
        fp8_routing.PATCH,
        telemetry.PATCH,
        dflash_logprobs.PATCH,
    ]


def optional_patches() -> list[Patch]:
    """The patches `--sglang-unpatch` can leave off (stock SGLang: all of them off)."""
    return [p for p in all_patches() if not p.always]


def by_flag(flag: str) -> Patch:
    """The patch `--sglang-unpatch FLAG` names; KeyError lists the flags."""
    patches = {p.flag: p for p in optional_patches()}
    if flag not in patches:
        raise KeyError(f"unknown patch {flag!r}; one of {', '.join(patches)}")
    return patches[flag]


def apply_all(names: list[str] | None = None) -> list[str]:
    """Apply the named patches (all by default) and the `always` ones for this SGLang release;
    returns the names."""
    applied = []
    for p in all_patches():
        if p.always or names is None or p.name in names:
            p.apply()
            applied.append(p.name)
    return applied


def remove_all() -> None:
    for p in reversed(all_patches()):
        p.remove()
