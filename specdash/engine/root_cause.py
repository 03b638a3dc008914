"""Name the first layer and sub-op whose bits differ between the speculative run and the shadow.

Both runs are deterministic, so instead of snapshotting state every step we replay the
speculative forwards as they ran: each verify step with every sequence of its batch, in the
same order, with the same rows (a row's bits can depend on the whole forward, a CPU GEMM's on M:
a sequence replayed alone is another computation). Beside them the shadow's decode rows of the
flagged sequence are replayed, and every sub-op of every row it kept is captured on both paths.
A difference can hide in state (a K/V row, the GDN state) and surface steps later, so the
search starts at the first step, not at the flagged one. By causality the origin is the
difference earliest in forward order (layer, then sub-op) within the earliest step that has
one, earliest row on ties.

The replay is checked, always: it must give the flagged token the id and fp32 logprob bits
that the run and the shadow emitted. When it does not, the cause it would name is not the one
that ran, so none is named, and the `RootCause` says so (`reproduced` False).

A batch's divergences are found one by one, each replaying the same batch from the same
prefills: `RootCauseFinder` keeps the prefilled states of its last replay's sequences for the
next (prefilling a batch of 8 prompts of up to 4k tokens again for each of its divergences took
4x the decode itself on the CPU).
"""

from __future__ import annotations

import torch

from specdash.engine import ops
from specdash.engine.engine import Engine, Sequence, StepRecord, batch_order
from specdash.engine.model import Model, Observer
from specdash.engine.state import SeqState, commit_batch
from specdash.events import RootCause
from specdash.metrics import token_difference

Tensor = torch.Tensor
Records = list[tuple[int, str, Tensor]]


class _Capture:
    """Records each sub-op's output rows `rows` (one sequence's rows of a batched forward)."""

    def __init__(self, inner: Observer | None, rows: slice) -> None:
        self.inner, self.rows = inner, rows
        self.records: Records = []

    def __call__(self, layer: int, name: str, x: Tensor) -> Tensor:
        if self.inner is not None:
            x = self.inner(layer, name, x)
        self.records.append((layer, name, x[self.rows].detach().clone()))
        return x


Forward = list[tuple[Sequence, int]]
"""One verify forward: each sequence of its batch with its step index, in `spec_step`'s order."""


def _forwards(seq: Sequence, steps: int) -> list[Forward]:
    """The verify forwards of `seq`'s first `steps` steps and every forward they depend on (a
    neighbour's rows in a batch come from its state, made by its own earlier steps), in the
    order they ran. A forward is known by its records' shared `StepRecord.batch`."""
    step_of: dict[int, dict[int, int]] = {}  # sequence -> its step index by batch

    def forward(rec: StepRecord) -> Forward:
        out = []
        for s in rec.batch:
            if id(s) not in step_of:
                step_of[id(s)] = {id(r.batch): j for j, r in enumerate(s.steps)}
            out.append((s, step_of[id(s)][id(rec.batch)]))
        return out

    need = {id(seq): (seq, steps)}  # sequence -> (it, how many of its steps)
    todo = [seq]
    while todo:
        s = todo.pop()
        for rec in s.steps[: need[id(s)][1]]:
            for other, j in forward(rec):
                if j + 1 > need.get(id(other), (other, 0))[1]:
                    need[id(other)] = (other, j + 1)
                    todo.append(other)
    done = dict.fromkeys(need, 0)
    order: list[Forward] = []
    while True:  # a forward runs once each of its sequences has run every step before it
        ready = (
            fwd
            for s, n in need.values()
            if done[id(s)] < n
            for fwd in [forward(s.steps[done[id(s)]])]
            if all(done[id(o)] == j for o, j in fwd)
        )
        fwd = next(ready, None)
        if fwd is None:
            break
        order.append(fwd)
        for o, _ in fwd:
            done[id(o)] += 1
    assert all(done[i] == n for i, (_, n) in need.items()), "steps recorded out of order"
    return order


def _replay_forward(
    engine: Engine, fwd: Forward, states: dict[int, SeqState], watch: Sequence
) -> Records | None:
    """One verify forward as the engine ran it (its rows laid out in the same order) on
    `states` (by sequence), committed as it was; the sub-op outputs of `watch`'s rows, None
    when `watch` is not in it."""
    m = engine.target
    records = [s.steps[j] for s, j in fwd]
    order = batch_order([rec.rows for rec in records])
    capture, offset = None, 0
    for j in order:
        s, step = fwd[j]
        n = len(records[j].rows)
        if s is watch:
            # the engine lets a fault-injection observer see a forward of one sequence only
            fault = engine.fault(step) if engine.fault and len(fwd) == 1 else None
            capture = _Capture(fault, slice(offset, offset + n))
        offset += n
    ordered = [states[id(fwd[j][0])] for j in order]
    tokens = torch.tensor([t for j in order for t in records[j].rows], device=m.device)
    m.gemm = records[0].gemm
    lens = [len(records[j].rows) for j in order]
    m.forward_batch(tokens, ordered, lens, records[0].mode, observe=capture)
    commit_batch(ordered, [records[j].accepted + 1 for j in order])
    return None if capture is None else capture.records


def _shadow_rows(m: Model, state: SeqState, tokens: list[int], observe: bool) -> list[Records]:
    """Decode `tokens` one row at a time, as the shadow does; each row's sub-ops if `observe`."""
    rows = []
    for tok in tokens:
        capture = _Capture(None, slice(None)) if observe else None
        m.forward(torch.tensor([tok], device=m.device), state, "exact", capture)
        state.commit(1)
        rows.append(capture.records if capture is not None else [])
    return rows


def _first_difference(spec: Records, shadow: list[Records]) -> tuple[int, int] | None:
    """(record index, row) of the first differing sub-op output, in forward order."""
    for i, (_, _, a) in enumerate(spec):
        for r, rows in enumerate(shadow):
            if not torch.equal(a[r : r + 1], rows[i][2]):
                return i, r
    return None


def _log_softmax(records: Records) -> Tensor:
    """The rows' log-probs: the head's last sub-op."""
    return next(x for _, name, x in records if name == "log_softmax")


class RootCauseFinder:
    """Root causes of one engine's divergences, each found by replaying its steps as they ran.
    Keeps the prefilled state of each sequence of the last replay, for the next."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._prefilled: dict[int, tuple[Sequence, SeqState]] = {}

    def _start(self, seq: Sequence, kept: dict[int, tuple[Sequence, SeqState]]) -> SeqState:
        """A state of `seq` just after its prefill, as large as the run's (attention may span
        the capacity); its prefill is kept in `kept`."""
        m = self.engine.target
        if id(seq) in self._prefilled:
            prefilled = self._prefilled[id(seq)][1]
        else:
            prefilled = SeqState.empty(m.cfg, seq.state.capacity, m.dtype, m.device)
            m.forward(torch.tensor(seq.prompt, device=m.device), prefilled, "prefill")
        kept[id(seq)] = (seq, prefilled)
        state = SeqState.empty(m.cfg, seq.state.capacity, m.dtype, m.device)
        state.copy_from(prefilled)
        return state

    def find(self, seq: Sequence, position: int) -> RootCause:
        """Replay both paths up to generated token `position`; compare sub-op outputs bitwise."""
        engine = self.engine
        last_step, last_row = engine.step_of(seq, position)
        m, saved_gemm = engine.target, engine.target.gemm
        kept: dict[int, tuple[Sequence, SeqState]] = {}
        forwards = _forwards(seq, last_step + 1)
        states = {id(s): self._start(s, kept) for fwd in forwards for s, _ in fwd}
        shadow_state = self._start(seq, kept)
        self._prefilled = kept  # the last replay's sequences only: memory stays one batch's
        step, generated = 0, 1  # seq's steps replayed; tokens emitted before them (the prefill's)
        cause: RootCause | None = None
        flagged: tuple[Tensor, Tensor] | None = None  # both paths' log-probs of token `position`
        try:
            for fwd in forwards:
                spec = _replay_forward(engine, fwd, states, seq)
                if spec is None:
                    continue
                rec, last = seq.steps[step], step == last_step
                kept_rows = last_row + 1 if last else rec.accepted + 1
                shadow = _shadow_rows(m, shadow_state, rec.rows[:kept_rows], cause is None or last)
                found = _first_difference(spec, shadow) if cause is None else None
                if found is not None:
                    i, r = found
                    layer, name, a = spec[i]
                    cause = _describe(m, layer, name, a[r : r + 1], shadow[r][i][2], generated + r)
                if last:
                    flagged = _log_softmax(spec)[last_row : last_row + 1], _log_softmax(shadow[-1])
                step += 1
                generated += rec.accepted + 1
        finally:
            m.gemm = saved_gemm
        assert flagged is not None
        missed = _not_reproduced(seq, position, *flagged)
        if missed:
            return RootCause(
                layer=None,
                sub_op="none",
                max_abs_diff=0.0,
                reproduced=False,
                detail=f"NOT REPRODUCED: replaying the steps as they ran gave token {position} "
                f"{missed}, so no sub-op is named",
            )
        if cause is None:  # both reproduced, so their log-probs differ: unreachable in practice
            return RootCause(
                layer=None,
                sub_op="none",
                max_abs_diff=0.0,
                reproduced=True,
                detail="the replay reproduced the flagged bits but found no differing sub-op",
            )
        return cause


def _not_reproduced(seq: Sequence, position: int, spec: Tensor, shadow: Tensor) -> str:
    """How the replayed token `position` differs from what each run emitted ("" if neither)."""
    missed = []
    for run, row, want_id, want_lp in (
        ("spec", spec, seq.ids[position], seq.logprobs[position]),
        ("shadow", shadow, seq.shadow_ids[position], seq.shadow_logprobs[position]),
    ):
        ids, lps = ops.greedy(row)
        got_id, got_lp = int(ids[0]), float(lps[0])
        if token_difference(got_id, got_lp, want_id, want_lp) is not None:
            missed.append(
                f"{run} {got_id} ({got_lp!r}) where the run emitted {want_id} ({want_lp!r})"
            )
    return "; ".join(missed)


def _describe(m: Model, layer: int, name: str, a: Tensor, b: Tensor, origin: int) -> RootCause:
    cfg = m.cfg
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
        reproduced=True,
        detail=f"{where} {name} at token {origin}: first sub-op whose bits differ "
        f"(max |diff| {diff:.3g}); the replay reproduced the flagged bits",
    )
