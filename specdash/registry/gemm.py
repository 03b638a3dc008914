"""The GEMM backends: `--gemm-backend`'s choices, and what `specdash.kernels.gemm_backends`
builds for each device (each entry's `implementation` makes its `GemmBackend`). SGLang's GEMM
routing offers the CUDA ones as `specdash-<name>` beside SGLang's own kernels
(`specdash.runs.sglang.patches.gemm_routing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specdash.registry import Entry, names


@dataclass(frozen=True, slots=True)
class GemmEntry(Entry):
    device: Literal["cpu", "cuda", "any"] = "cuda"
    """The device type it runs on ("any": `auto`, which picks per device)."""


_BUILD = "specdash.kernels.gemm_backends"

AUTO = GemmEntry(
    "auto", "torch on the CPU, triton on CUDA (triton-fp8 for a block-FP8 model)", None, "any"
)
GEMM_BACKENDS: tuple[GemmEntry, ...] = (
    AUTO,
    GemmEntry("torch", "the CPU's exact GEMM (C, batch-invariant)", f"{_BUILD}:build_torch", "cpu"),
    GemmEntry("cublas", "cuBLAS, exact rows one by one", f"{_BUILD}:build_cublas"),
    GemmEntry("triton", "specdash's batch-invariant Triton tile", f"{_BUILD}:build_triton"),
    GemmEntry(
        "triton-fused", "the Triton tile with the row ops fused in", f"{_BUILD}:build_triton_fused"
    ),
    GemmEntry(
        "triton-fp8",
        "the Triton tile, and its FP8 twin for a block-FP8 model's FP8 weights",
        f"{_BUILD}:build_triton_fp8",
    ),
    GemmEntry(
        "deepgemm", "DeepGEMM's bf16 GEMM, exact rows one by one", f"{_BUILD}:build_deepgemm"
    ),
)

NAMES = names(GEMM_BACKENDS)


def on(device: Literal["cpu", "cuda"]) -> tuple[GemmEntry, ...]:
    """The backends built for `device`'s type, in the registry's order."""
    return tuple(e for e in GEMM_BACKENDS if e.device == device)
