"""CUDA graphs for the decode and verify forwards (exact and fast).

One graph per (state, rows, GEMM backend, mode): decode is rows=1, a verify step rows=k+1. A
state with graphs keeps its tensors at fixed addresses (`SeqState.static`) and its
length on the device (`SeqState.position`), so one capture is valid at every position.
Switching GEMM backend selects (or captures) another graph at the next step, never
mid-step. The commit after a step (two copies per GDN layer and the position update) is
a graph too, one per accepted row count. Replay has no host sync; the engine syncs once
per step to read the ids.
"""

from __future__ import annotations

import torch

from specdash.engine.model import Mode, Model
from specdash.engine.state import GdnSteps, SeqState

Tensor = torch.Tensor


class CapturedForward:
    def __init__(self, model: Model, state: SeqState, rows: int, mode: Mode) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.long, device=model.device)
        # Warm up on a side stream (Triton compiles, caches allocate), then capture. Both
        # write K/V at positions >= length and leave GDN steps pending, which the next
        # real step overwrites, so the state is unchanged where it matters.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.forward_eager(self.tokens, state, mode)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model.forward_eager(self.tokens, state, mode)
        self.pending: dict[int, GdnSteps] = dict(state.pending)
        state.pending = {}
        self.commits: dict[int, torch.cuda.CUDAGraph] = {}

    def __call__(self, tokens: Tensor, state: SeqState) -> Tensor:
        self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        state.pending = _GraphedPending(self)
        return self.out

    def replay_commit(self, state: SeqState, rows: int) -> None:
        graph = self.commits.get(rows)
        if graph is None:  # capturing records the copies without running them
            graph = self.commits[rows] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state.apply_commit(self.pending, rows)
        graph.replay()


class _GraphedPending(dict):
    """A replayed step's pending GDN steps, which know the graph that commits them."""

    def __init__(self, runner: CapturedForward) -> None:
        super().__init__(runner.pending)
        self.replay_commit = runner.replay_commit


def enable(state: SeqState) -> None:
    """Graph this state's decode and verify forwards from now on (CUDA only)."""
    assert state.position is not None, "CUDA graphs need a CUDA state"
    if state.graphs is None:
        state.graphs = {}


def graphed_forward(model: Model, tokens: Tensor, state: SeqState, mode: Mode) -> Tensor:
    assert state.graphs is not None
    key = (tokens.shape[0], model.gemm.name, mode)
    runner = state.graphs.get(key)
    if runner is None:
        runner = state.graphs[key] = CapturedForward(model, state, tokens.shape[0], mode)
    assert isinstance(runner, CapturedForward)
    return runner(tokens, state)
