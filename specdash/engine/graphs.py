"""A captured CUDA graph of one decode or verify forward (exact or fast), with its commits.

The engine owns these (`Engine._graphs`, one per (state slot, rows, GEMM backend, mode)), as
nano-vllm's `ModelRunner` and mini-sglang's `Engine` own theirs; the model only computes.
Decode is rows=1, a verify step rows=k+1. A slot keeps its tensors at fixed addresses
(`SeqState.in_place`) and its length on the device (`SeqState.position`), so one capture is
valid at every position. The commit after a step
(two copies per GDN layer and the position update) is a graph too, one per kept row count.
Replay has no host sync; the engine syncs once per step to read the ids.
"""

from __future__ import annotations

import torch

from specdash.engine.model import Mode, Model
from specdash.engine.state import GdnSteps, SeqState

Tensor = torch.Tensor


class CapturedForward:
    """`model.forward` of `rows` tokens on `state` in `mode`, captured once at construction."""

    def __init__(self, model: Model, state: SeqState, rows: int, mode: Mode) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.long, device=model.device)
        # Warm up on a side stream (Triton compiles, caches allocate), then capture. Both
        # write K/V at positions >= length and leave GDN steps pending, which the next
        # real step overwrites, so the state is unchanged where it matters.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.forward(self.tokens, state, mode)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model.forward(self.tokens, state, mode)
        self.pending: dict[int, GdnSteps] = dict(state.pending)
        """The graph's GDN steps: replays overwrite these tensors, the commit graphs read them."""
        state.pending = {}
        self.commits: dict[int, torch.cuda.CUDAGraph] = {}

    def replay(self, tokens: Tensor, state: SeqState) -> Tensor:
        """Run the graph on `tokens`; like the eager forward it leaves the GDN steps pending (so
        `state.commit` would also be right; `commit` below is the graphed way)."""
        self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        state.pending = dict(self.pending)
        return self.out

    def commit(self, state: SeqState, rows: int) -> None:
        """`state.commit(rows)` after a replay: one graph launch instead of two copies per GDN
        layer and the position update."""
        graph = self.commits.get(rows)
        if graph is None:  # capturing records the copies without running them
            graph = self.commits[rows] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state.apply_commit(self.pending, rows)
        graph.replay()
        state.keep(rows)
