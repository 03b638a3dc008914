"""Zeroed int32 counters for kernels in which the last program of a group to arrive finishes the
group's work (an atomic ticket): the split-K GEMMs' fixup (`sum_splits_in_order`), the fused GDN
step's conv window.

Why shared buffers: a CUDA graph captured after a warm-up call must allocate nothing, so each
kernel family keeps one buffer per device, grown only outside capture, and every kernel leaves
its counters zero again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_buffers: dict[tuple[str, torch.device], torch.Tensor] = {}


def counters(owner: str, device: torch.device, count: int) -> torch.Tensor:
    """At least `count` zeroed int32 counters for `owner`'s kernels on `device`."""
    buf = _buffers.get((owner, device))
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, 1 << 14), device=device, dtype=torch.int32)
        _buffers[owner, device] = buf
    return buf


@triton.jit
def sum_splits_in_order(
    part_ptr, ticket_ptr, acc, tile, mask, group, split_stride, SPLIT_K: tl.constexpr
):
    """A split-K program's fp32 partial `acc` stored at split tl.program_id(2); (whether this
    program took its tile's last ticket, and then the partials summed in split order 0, 1, ...):
    the order of arrival never reaches the arithmetic. The ticket is left zero again."""
    tl.store(part_ptr + tl.program_id(2) * split_stride + tile, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    ticket_at = ticket_ptr + group
    last = tl.atomic_add(ticket_at, 1, sem="acq_rel") == SPLIT_K - 1
    total = acc
    if last:
        total = tl.load(part_ptr + tile, mask=mask, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            at = part_ptr + s * split_stride + tile
            total += tl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(ticket_at, 0)  # ready for the next launch (and CUDA graph replays)
    return last, total
