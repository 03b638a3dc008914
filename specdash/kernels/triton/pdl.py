"""Programmatic dependent launch (PDL) for the row kernels of a decode or verify step.

Why: a decode step of the 27B shape is ~700 kernels, and under a CUDA graph every kernel
boundary still leaves the SMs idle while the next grid launches. With PDL (Hopper and later)
the next kernel may launch once every program of this one has signalled
(``griddepcontrol.launch_dependents``) or exited; it reads nothing a predecessor writes until
``griddepcontrol.wait`` returns, which is after the previous grid completed and its memory is
visible. The arithmetic is unchanged, so are the bits. Two modes:

* ``LATE``: the GEMM signals after its K loop, so the next kernel launches while the GEMM's
  epilogue runs; row kernels do not signal.
* ``EARLY`` (default): in addition, each row kernel signals as soon as its wait returns, so
  the GEMM after it launches while it runs and, before waiting, prefetches its first pipeline
  fill of weights (never written by a predecessor) into L2 (`gemm.PREFETCH_FILLS`): the weight
  stream's ramp overlaps the row kernel instead of following it.

Every kernel waits before its first load or store of activations, so ordering is transitive:
kernel n+1's wait returns only after kernel n completed, which itself waited for kernel n-1. A
torch kernel in between never signals, so the next kernel waits for it in full. A row kernel
signals only after its wait, so at most one kernel runs ahead of the one that is working.

Measured (docs/PERF.md): LATE +1-2 % on back-to-back GEMMs and within noise on the whole decode
step (H200); EARLY +0.75-0.9 % over LATE on the 27B-shape decode step (H100, three runs, each
side by side). Signalling at every kernel's start, GEMMs included (the next kernel's programs
then sit resident beside the GEMM's), cost 6-12 %, with or without the L2 prefetch (H200).
``SPECDASH_PDL=0`` turns it off, ``SPECDASH_PDL=late`` selects LATE.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

OFF, LATE, EARLY = 0, 1, 2
MODE = {"0": OFF, "late": LATE}.get(os.environ.get("SPECDASH_PDL", ""), EARLY)


@cache
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(device: torch.device) -> int:
    """The PDL mode of kernels on `device`: OFF under Triton's CPU interpreter and before Hopper."""
    return MODE if device.type == "cuda" and _hopper(device.index or 0) else OFF


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    """Wait until the previous kernel's writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def start_after_predecessor(PDL: tl.constexpr):
    """A row kernel's start: wait for the predecessor, then (EARLY) let the successor launch."""
    wait_for_predecessor(PDL)
    if PDL == 2:  # EARLY
        gdc_launch_dependents()


@triton.jit
def let_successor_launch(PDL: tl.constexpr):
    """This program's remaining work (the epilogue) does not hold back the next launch."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def prefetch_rows_to_l2(row_ptrs, nbytes):
    """Ask for `nbytes` from each of `row_ptrs` (16-byte aligned) to be brought into L2 by the
    bulk copy engine (sm_90): no registers, no wait, nothing to read back."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
        "=r,l,r",
        [row_ptrs, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
