"""The engine's CUDA-graph bookkeeping, on the CPU: which forwards it replays, under which key,
and which it runs eagerly.

Capturing needs CUDA, so `graphs.CapturedForward` is replaced by a stand-in that records its
key and runs the forward and the commit eagerly. This checks the engine's dispatch (slot reuse,
one capture per (slot, rows, GEMM backend, mode), every replay committed through its graph, the
eager fallbacks), not the graphs' bits: tests/engine/test_gpu_engine.py does that on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tiny_models import tiny_config

from specdash.engine import graphs
from specdash.engine.drafters import ModelDrafter
from specdash.engine.engine import Engine
from specdash.engine.model import Model, random_tensors
from specdash.engine.rows import Mode, Run
from specdash.engine.state import SeqState, SlotPool, commit_batch
from specdash.errors import UsageError
from specdash.kernels import gemm_backends

Tensor = torch.Tensor
MAX_NEW, K = 20, 3


class EagerStandIn:
    """What the engine sees of a `CapturedForward`, computed eagerly."""

    made: list[EagerStandIn] = []

    def __init__(self, model: Model, state: SeqState, rows: int, mode: Mode) -> None:
        self.model, self.rows, self.mode = model, rows, mode
        self.replays = self.commits = 0
        EagerStandIn.made.append(self)

    def replay(self, tokens: Tensor, states: list[SeqState]) -> Tensor:
        (state,) = states
        assert tokens.shape[0] == self.rows
        self.replays += 1
        return self.model.forward(tokens, state, self.mode)

    def commit(self, states: list[SeqState], kept: list[int]) -> None:
        self.commits += 1
        commit_batch(states, kept)


class BatchStandIn(EagerStandIn):
    """What the engine sees of a `CapturedBatch`, computed eagerly on the given slots."""

    def __init__(
        self, model: Model, pool: SlotPool, size: int, rows: int, mode: Mode, mempool: object
    ) -> None:
        super().__init__(model, pool.scratch, rows, mode)
        self.pool, self.size, self.replayed_sizes = pool, size, set()

    def replay(self, tokens: Tensor, states: list[SeqState]) -> Tensor:
        assert len(states) <= self.size < 2 * len(states) and {st.pool for st in states} == {
            self.pool
        }
        self.replays += 1
        self.replayed_sizes.add(len(states))
        return self.model.forward_batch(tokens, states, [self.rows] * len(states), self.mode)


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> Model:
    """The tiny target with the stand-in for capture and exact rows claiming to be graphable
    (the CPU's torch rows are not: on CUDA they would slice by host-side lengths)."""
    cfg = tiny_config(vocab_size=320)
    m = Model.from_tensors(
        cfg, random_tensors(cfg, 0), gemm_backends.resolve("torch", torch.device("cpu"))
    )
    EagerStandIn.made = []
    monkeypatch.setattr(graphs, "CapturedForward", EagerStandIn)
    monkeypatch.setattr(graphs, "CapturedBatch", BatchStandIn)
    monkeypatch.setattr(m.rows["exact"], "graphable", True)
    return m


def _engine(target: Model, graphed: bool) -> Engine:
    engine = Engine(target, lambda: ModelDrafter(target), [])
    engine.cuda_graphs = graphed
    engine.slot_capacity = 128  # every prompt fits the first two slots
    return engine


@dataclass
class Decoded:
    ids: list[list[int]]
    logprobs: list[list[float]]
    step_rows: list[int]  # rows of every verify step, all prompts


@torch.inference_mode()
def _decode(engine: Engine, mode: Mode = "exact") -> Decoded:
    """Three prompts with the shadow on (checked against the spec run in exact mode)."""
    gen = torch.Generator().manual_seed(3)
    out = Decoded([], [], [])
    for i in range(3):
        prompt = torch.randint(0, 320, (6 + 5 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, MAX_NEW, K, shadow=True)
        while not seq.done:
            engine.spec_step([seq], K, mode, MAX_NEW)
        if mode == "exact":
            assert seq.diverged_at is None and seq.compared == len(seq.ids) == MAX_NEW
        out.ids.append(seq.ids)
        out.logprobs.append(seq.logprobs)
        out.step_rows += [len(rec.rows) for rec in seq.steps]
        engine.release(seq)
    return out


def test_one_capture_per_slot_rows_backend_mode_reused_across_sequences(target: Model) -> None:
    graphed = _engine(target, graphed=True)
    run = _decode(graphed)
    steps = run.step_rows
    # the spec run holds slot 0 and the shadow slot 1 for every prompt (released, reset, reused)
    gemm = target.gemm.name
    want = {(0, n, gemm, "exact") for n in steps} | {(1, 1, gemm, "exact")}
    assert set(graphed._graphs) == want
    assert len(graphed._slots) == 2 and all(s.in_place for s in graphed._slots)
    assert len(EagerStandIn.made) == len(want)  # no capture repeated
    assert any(n > 1 for n in steps) and len(steps) > len(set(steps))  # verify shapes replayed
    for (slot, n, _, _), g in graphed._graphs.items():
        assert g.replays == g.commits  # each replay committed through its own graph
        assert g.replays == (steps.count(n) if slot == 0 else 3 * (MAX_NEW - 1))

    eager = _engine(target, graphed=False)
    assert _decode(eager) == run
    assert not eager._graphs and len(EagerStandIn.made) == len(want)


def test_observed_and_ungraphable_forwards_run_eagerly(target: Model) -> None:
    engine = _engine(target, graphed=True)
    engine.fault = lambda step: (lambda layer, op, x: x) if step == 1 else None
    run = _decode(engine)
    spec = [g.replays for (slot, *_), g in engine._graphs.items() if slot == 0]
    assert sum(spec) == len(run.step_rows) - 3  # each prompt's observed step 1 ran eagerly
    assert _decode(_engine(target, graphed=False)) == run  # the observer changed nothing

    # fast rows on the CPU read host-side lengths: eager on a slot too (the shadow stays graphed)
    engine.fault = None
    before = dict(engine._graphs)
    _decode(engine, "fast")
    assert engine._graphs == before


def test_capacity_is_checked_before_a_capture(target: Model) -> None:
    engine = _engine(target, graphed=True)
    seq, _ = engine.start(0, [1, 2, 3], 4, K, shadow=False)
    room = seq.state.capacity - seq.state.length
    with pytest.raises(UsageError):
        engine._graph([seq.state], [room + 1], "exact")
    assert not engine._graphs and not EagerStandIn.made


def test_batches_of_pool_slots_replay_one_capture_per_padded_size(
    target: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven prompts, five in flight on reserved slots (one pool): batches whose sequences all
    have as many rows replay the capture of their size padded to a power of two (the shadows'
    decode rows too), reused across steps and sequences; mixed row counts run eagerly. Same
    ids and logprob bits as the eager engine."""
    from test_batch_exact import MAX_NEW as BATCH_NEW
    from test_batch_exact import decode

    exact = target.rows["exact"]
    monkeypatch.setattr(exact, "steps_slots_together", True)  # what the engine asks
    monkeypatch.setattr(exact, "run", lambda states, rows: Run(states, rows))  # the torch parts
    # still step sequence by sequence
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)  # no CUDA: a token
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 320, (5 + 3 * i,), generator=gen).tolist() for i in range(7)]
    runs = {}
    for graphed in (True, False):
        engine = _engine(target, graphed)
        engine.reserve(max(map(len, prompts)), BATCH_NEW, 5, sequences=5, shadow=True)
        runs[graphed] = decode(engine, prompts, 5, K)
        if graphed:
            batches = engine._batch_graphs
            assert all(size & (size - 1) == 0 for _, size, *_ in batches)
            assert (
                len({key[1:] for key in batches})
                == len(batches)
                == len([g for g in EagerStandIn.made if isinstance(g, BatchStandIn)])
            )  # one capture per (size, rows, backend, mode)
            assert {1, K + 1} <= {rows for _, _, rows, *_ in batches}
            assert any(g.replays > 1 for g in batches.values())
            assert any(min(g.replayed_sizes) < g.size for g in batches.values())  # padded
            assert all(g.replays == g.commits for g in batches.values())
        else:
            assert not engine._batch_graphs
    for i in runs[True]:
        assert runs[True][i].ids == runs[False][i].ids
        assert runs[True][i].logprobs == runs[False][i].logprobs
