"""Name the first layer and sub-op whose bits differ between the speculative run and the shadow.

Both runs are deterministic, so instead of snapshotting state every step we replay the
sequence from its prompt: the speculative run up to the diverging verify step, the
shadow up to the diverging position, each capturing every sub-op of that last forward.
The first captured tensor whose bits differ (in forward order) is the root cause.
"""

from __future__ import annotations

import torch

from specdash.engine import Engine, Sequence
from specdash.events import RootCause
from specdash.model import Observer
from specdash.state import SeqState

Tensor = torch.Tensor


class _Capture:
    def __init__(self, inner: Observer | None) -> None:
        self.inner = inner
        self.records: list[tuple[int, str, Tensor]] = []

    def __call__(self, layer: int, name: str, x: Tensor) -> Tensor:
        if self.inner is not None:
            x = self.inner(layer, name, x)
        self.records.append((layer, name, x.detach().clone()))
        return x


def _fresh_prefill(engine: Engine, seq: Sequence) -> SeqState:
    m = engine.target
    state = SeqState.empty(m.cfg, seq.capacity, m.dtype, m.device)
    m.forward(torch.tensor(seq.prompt, device=m.device), state, "prefill")
    return state


def _replay_spec(engine: Engine, seq: Sequence, step: int) -> list[tuple[int, str, Tensor]]:
    m, saved_gemm = engine.target, engine.target.gemm
    state = _fresh_prefill(engine, seq)
    try:
        for s, rec in enumerate(seq.steps[: step + 1]):
            m.gemm = rec.gemm
            fault = engine.fault(s) if engine.fault else None
            obs = _Capture(fault) if s == step else fault
            m.forward(torch.tensor(rec.rows, device=m.device), state, rec.mode, obs)
            state.commit(rec.accepted + 1)
    finally:
        m.gemm = saved_gemm
    assert isinstance(obs, _Capture)
    return obs.records


def _replay_shadow(engine: Engine, seq: Sequence, position: int) -> list[tuple[int, str, Tensor]]:
    m = engine.target
    state = _fresh_prefill(engine, seq)
    capture = _Capture(None)
    for j in range(1, position + 1):
        obs = capture if j == position else None
        m.forward(torch.tensor(seq.shadow_ids[j - 1 : j], device=m.device), state, "exact", obs)
        state.commit(1)
    return capture.records


def find_root_cause(engine: Engine, seq: Sequence, position: int) -> RootCause:
    """Replay both paths for generated token `position` and compare sub-op outputs bitwise."""
    step, row = engine.step_of(seq, position)
    spec = _replay_spec(engine, seq, step)
    shadow = _replay_shadow(engine, seq, position)
    num_layers = engine.target.cfg.num_hidden_layers
    for (layer, name, a), (_, _, b) in zip(spec, shadow, strict=True):
        a_row = a[row : row + 1]
        if not torch.equal(a_row, b):
            diff = (a_row.double() - b.double()).abs().max().item()
            where = "head" if layer == num_layers else f"layer {layer}"
            if 0 <= layer < num_layers:
                where += f" ({engine.target.cfg.layer_types[layer]})"
            return RootCause(
                layer=layer if 0 <= layer < num_layers else None,
                sub_op=name,
                max_abs_diff=diff,
                detail=f"{where} {name}: first sub-op whose bits differ (max |diff| {diff:.3g})",
            )
    return RootCause(
        layer=None,
        sub_op="none",
        max_abs_diff=0.0,
        detail="replay did not reproduce the divergence",
    )
