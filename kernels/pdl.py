"""Programmatic dependent launch (PDL) for the row kernels of a decode or verify step.

Why: a decode step of the 27B shape is ~700 kernels, and under a CUDA graph every kernel
boundary still leaves the SMs idle while the next grid launches. With PDL (Hopper and later)
the next kernel may launch once every program of this one has signalled
(``griddepcontrol.launch_dependents``) or exited; it reads nothing a predecessor writes until
``griddepcontrol.wait`` returns, which is after the previous grid completed and its memory is
visible. The arithmetic is unchanged, so are the bits.

Every row kernel waits before its first load or store, so ordering is transitive: kernel n+1's
wait returns only after kernel n completed, which itself waited for kernel n-1. A torch kernel
in between never signals, so the next row kernel waits for it in full.

Modes (``SPECDASH_PDL``): ``off``; ``late``: the GEMM signals after its K loop, the others
when they exit; ``early``: every kernel signals at its start, so the next kernel's programs
sit resident, waiting, while this one runs.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

MODES = {"off": 0, "late": 1, "early": 2}
MODE = os.environ.get("SPECDASH_PDL", "late")
if MODE not in MODES:
    raise ValueError(f"SPECDASH_PDL={MODE!r}: choose one of {', '.join(MODES)}")


@cache
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(device: torch.device) -> int:
    """The kernels' PDL constexpr on `device`: 0 (off; always under Triton's CPU interpreter),
    1 (late), 2 (early). Launch with ``launch_pdl=bool(...)``."""
    if device.type != "cuda" or not _hopper(device.index or 0):
        return 0
    return MODES[MODE]


@triton.jit
def start_after_predecessor(PDL: tl.constexpr):
    """Wait until the previous kernel's writes are visible (in early mode, first let the next
    kernel launch)."""
    if PDL == 2:
        gdc_launch_dependents()
    if PDL > 0:
        gdc_wait()


@triton.jit
def let_successor_launch(PDL: tl.constexpr):
    """Late mode: this program's remaining work does not hold back the next kernel's launch."""
    if PDL == 1:
        gdc_launch_dependents()
