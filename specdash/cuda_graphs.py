"""CUDA graphs for the exact decode and verify forwards.

One graph per (state, rows, GEMM backend): decode is rows=1, a verify step rows=k+1. A
state with graphs keeps its tensors at fixed addresses (`SeqState.static`) and its
length on the device (`SeqState.position`), so one capture is valid at every position.
Switching GEMM backend selects (or captures) another graph at the next step, never
mid-step. Replay has no host sync; the engine syncs once per step to read the ids.
"""

from __future__ import annotations

import torch

from specdash.model import Model
from specdash.state import GdnSteps, SeqState

Tensor = torch.Tensor


class CapturedForward:
    def __init__(self, model: Model, state: SeqState, rows: int) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.long, device=model.device)
        # Warm up on a side stream (Triton compiles, caches allocate), then capture. Both
        # write K/V at positions >= length and leave GDN steps pending, which the next
        # real step overwrites, so the state is unchanged where it matters.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.forward_eager(self.tokens, state, "exact")
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model.forward_eager(self.tokens, state, "exact")
        self.pending: dict[int, GdnSteps] = dict(state.pending)
        state.pending = {}

    def __call__(self, tokens: Tensor, state: SeqState) -> Tensor:
        self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        state.pending = dict(self.pending)
        return self.out


def enable(state: SeqState) -> None:
    """Graph this state's exact forwards from now on (CUDA only)."""
    assert state.position is not None, "CUDA graphs need a CUDA state"
    if state.graphs is None:
        state.graphs = {}


def graphed_forward(model: Model, tokens: Tensor, state: SeqState) -> Tensor:
    assert state.graphs is not None
    key = (tokens.shape[0], model.gemm.name)
    runner = state.graphs.get(key)
    if runner is None:
        runner = state.graphs[key] = CapturedForward(model, state, tokens.shape[0])
    assert isinstance(runner, CapturedForward)
    return runner(tokens, state)
