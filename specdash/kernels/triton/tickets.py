"""Zeroed int32 counters for kernels in which the last program of a group to arrive finishes the
group's work (an atomic ticket): the split-K GEMM's fixup, the fused GDN step's conv window.

Why shared buffers: a CUDA graph captured after a warm-up call must allocate nothing, so each
kernel family keeps one buffer per device, grown only outside capture, and every kernel leaves
its counters zero again.
"""

from __future__ import annotations

import torch

_buffers: dict[tuple[str, torch.device], torch.Tensor] = {}


def counters(owner: str, device: torch.device, count: int) -> torch.Tensor:
    """At least `count` zeroed int32 counters for `owner`'s kernels on `device`."""
    buf = _buffers.get((owner, device))
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, 1 << 14), device=device, dtype=torch.int32)
        _buffers[owner, device] = buf
    return buf
