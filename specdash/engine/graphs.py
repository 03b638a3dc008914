"""Captured CUDA graphs of decode and verify forwards, with their commits.

The engine owns these (`Engine._graphs`, one per (state slot, rows, GEMM backend, mode)), as
nano-vllm's `ModelRunner` and mini-sglang's `Engine` own theirs; the model only computes.
Decode is rows=1, a verify step rows=k+1. A slot keeps its tensors at fixed addresses
(`SeqState.in_place`) and its length on the device (`SeqState.position`), so one capture is
valid at every position. The commit after a step
(two copies per GDN layer and the position update) is a graph too, one per kept row count.
Replay has no host sync; the engine syncs once per step to read the ids.

A batch of slots of one `SlotPool` is `CapturedBatch`: slot indices, tokens and kept rows sit
in device buffers and positions are read from the pool on the device, so one capture per
(pool, size, rows, GEMM backend, mode) serves any slots; sizes are padded to a power of two
with the pool's scratch slot, which keeps no rows. Without graphs a batch of 32 issues ~650
launches per forward from the host (75 ms a step on the 27B shape, docs/PERF.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdash.engine.model import Model
from specdash.engine.rows import Mode, Run
from specdash.engine.state import GdnSteps, PooledSteps, SeqState, SlotPool

if TYPE_CHECKING:
    from torch.cuda.graphs import _POOL_HANDLE as GraphPool  # what graph_pool_handle() returns

Tensor = torch.Tensor


class CapturedForward:
    """`model.forward` of `rows` tokens on `state` in `mode`, captured once at construction."""

    def __init__(self, model: Model, state: SeqState, rows: int, mode: Mode) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.long, device=model.device)
        # Warm up on a side stream (Triton compiles, caches allocate), then capture. Both
        # write K/V at positions >= length, which the next real step overwrites, and leave GDN
        # steps pending; a decode row updates GDN buffers in place (`rows.gdn.TritonGdn`), so the
        # warm-up runs on a copy of them, put back after.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            saved = [(g.conv.clone(), g.ssm.clone()) for g in state.gdn.values()]
            model.forward(self.tokens, state, mode)
            for g, (conv, ssm) in zip(state.gdn.values(), saved, strict=True):
                g.conv.copy_(conv)
                g.ssm.copy_(ssm)
            del saved
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model.forward(self.tokens, state, mode)
        self.pending: dict[int, GdnSteps] = dict(state.pending)
        """The graph's GDN steps: replays overwrite these tensors, the commit graphs read them."""
        state.pending = {}
        self.commits: dict[int, torch.cuda.CUDAGraph] = {}

    def replay(self, tokens: Tensor, states: list[SeqState]) -> Tensor:
        """Run the graph on `tokens` (`states` is [state], as for `CapturedBatch.replay`); like
        the eager forward it leaves the GDN steps pending (so `state.commit` would also be
        right; `commit` below is the graphed way)."""
        (state,) = states
        self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        state.pending = dict(self.pending)
        return self.out

    def commit(self, states: list[SeqState], kept: list[int]) -> None:
        """`state.commit(rows)` after a replay (`states` is [state], `kept` [rows], as for
        `CapturedBatch.commit`): one graph launch instead of two copies per GDN layer and the
        position update."""
        (state,), (rows,) = states, kept
        graph = self.commits.get(rows)
        if graph is None:  # capturing records the copies without running them
            graph = self.commits[rows] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state.apply_commit(self.pending, rows)
        graph.replay()
        state.keep(rows)


class CapturedBatch:
    """`model.forward_batch` of `size` slots of `pool`, `rows` rows each, and the batch's commit,
    captured once at construction into the graph memory pool `mempool`."""

    def __init__(
        self, model: Model, pool: SlotPool, size: int, rows: int, mode: Mode, mempool: GraphPool
    ) -> None:
        device = model.device
        self.pool, self.size, self.rows = pool, size, rows
        self.tokens = torch.zeros(size * rows, dtype=torch.long, device=device)
        self.slots = torch.full((size,), pool.scratch.slot, dtype=torch.long, device=device)
        self.kept = torch.zeros(size, dtype=torch.long, device=device)
        assert pool.position is not None, "a captured batch reads positions on the device"
        position = pool.position
        states = [pool.scratch] * size  # only counted: the slots are `self.slots`
        steps = PooledSteps(pool, states, self.slots, {})

        def forward() -> Tensor:
            run = Run(states, rows, steps, position.index_select(0, self.slots))
            return model.forward_batch(self.tokens, states, [rows] * size, mode, run)

        # warm up on a side stream on the scratch slot (Triton compiles), then capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
            pool.apply_commit(steps, self.kept)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool):
            self.out = forward()
        self.commit_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.commit_graph, pool=mempool):
            pool.apply_commit(steps, self.kept)
        # The GDN steps are now referenced by the graphs only: later captures in `mempool` may
        # reuse their memory, which is safe because a forward's commit always replays before
        # any other graph's forward (the engine's step order).

    def replay(self, tokens: Tensor, states: list[SeqState]) -> Tensor:
        """Run the graph on `tokens` ([len(states) * rows]) at `states`' slots, padded with the
        scratch slot; [len(states) * rows, V] log-probs. Commit with `commit` before any other
        graph replays."""
        n = len(states) * self.rows
        self.tokens[:n].copy_(tokens, non_blocking=True)
        pad = [self.pool.scratch.slot] * (self.size - len(states))
        self.slots.copy_(torch.tensor([st.slot for st in states] + pad), non_blocking=True)
        self.graph.replay()
        return self.out[:n]

    def commit(self, states: list[SeqState], kept: list[int]) -> None:
        """`commit_batch(states, kept)` for the states of the last replay, in its order."""
        pad = [0] * (self.size - len(states))
        self.kept.copy_(torch.tensor(kept + pad), non_blocking=True)
        self.commit_graph.replay()
        for st, n in zip(states, kept, strict=True):
            st.keep(n)
