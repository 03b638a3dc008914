"""Programmatic dependent launch (PDL) for the row kernels of a decode or verify step.

Why: a decode step of the 27B shape is ~700 kernels, and under a CUDA graph every kernel
boundary still leaves the SMs idle while the next grid launches. With PDL (Hopper and later)
the next kernel may launch once every program of this one has signalled
(``griddepcontrol.launch_dependents``: the GEMM does so after its K loop) or exited; it reads
nothing a predecessor writes until ``griddepcontrol.wait`` returns, which is after the previous
grid completed and its memory is visible. The arithmetic is unchanged, so are the bits.

Every row kernel waits before its first load or store, so ordering is transitive: kernel n+1's
wait returns only after kernel n completed, which itself waited for kernel n-1. A torch kernel
in between never signals, so the next row kernel waits for it in full.

Measured on an H200 (docs/PERF.md): +1-2 % on back-to-back GEMMs, within noise on the whole
decode step. Signalling at every kernel's start instead (the next kernel's programs then sit
resident, waiting) cost 6-12 %, with or without prefetching weights into L2 while waiting.
``SPECDASH_PDL=0`` turns it off.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENABLED = os.environ.get("SPECDASH_PDL", "1") != "0"


@cache
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL (never under Triton's CPU interpreter)."""
    return ENABLED and device.type == "cuda" and _hopper(device.index or 0)


@triton.jit
def start_after_predecessor(PDL: tl.constexpr):
    """Wait until the previous kernel's writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def let_successor_launch(PDL: tl.constexpr):
    """This program's remaining work (the epilogue) does not hold back the next launch."""
    if PDL:
        gdc_launch_dependents()
