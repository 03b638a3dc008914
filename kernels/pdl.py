"""Programmatic dependent launch (PDL) for the row kernels of a decode or verify step.

Why: a decode step of the 27B shape is ~700 kernels, and under a CUDA graph every kernel
boundary still leaves the SMs idle for about a microsecond while the next grid launches and
its first loads travel to memory. With PDL (Hopper and later) each row kernel tells the
hardware at its start that the next kernel may launch (``griddepcontrol.launch_dependents``),
so the next kernel's programs become resident while this one runs; they read nothing a
predecessor writes until ``griddepcontrol.wait`` returns, which is after the previous grid
completed and its memory is visible. Work that depends on nothing (the GEMM's prefetch of its
constant weights into L2) goes before the wait. The arithmetic is unchanged, so are the bits.

Every row kernel waits before its first dependent load or store, so ordering is transitive:
kernel n+1's wait returns only after kernel n completed, which itself waited for kernel n-1.
A torch kernel in between never triggers early, so the next row kernel waits for it in full.

``SPECDASH_PDL=0`` turns it off (the benchmarks compare both in one run).
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
    """Let the next kernel launch now, then wait until the previous kernel's writes are visible."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def prefetch_rows_l2(row_ptrs, nbytes):
    """Start pulling `nbytes` (a multiple of 16) from each 16-byte aligned row start into L2:
    one bulk prefetch per row (sm_90), no registers or shared memory held while it flies."""
    addr = row_ptrs.to(tl.int64, bitcast=True)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
        "=r,l,r",
        [addr, tl.full(addr.shape, nbytes, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
