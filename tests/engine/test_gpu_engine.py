"""The native engine on CUDA: Triton kernels + CUDA graphs keep speculation exact.

Skipped without a CUDA device (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import kernel_sized, plain_greedy

from specdash.engine import model as model_module
from specdash.engine.config import preset
from specdash.engine.drafters import ModelDrafter, RandomDrafter, ReplayDrafter
from specdash.engine.engine import Engine
from specdash.engine.model import Model, random_tensors
from specdash.engine.rows.attention import TorchAttention, TritonAttention, attend_masked
from specdash.engine.state import SeqState
from specdash.kernels import gemm_backends
from specdash.kernels.triton import pdl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _model(seed: int, noise: float = 0.0, gemm: str = "triton") -> Model:
    cfg = kernel_sized("tiny-hybrid")
    tensors = random_tensors(cfg, 0, torch.bfloat16, "cuda")
    if noise:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        tensors = {
            n: (
                t + noise * torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype) * t.std()
            )
            if t.dim() == 2
            else t
            for n, t in tensors.items()
        }
    return Model.from_tensors(cfg, tensors, gemm_backends.resolve(gemm, torch.device("cuda")))


@pytest.mark.parametrize(
    "k,gemm", [(1, "triton"), (4, "triton"), (9, "triton"), (4, "triton-fused")]
)
def test_graphed_spec_equals_eager_plain_greedy(k: int, gemm: str) -> None:
    target, draft = _model(0, gemm=gemm), _model(1, noise=0.05)
    engine = Engine(target, lambda: ModelDrafter(draft), [])
    assert engine.cuda_graphs and isinstance(target.rows["exact"].attention, TritonAttention)
    gen = torch.Generator().manual_seed(k)
    accepted = 0
    for i in range(6):
        prompt = torch.randint(0, target.cfg.vocab_size, (5 + 7 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, 32, 16, shadow=True)
        while not seq.done:
            accepted += engine.spec_step([seq], k, "exact", 32)[0].accepted
        ref_ids, ref_lps = plain_greedy(target, prompt, 32)
        assert seq.diverged_at is None
        assert torch.equal(torch.tensor(seq.ids), ref_ids)
        assert torch.equal(torch.tensor(seq.logprobs, dtype=torch.float32), ref_lps)
        engine.release(seq)
    assert accepted > 0
    # the engine replayed its own graphs: verify steps of k+1 rows and the shadow's decode
    assert {key[2:] for key in engine._graphs} == {(gemm, "exact")}
    assert {1, k + 1} <= {key[1] for key in engine._graphs}


def _decode_prompts(engine: Engine, k: int, mode: str, seed: int) -> tuple[list[int], list[float]]:
    """Ids and logprobs of four prompts through `engine`, concatenated."""
    cfg = engine.target.cfg
    gen = torch.Generator().manual_seed(seed)
    ids, lps = [], []
    for i in range(4):
        prompt = torch.randint(0, cfg.vocab_size, (9 + 5 * i,), generator=gen).tolist()
        seq, _ = engine.start(i, prompt, 24, 16, shadow=False)
        while not seq.done:
            engine.spec_step([seq], k, mode, 24)
        ids += seq.ids
        lps += seq.logprobs
        engine.release(seq)
    return ids, lps


def _same_bits(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> None:
    assert a[0] == b[0]
    assert torch.equal(torch.tensor(a[1]), torch.tensor(b[1]))


def test_graphed_fast_verify_equals_eager_fast_verify() -> None:
    """Fast mode is graphed too (for the exact/fast throughput ratio): a replay must compute
    what the eager forward computes, and the commit graphs must roll back the same way."""
    target, draft = _model(0), _model(1, noise=0.05)
    runs = []
    for graphs in (True, False):
        engine = Engine(target, lambda: ModelDrafter(draft), [])
        engine.cuda_graphs = graphs
        runs.append(_decode_prompts(engine, 4, "fast", 3))
        assert any(key[3] == "fast" for key in engine._graphs) is graphs
    _same_bits(*runs)


def test_fast_verify_diverges_from_exact_on_cuda() -> None:
    """Fast mode is the usual batched verify on a GPU too (batched SDPA and GDN chunks, not
    the row kernels), so the dashboard's divergence demo shows something there."""
    target, draft = _model(0), _model(1, noise=0.05)
    fast = target.rows["fast"].attention
    assert isinstance(fast, TorchAttention) and fast.attend is attend_masked
    engine = Engine(target, lambda: ModelDrafter(draft), [])
    exact = _decode_prompts(engine, 4, "exact", 5)
    fast = _decode_prompts(engine, 4, "fast", 5)
    assert not torch.equal(torch.tensor(exact[1]), torch.tensor(fast[1]))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="programmatic dependent launch needs Hopper",
)
def test_pdl_launches_give_the_same_bits(monkeypatch) -> None:
    """With PDL a row kernel launches before its predecessor ends: a missing wait would read
    stale inputs, and EARLY launches GEMMs while a row kernel still runs. Graphed exact
    speculation must agree bit for bit in every mode: EARLY, LATE and off."""
    target, draft = _model(0), _model(1, noise=0.05)
    runs = []
    for mode in (pdl.EARLY, pdl.LATE, pdl.OFF):
        monkeypatch.setattr(pdl, "MODE", mode)
        engine = Engine(target, lambda: ModelDrafter(draft), [])
        assert pdl.use_pdl(target.device) == mode
        runs.append(_decode_prompts(engine, 4, "exact", 4))
    _same_bits(runs[0], runs[1])
    _same_bits(runs[0], runs[2])


def test_chunked_prefill_on_cuda(monkeypatch) -> None:
    """Later prefill chunks take SDPA's lower-right causal bias (GQA, flash kernel) on CUDA."""
    m = _model(0)
    prompt = torch.randint(0, m.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(5))
    out = []
    for chunk in (1 << 20, 64):
        monkeypatch.setattr(model_module, "PREFILL_CHUNK", chunk)
        state = SeqState.empty(m.cfg, 310, m.dtype, m.device)
        out.append(m.forward(prompt.cuda(), state, "prefill", all_logits=True))
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0.1)  # bf16 model
    assert (out[1].argmax(-1) == out[0].argmax(-1)).float().mean() > 0.95


def test_prefill_attention_kernel_computes_what_sdpa_does(monkeypatch) -> None:
    """The CUDA prefill with kernels.prefill_attention (shipped on Hopper) next to torch's
    SDPA, in one pass and in chunks whose later ones are lower-right causal."""
    from specdash.engine.rows import triton_prefill_rows
    from specdash.engine.rows.attention import attend_causal_kernel

    m = _model(0)
    prompt = torch.randint(0, m.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(6))
    shipped = m.rows["prefill"]
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert isinstance(shipped.attention, TorchAttention)
    assert (shipped.attention.attend is attend_causal_kernel) == hopper
    for chunk in (1 << 20, 64):
        monkeypatch.setattr(model_module, "PREFILL_CHUNK", chunk)
        out = []
        for rows in (triton_prefill_rows(m.cfg, m.rope, attention_kernel=x) for x in (True, False)):
            m.rows["prefill"] = rows
            state = SeqState.empty(m.cfg, 310, m.dtype, m.device)
            out.append(m.forward(prompt.cuda(), state, "prefill", all_logits=True))
        m.rows["prefill"] = shipped
        torch.testing.assert_close(out[0], out[1], rtol=0, atol=0.1)  # bf16 model
        assert (out[0].argmax(-1) == out[1].argmax(-1)).float().mean() > 0.95


@pytest.fixture(scope="module")
def model_27b() -> Model:
    """The Qwen3.5-27B shape with random bf16 weights (51 GB), Triton GEMM backend."""
    dev = torch.device("cuda")
    cfg = preset("qwen3.5-27b-shape")
    return Model.random(cfg, 0, torch.bfloat16, dev, gemm_backends.resolve("triton", dev))


@pytest.mark.parametrize("drafter", ["replay", "random"])
def test_27b_shape_spec_equals_shadow_on_24_prompts(model_27b: Model, drafter: str) -> None:
    """Speculation's best case (every draft accepted: all k+1 verify rows are compared) and
    worst case (none) on the real shapes, k=9: 24/24 prompts equal the lockstep plain decode."""
    vocab, n = model_27b.cfg.vocab_size, 16
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, vocab, (64,), generator=gen).tolist() for _ in range(24)]
    make = lambda: RandomDrafter(vocab)  # noqa: E731
    if drafter == "replay":
        plain = Engine(model_27b, make, [])
        continuation = {}
        for i, p in enumerate(prompts):
            seq, _ = plain.start(i, p, n + 10, 16, shadow=False)
            while not seq.done:
                plain.spec_step([seq], 0, "exact", n + 10)
            continuation[tuple(p)] = seq.ids
            plain.release(seq)
        make = lambda: ReplayDrafter(continuation)  # noqa: E731
    engine = Engine(model_27b, make, [])
    accepted = 0
    for i, p in enumerate(prompts):
        seq, _ = engine.start(i, p, n, 16, shadow=True)
        while not seq.done:
            accepted += engine.spec_step([seq], 9, "exact", n)[0].accepted
        assert seq.diverged_at is None and seq.compared == len(seq.ids) == n, i
        engine.release(seq)
    if drafter == "replay":  # the k+1 verify rows were really compared
        assert accepted == 24 * (n - 1 - 2)  # 15 tokens: 9 drafts + 1, then 4 + 1


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 100e9,
    reason="the 27B shape's weights and its B = 1, 8, 32 slot pools need more than an 80 GB card",
)
@pytest.mark.parametrize("k", [0, 3])
def test_27b_shape_batched_equals_one_at_a_time(model_27b: Model, k: int) -> None:
    """Batching on the real shapes: 32 prompts decoded with B = 1, 8 and 32 sequences per
    forward (B > 1: one batched forward on a slot pool, GEMM M = all rows, attention and GDN one
    launch per run of equal row counts, captured as a graph where all row counts are equal, and
    B = 32 eagerly too; B = 1: the graphed path) give
    every sequence the same ids and fp32 logprob bits, plain (k = 0) and speculative, and the
    batched shadow finds no divergence. Random weights never continue a pattern, so n-gram
    drafts are never accepted here; the drafts replay the plain output
    instead, every fifth token spoiled on odd prompts, so rows of one batch commit different
    lengths."""
    from test_batch_exact import decode, runs_by_batch, spoiled_replay

    vocab = model_27b.cfg.vocab_size
    gen = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, vocab, (16 + 9 * i,), generator=gen).tolist() for i in range(32)]
    make = lambda: RandomDrafter(vocab)  # noqa: E731
    if k:
        make = spoiled_replay(decode(Engine(model_27b, make, []), prompts, 32, 0), prompts, vocab)
    runs = runs_by_batch(model_27b, make, prompts, k)
    if k:
        assert any(len(st.rows) > 1 for s in runs[32, True].values() for st in s.steps)


@pytest.mark.parametrize("k", [0, 3])
def test_captured_batches_equal_eager_batches_and_plain_greedy(k: int) -> None:
    """Batches of pool slots replay captured graphs (`graphs.CapturedBatch`): 5 sequences pad to
    8 with the scratch slot, fewer as they finish; slots, kept rows and positions are read on
    the device, so one capture serves every batch of its size. Ids and logprob bits equal the
    eager batched forward and plain greedy decoding of each prompt, and no shadow diverges."""
    from test_batch_exact import MAX_NEW, assert_same, decode

    target, draft = _model(0), _model(1, noise=0.05)
    gen = torch.Generator().manual_seed(21)
    prompts = [
        torch.randint(0, target.cfg.vocab_size, (4 + 5 * i,), generator=gen).tolist()
        for i in range(7)
    ]
    runs = {}
    for graphed in (True, False):
        engine = Engine(target, lambda: ModelDrafter(draft), [])
        engine.cuda_graphs = graphed
        engine.reserve(max(map(len, prompts)), MAX_NEW, 5, sequences=5, shadow=True)
        runs[graphed] = decode(engine, prompts, 5, k)
        assert all(s.diverged_at is None for s in runs[graphed].values())
        sizes = {key[1] for key in engine._batch_graphs}
        assert (8 in sizes) if graphed else not sizes
    assert_same(runs[True], runs[False])
    for i, p in enumerate(prompts):
        ids, lps = plain_greedy(target, p, MAX_NEW)
        assert runs[True][i].ids == ids.tolist()
        assert torch.equal(torch.tensor(runs[True][i].logprobs, dtype=torch.float32), lps)
