"""Name the first layer and sub-op whose bits differ between the speculative run and the shadow.

Both runs are deterministic, so instead of snapshotting state every step we replay the
sequence from its prompt, both paths side by side, one verify step at a time, capturing
every sub-op of every row the step kept. A difference can hide in state (a K/V row, the
GDN state) and surface steps later, so the search starts at the first step, not at the
flagged one. By causality the origin is the difference earliest in forward order
(layer, then sub-op) within the earliest step that has one, earliest row on ties.
"""

from __future__ import annotations

import torch

from specdash.engine.engine import Engine, Sequence
from specdash.engine.model import Observer
from specdash.engine.state import SeqState
from specdash.events import RootCause

Tensor = torch.Tensor
Records = list[tuple[int, str, Tensor]]


class _Capture:
    def __init__(self, inner: Observer | None) -> None:
        self.inner = inner
        self.records: Records = []

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


def _first_difference(spec: Records, shadow: list[Records]) -> tuple[int, int] | None:
    """(record index, row) of the first differing sub-op output, in forward order."""
    for i, (_, _, a) in enumerate(spec):
        for r, rows in enumerate(shadow):
            if not torch.equal(a[r : r + 1], rows[i][2]):
                return i, r
    return None


def find_root_cause(engine: Engine, seq: Sequence, position: int) -> RootCause:
    """Replay both paths up to generated token `position`; compare sub-op outputs bitwise."""
    last_step, last_row = engine.step_of(seq, position)
    m, saved_gemm = engine.target, engine.target.gemm
    spec_state, shadow_state = _fresh_prefill(engine, seq), _fresh_prefill(engine, seq)
    generated = 1  # the prefill token
    try:
        for s, rec in enumerate(seq.steps[: last_step + 1]):
            m.gemm = rec.gemm
            capture = _Capture(engine.fault(s) if engine.fault else None)
            m.forward(torch.tensor(rec.rows, device=m.device), spec_state, rec.mode, capture)
            spec_state.commit(rec.accepted + 1)
            m.gemm = saved_gemm
            kept = rec.accepted + 1 if s < last_step else last_row + 1
            shadow = []
            for tok in rec.rows[:kept]:
                row_capture = _Capture(None)
                m.forward(torch.tensor([tok], device=m.device), shadow_state, "exact", row_capture)
                shadow_state.commit(1)
                shadow.append(row_capture.records)
            found = _first_difference(capture.records, shadow)
            if found is not None:
                i, r = found
                layer, name, a = capture.records[i]
                origin = generated + r  # the generated token row r emits
                return _describe(engine, layer, name, a[r : r + 1], shadow[r][i][2], origin)
            generated += rec.accepted + 1
    finally:
        m.gemm = saved_gemm
    return RootCause(
        layer=None,
        sub_op="none",
        max_abs_diff=0.0,
        detail="replay did not reproduce the divergence",
    )


def _describe(
    engine: Engine, layer: int, name: str, a: Tensor, b: Tensor, origin: int
) -> RootCause:
    cfg = engine.target.cfg
    diff = (a.double() - b.double()).abs().max().item()
    inside = 0 <= layer < cfg.num_hidden_layers
    where = (
        f"layer {layer} ({cfg.layer_types[layer]})"
        if inside
        else ("embedding" if layer < 0 else "head")
    )
    return RootCause(
        layer=layer if inside else None,
        sub_op=name,
        max_abs_diff=diff,
        origin_position=origin,
        detail=f"{where} {name} at token {origin}: first sub-op whose bits differ "
        f"(max |diff| {diff:.3g})",
    )
