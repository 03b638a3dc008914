"""Real batching stays exact: B sequences decoded and verified in one forward give every
sequence the ids and fp32 logprob bits it gets alone (B = 1), spec and plain, and the shadow
(batched too) still finds no divergence. The CPU tiny pair."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tiny_models import write_pair

from specdash.engine.drafters import Drafter, ModelDrafter, NgramDrafter, ReplayDrafter
from specdash.engine.engine import Engine, Sequence
from specdash.engine.loader import Loaded, load_models
from specdash.engine.model import Model
from specdash.engine.state import SeqState
from specdash.settings import SessionSettings

MAX_NEW = 10
N_PROMPTS = 32
K_MAX = 5


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    target, draft, _ = write_pair(tmp_path_factory.mktemp("tiny"))
    return load_models(SessionSettings(model=target, draft=draft))


@pytest.fixture(scope="module")
def prompts(loaded: Loaded) -> list[list[int]]:
    """Prompts of mixed lengths (3..60 tokens), some repetitive so n-gram drafts get accepted."""
    gen = torch.Generator().manual_seed(3)
    vocab = loaded.target.cfg.vocab_size
    out = []
    for i in range(N_PROMPTS):
        n = 3 + int(torch.randint(0, 58, (1,), generator=gen))
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        out.append(ids[: n // 3] * 3 if i % 3 == 0 else ids)
    return out


def drafter_factory(loaded: Loaded, drafter: str):  # noqa: ANN201
    def make() -> Drafter:
        if drafter == "model":
            assert loaded.draft is not None
            return ModelDrafter(loaded.draft)
        return NgramDrafter()

    return make


def decode(
    engine: Engine,
    prompts: list[list[int]],
    batch: int,
    k: int,
    mode: str = "exact",
    shadow: bool = True,
) -> dict[int, Sequence]:
    """Continuous batching, as the runner does it: up to `batch` sequences in flight, each step
    one batched verify (or decode, k = 0) of all of them; a finished sequence's slot serves the
    next prompt. `shadow=False` for a plain reference run, which a shadow would only repeat."""
    queue, flight, done = list(enumerate(prompts)), [], {}
    with torch.inference_mode():
        while queue or flight:
            while queue and len(flight) < batch:
                i, p = queue.pop(0)
                seq, _ = engine.start(i, p, MAX_NEW, K_MAX, shadow=shadow)
                flight.append(seq)
            live = [s for s in flight if not s.done]
            if live:
                engine.spec_step(live, k, mode, MAX_NEW)  # type: ignore[arg-type]
            for s in [s for s in flight if s.done]:
                flight.remove(s)
                engine.release(s)
                done[s.index] = s
    return done


def spoiled_replay(
    plain: dict[int, Sequence], prompts: list[list[int]], vocab: int
) -> Callable[[], Drafter]:
    """Drafters replaying each prompt's plain output, every fifth token spoiled on odd prompts,
    so rows of one batch commit different lengths."""
    continuation = {}
    for i, p in enumerate(prompts):
        ids = list(plain[i].ids)
        if i % 2:
            ids = [(t + 1) % vocab if j % 5 == 4 else t for j, t in enumerate(ids)]
        continuation[tuple(p)] = ids[:MAX_NEW]
    return lambda: ReplayDrafter(continuation)


BATCHES = ((1, True), (8, True), (32, True), (32, False))


def runs_by_batch(
    model: Model, make: Callable[[], Drafter], prompts: list[list[int]], k: int
) -> dict[tuple[int, bool], dict[int, Sequence]]:
    """The prompts decoded at each (batch, graphed) of BATCHES, each on its own engine (a batch
    on one reserved pool): no shadow diverges, and every run has the first run's bits."""
    runs = {}
    for batch, graphed in BATCHES:
        engine = Engine(model, make, [])
        engine.cuda_graphs = graphed
        if batch > 1:  # reserved slots are one pool: runs of a batch step together
            engine.reserve(max(map(len, prompts)), MAX_NEW, 5, sequences=batch, shadow=True)
        runs[batch, graphed] = decode(engine, prompts, batch, k)
        assert all(s.diverged_at is None for s in runs[batch, graphed].values()), batch
        assert_same(runs[BATCHES[0]], runs[batch, graphed])
        assert bool(engine._batch_graphs) is (graphed and batch > 1)
    return runs


def assert_same(a: dict[int, Sequence], b: dict[int, Sequence]) -> None:
    assert a.keys() == b.keys()
    for i in a:
        assert torch.equal(torch.tensor(a[i].ids), torch.tensor(b[i].ids)), i
        lp_a = torch.tensor(a[i].logprobs, dtype=torch.float32)
        assert torch.equal(lp_a, torch.tensor(b[i].logprobs, dtype=torch.float32)), i


@pytest.mark.parametrize(
    ("drafter", "k"),
    [
        ("ngram", 0),
        ("ngram", 1),
        ("ngram", 3),
        ("ngram", 5),
        ("model", 1),
        ("model", 3),
        ("model", 5),
    ],
)
def test_batched_steps_equal_one_at_a_time(
    loaded: Loaded, prompts: list[list[int]], drafter: str, k: int
) -> None:
    """k = 0 is plain decode (one row per sequence per forward)."""
    runs = {}
    for batch in (1, 8, 32):
        engine = Engine(loaded.target, drafter_factory(loaded, drafter), [])
        runs[batch] = decode(engine, prompts, batch, k)
        assert all(s.diverged_at is None for s in runs[batch].values()), batch
        assert all(len(s.ids) == MAX_NEW for s in runs[batch].values())
        assert_same(runs[1], runs[batch])
    steps = [st for s in runs[32].values() for st in s.steps]
    if k:  # speculation happened: drafts were verified in multi-row steps
        assert any(len(st.rows) > 1 for st in steps)
    if drafter == "model":  # some drafts accepted, some rejected (every rollback path)
        accepted = [st.accepted for st in steps]
        assert 0 < sum(accepted) < len(accepted) * k


def test_mixed_rows_per_sequence_in_one_forward(loaded: Loaded, prompts: list[list[int]]) -> None:
    """One forward of sequences with different row counts at different positions equals each
    sequence's own forward, row for row (the model level, below the engine)."""
    m = loaded.target
    lens = [1, 4, 2, 6, 1]
    singles, states, rows = [], [], []
    with torch.inference_mode():
        for j, n in enumerate(lens):
            p = torch.tensor(prompts[j], dtype=torch.int64)
            a = SeqState.empty(m.cfg, len(p) + 8, m.dtype, m.device)
            b = SeqState.empty(m.cfg, len(p) + 8, m.dtype, m.device)
            m.forward(p, a, "prefill")
            b.copy_from(a)
            r = p[:n] if len(p) >= n else p.repeat(n)[:n]
            singles.append(m.forward(r, a, "exact"))
            states.append(b)
            rows.append(r)
        batched = m.forward_batch(torch.cat(rows), states, lens, "exact")
    assert torch.equal(torch.cat(singles), batched)
