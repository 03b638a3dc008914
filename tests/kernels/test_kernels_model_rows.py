"""The model's GPU row path (fused row kernels, decode-row attention, the GDN step kernel) run
through Triton's interpreter on a tiny model: verify rows equal decode rows bit for bit through
the whole network, speculative decoding stays exact, and the path computes the same model as the
torch path (close, not equal: other kernels, other rounding)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdash.engine.config import preset
from specdash.engine.model import Model, random_tensors
from specdash.engine.rows import Run, row_implementations
from specdash.engine.rows.attention import TorchAttention, TritonAttention, attend_masked
from specdash.engine.state import PooledSteps, SeqState, SlotPool, commit_batch
from specdash.kernels import gemm_backends

# Padding tile rows in the attention kernel compute -inf - -inf = NaN that is never read.
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="CPU interpreter test; on CUDA see test_gpu_engine"
    ),
]
CFG = replace(preset("tiny-hybrid"), linear_value_head_dim=32, max_position_embeddings=128)
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def model() -> Model:
    m = Model.from_tensors(CFG, random_tensors(CFG, 5))
    m.rows = row_implementations(CFG, m.rope, CUDA)  # the GPU route, through the interpreter
    return m


@pytest.fixture(scope="module")
def tile_model() -> Model:
    """The GPU route with the GEMMs on the `triton-fused` backend, whose exact rows fuse the row
    op before down_proj, o_proj and out_proj into the GEMM (`gemm_backends.FusedGemms`)."""
    fused = gemm_backends.gpu_backends()["triton-fused"]
    m = Model.from_tensors(CFG, random_tensors(CFG, 5), fused)
    m.rows = row_implementations(CFG, m.rope, CUDA)
    return m


def _prefilled(model: Model, prompt: torch.Tensor, in_place: bool = False) -> SeqState:
    state = SeqState.empty(CFG, 64, torch.float32, torch.device("cpu"))
    state.in_place = in_place
    model.forward(prompt, state, "prefill")
    return state


@pytest.mark.parametrize("rows", [2, 5])
def test_verify_rows_equal_decode_rows_through_the_model(model: Model, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    prompt = torch.randint(0, CFG.vocab_size, (9,), generator=gen)
    tokens = torch.randint(0, CFG.vocab_size, (rows,), generator=gen)
    verify_state = _prefilled(model, prompt)
    verify = model.forward(tokens, verify_state, "exact")
    decode_state = _prefilled(model, prompt)
    for r in range(rows):
        row = model.forward(tokens[r : r + 1], decode_state, "exact")
        decode_state.commit(1)
        assert torch.equal(row[0], verify[r]), f"row {r}"
    verify_state.commit(rows)
    for i, g in decode_state.gdn.items():
        assert torch.equal(g.ssm, verify_state.gdn[i].ssm)
        assert torch.equal(g.conv, verify_state.gdn[i].conv)


def test_row_path_computes_the_same_model_as_torch(model: Model) -> None:
    prompt = torch.randint(0, CFG.vocab_size, (9,), generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([3, 77, 400])
    out = []
    for device in (CUDA, torch.device("cpu")):
        model.rows = row_implementations(CFG, model.rope, device)
        out.append(model.forward(tokens, _prefilled(model, prompt), "exact"))
    model.rows = row_implementations(CFG, model.rope, CUDA)
    torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-4)


def test_fast_verify_on_the_cuda_route_is_the_batched_pass(model: Model) -> None:
    """Chosen as on CUDA, fast verify is the usual batched pass (SDPA over the k+1 rows with
    the positions read on the device, fused norms), not the exact row kernels: the same
    model, other bits. A CUDA state keeps its length on the device; here a CPU tensor does."""
    fast = model.rows["fast"].attention
    assert isinstance(fast, TorchAttention) and fast.attend is attend_masked
    assert isinstance(model.rows["exact"].attention, TritonAttention)
    prompt = torch.randint(0, CFG.vocab_size, (9,), generator=torch.Generator().manual_seed(2))
    tokens = torch.tensor([3, 77, 400, 12, 5])
    out = {}
    for mode in ("exact", "fast"):
        state = SeqState.empty(CFG, 64, torch.float32, torch.device("cpu"))
        state.position = torch.zeros(1, dtype=torch.int64)
        model.forward(prompt, state, "prefill")
        out[mode] = model.forward(tokens, state, mode)
        state.commit(3)
        out[mode + " next"] = model.forward(tokens[3:4], state, mode)
    for row in ("", " next"):
        exact, fast = out["exact" + row], out["fast" + row]
        torch.testing.assert_close(fast, exact, rtol=1e-4, atol=1e-4)
        assert not torch.equal(fast, exact), "fast verify computed the exact rows"


def test_speculation_on_the_row_path_equals_plain_greedy(model: Model) -> None:
    from tiny_models import plain_greedy

    from specdash.engine.drafters import NgramDrafter
    from specdash.engine.engine import Engine

    engine = Engine(model, lambda: NgramDrafter(), [])
    prompt = torch.randint(0, CFG.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    prompt = (prompt.tolist() * 2)[:20]  # repeats, so the n-gram drafter proposes and hits
    seq, _ = engine.start(0, prompt, 16, 4, shadow=True)
    while not seq.done:
        engine.spec_step([seq], 4, "exact", 16)
    ids, lps = plain_greedy(model, prompt, 16)
    assert seq.ids == ids.tolist() and seq.diverged_at is None
    assert torch.equal(torch.tensor(seq.logprobs, dtype=torch.float32), lps)


def test_fused_decode_rows_equal_the_launches_they_replace(monkeypatch) -> None:
    """The shipped exact decode row on the Triton tile: SwiGLU in the gate_up GEMM's epilogue
    and, on a state stepped in place, the conv inside the GDN step's launch. Against the same
    rows with both in launches of their own: equal logprobs, conv windows and GDN states, bit
    for bit, step after step."""
    triton = gemm_backends.gpu_backends()["triton"]
    assert triton.gate_up_swiglu is not None
    gen = torch.Generator().manual_seed(13)
    prompt, tokens = torch.randint(0, CFG.vocab_size, (9,), generator=gen), []
    runs = {}
    for name in ("fused", "apart"):
        backend = triton if name == "fused" else replace(triton, gate_up_swiglu=None)
        m = Model.from_tensors(CFG, random_tensors(CFG, 5), backend)
        m.rows = row_implementations(CFG, m.rope, CUDA)
        if name == "apart":
            monkeypatch.setattr(m.rows["exact"].gdn, "conv_in_gdn", lambda run: False)
        state, lps = _prefilled(m, prompt, in_place=True), []
        for step in range(3):
            if name == "fused":
                tokens.append(torch.randint(0, CFG.vocab_size, (1,), generator=gen))
            lps.append(m.forward(tokens[step], state, "exact"))
            assert not state.pending  # moved on inside the forward
            state.commit(1)
        runs[name] = lps, state
    (fused, s1), (apart, s2) = runs["fused"], runs["apart"]
    assert all(torch.equal(a, b) for a, b in zip(fused, apart, strict=True))
    for i in s1.gdn:
        assert torch.equal(s1.gdn[i].conv, s2.gdn[i].conv), f"conv window, layer {i}"
        assert torch.equal(s1.gdn[i].ssm, s2.gdn[i].ssm), f"GDN state, layer {i}"


def test_batched_forward_equals_each_sequence_alone(model: Model) -> None:
    """Batching through the row kernels: three sequences at different positions,
    1, 3 and 2 rows, in one forward (GEMMs and row kernels over all 6 rows, attention and GDN
    per sequence) give each sequence's rows the bits of its own forward."""
    gen = torch.Generator().manual_seed(11)
    lens, singles, states, rows = [1, 3, 2], [], [], []
    for j, n in enumerate(lens):
        prompt = torch.randint(0, CFG.vocab_size, (5 + 4 * j,), generator=gen)
        tokens = torch.randint(0, CFG.vocab_size, (n,), generator=gen)
        singles.append(model.forward(tokens, _prefilled(model, prompt), "exact"))
        states.append(_prefilled(model, prompt))
        rows.append(tokens)
    batched = model.forward_batch(torch.cat(rows), states, lens, "exact")
    assert torch.equal(torch.cat(singles), batched)


def test_decode_rows_on_slots_update_their_state_in_place(model: Model) -> None:
    """A decode row on a state that keeps its buffers (an engine slot, `in_place`) moves its
    conv window and GDN state on inside the forward, leaving nothing pending; the commit only
    moves the length. Alone, then two such states batched (no pool): rows and states equal
    the pending-then-commit path of plain states."""
    gen = torch.Generator().manual_seed(23)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=gen) for n in (6, 9)]
    plain = [_prefilled(model, p) for p in prompts]
    slots = [_prefilled(model, p, in_place=True) for p in prompts]
    for step in range(3):
        tokens = torch.randint(0, CFG.vocab_size, (2,), generator=gen)
        want = [model.forward(tokens[j : j + 1], st, "exact") for j, st in enumerate(plain)]
        if step == 0:
            got = torch.cat(
                [model.forward(tokens[j : j + 1], st, "exact") for j, st in enumerate(slots)]
            )
        else:
            got = model.forward_batch(tokens, slots, [1, 1], "exact")
        assert all(not st.pending for st in slots) and all(st.pending for st in plain)
        commit_batch(plain, [1, 1])
        commit_batch(slots, [1, 1])
        assert torch.equal(torch.cat(want), got), f"step {step}"
        for a, b in zip(plain, slots, strict=True):
            assert a.length == b.length
            for i, g in a.gdn.items():
                assert torch.equal(g.ssm, b.gdn[i].ssm) and torch.equal(g.conv, b.gdn[i].conv)


def test_pool_slots_step_together_with_the_bits_of_each_alone(model: Model) -> None:
    """Slots of one pool, out of order, two runs (1 and 3 rows each) in one forward, committed
    by `commit_batch` with different kept rows, then a second step: every row, GDN state, conv
    window and cached K/V equals the same sequence stepped alone on its own state."""
    gen = torch.Generator().manual_seed(13)
    pool = SlotPool(CFG, 6, 64, torch.float32, torch.device("cpu"))
    slots, lens, kept = [5, 1, 3, 0], [1, 1, 3, 3], [1, 1, 2, 3]
    prompts = [torch.randint(0, CFG.vocab_size, (4 + 3 * j,), generator=gen) for j in range(4)]
    pooled = [pool.states[s] for s in slots]
    alone = [_prefilled(model, p) for p in prompts]
    for st, p in zip(pooled, prompts, strict=True):
        model.forward(p, st, "prefill")
    for step in range(2):
        tokens = [torch.randint(0, CFG.vocab_size, (n,), generator=gen) for n in lens]
        batched = model.forward_batch(torch.cat(tokens), pooled, lens, "exact")
        runs = [len(run.states) for run in pool.pending]  # one launch per op for each run
        assert runs == [lens.count(n) for n in sorted(set(lens))]
        singles = [model.forward(t, st, "exact") for t, st in zip(tokens, alone, strict=True)]
        assert torch.equal(torch.cat(singles), batched), f"step {step}"
        commit_batch(pooled, kept)
        for st, n in zip(alone, kept, strict=True):
            st.commit(n)
        for a, b in zip(alone, pooled, strict=True):
            assert a.length == b.length
            for i, g in a.gdn.items():
                assert torch.equal(g.ssm, b.gdn[i].ssm) and torch.equal(g.conv, b.gdn[i].conv)
            for i, c in a.kv.items():
                assert torch.equal(c.k[:, : a.length], b.kv[i].k[:, : a.length])
        lens, kept = [2, 2, 2, 2], [2, 1, 1, 2]


def test_a_padded_run_of_device_slots_equals_each_sequence_alone(model: Model) -> None:
    """What `graphs.CapturedBatch` captures, run eagerly: three slots out of order padded to
    four with the pool's scratch slot, slot indices and positions as tensors (a prebuilt
    `Run`), committed by `SlotPool.apply_commit` with 0 rows kept for the pad, two steps:
    every row and state equals the sequence stepped alone, and the scratch slot stays empty.
    (A CUDA pool keeps positions on the device; here CPU tensors stand in.)"""
    gen = torch.Generator().manual_seed(19)
    pool = SlotPool(CFG, 3, 64, torch.float32, torch.device("cpu"))
    pool.position = torch.zeros(4, dtype=torch.int64)
    for st in [*pool.states, pool.scratch]:
        st.position = pool.position[st.slot : st.slot + 1]
    order, size, rows = [2, 0, 1], 4, 2
    prompts = [torch.randint(0, CFG.vocab_size, (4 + 3 * j,), generator=gen) for j in range(3)]
    pooled = [pool.states[s] for s in order]
    alone = [_prefilled(model, p) for p in prompts]
    for st, p in zip(pooled, prompts, strict=True):
        model.forward(p, st, "prefill")
    slots = torch.tensor([*order, pool.scratch.slot])
    counted = [pool.scratch] * size
    for step, kept in enumerate(([2, 1, 2], [1, 2, 2])):
        tokens = [torch.randint(0, CFG.vocab_size, (rows,), generator=gen) for _ in order]
        steps = PooledSteps(pool, counted, slots, {})
        run = Run(counted, rows, steps, pool.position.index_select(0, slots))
        padded = torch.cat([*tokens, torch.zeros(rows, dtype=torch.long)])
        batched = model.forward_batch(padded, counted, [rows] * size, "exact", run)
        pool.apply_commit(steps, torch.tensor([*kept, 0]))
        singles = [model.forward(t, st, "exact") for t, st in zip(tokens, alone, strict=True)]
        assert torch.equal(torch.cat(singles), batched[: len(order) * rows]), f"step {step}"
        for a, b, n in zip(alone, pooled, kept, strict=True):
            a.commit(n)
            b.keep(n)
            assert a.length == b.length == int(b.position)
            for i, g in a.gdn.items():
                assert torch.equal(g.ssm, b.gdn[i].ssm) and torch.equal(g.conv, b.gdn[i].conv)
            for i, c in a.kv.items():
                assert torch.equal(c.k[:, : a.length], b.kv[i].k[:, : a.length])
    assert int(pool.position[pool.scratch.slot]) == 0


def test_engine_batch_on_a_pool_equals_one_at_a_time(model: Model) -> None:
    """The engine with reserved slots (one pool) and a batch of 3, speculative (k=3): output
    ids and logprob bits equal plain decode one prompt at a time, and the batched shadow sees
    no divergence. The drafts replay the plain output, every fifth token spoiled on odd
    prompts, so sequences of one batch keep different row counts and verify rows of mixed
    lengths step together; five prompts, so finished slots serve the next ones. (Speculation
    one at a time on this path: test_speculation_on_the_row_path_equals_plain_greedy.)"""
    from test_batch_exact import MAX_NEW, assert_same, decode

    from specdash.engine.drafters import NgramDrafter, ReplayDrafter
    from specdash.engine.engine import Engine

    gen = torch.Generator().manual_seed(17)
    prompts = [
        torch.randint(0, CFG.vocab_size, (5 + 2 * j,), generator=gen).tolist() for j in range(5)
    ]
    plain = decode(Engine(model, NgramDrafter, []), prompts, 1, 0, shadow=False)
    continuation = {}
    for i, p in enumerate(prompts):
        ids = list(plain[i].ids)
        if i % 2:
            ids = [(t + 1) % CFG.vocab_size if j % 5 == 4 else t for j, t in enumerate(ids)]
        continuation[tuple(p)] = ids[:MAX_NEW]
    engine = Engine(model, lambda: ReplayDrafter(continuation), [])
    engine.reserve(max(map(len, prompts)), MAX_NEW, 5, sequences=3, shadow=True)
    batched = decode(engine, prompts, 3, 3)
    assert all(s.diverged_at is None for s in batched.values())
    assert_same(plain, batched)
    accepted = {st.accepted for s in batched.values() for st in s.steps}
    assert len(accepted) > 1 and max(accepted) > 0


def test_fused_gemms_keep_verify_rows_equal_decode_rows(tile_model: Model, monkeypatch) -> None:
    """Exact rows on the tile run SwiGLU, the output gate and the gated norm inside the GEMMs
    (and prefill and fast verify do not); verify rows still equal decode rows bit for bit, and
    the fused forward equals the unfused one here, where the interpreter reduces a head the
    same way in both (on the GPU: test_gpu_engine, with the GEMM tests' closeness)."""
    from specdash.kernels.triton import gemm

    seen: list[str] = []
    launch = gemm.launch
    monkeypatch.setattr(gemm, "launch", lambda *a: seen.append(type(a[3]).__name__) or launch(*a))
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, CFG.vocab_size, (9,), generator=gen)
    tokens = torch.randint(0, CFG.vocab_size, (4,), generator=gen)
    verify_state = _prefilled(tile_model, prompt)
    assert seen == [], "prefill takes F.linear"
    verify = tile_model.forward(tokens, verify_state, "exact")
    assert {"SwiGLU", "SigmoidGate", "GatedRmsNorm"} <= set(seen)
    decode_state = _prefilled(tile_model, prompt)
    for r in range(4):
        row = tile_model.forward(tokens[r : r + 1], decode_state, "exact")
        decode_state.commit(1)
        assert torch.equal(row[0], verify[r]), f"row {r}"
    verify_state.commit(4)
    for i, g in decode_state.gdn.items():
        assert torch.equal(g.ssm, verify_state.gdn[i].ssm)
    tile_model.gemm = gemm_backends.gpu_backends()["triton"]
    try:
        seen.clear()
        unfused = tile_model.forward(tokens, _prefilled(tile_model, prompt), "exact")
        assert set(seen) == {"NoneType"}
    finally:
        tile_model.gemm = gemm_backends.gpu_backends()["triton-fused"]
    assert torch.equal(unfused, verify)


def test_speculation_through_the_fused_gemms_equals_plain_greedy(tile_model: Model) -> None:
    """Drafts replayed from the plain run with every third token spoiled, so verify steps
    accept some rows and reject others. Compared with `plain_greedy` directly: no shadow,
    which would decode the same plain run again."""
    from tiny_models import plain_greedy

    from specdash.engine.drafters import ReplayDrafter
    from specdash.engine.engine import Engine

    prompt = torch.randint(0, CFG.vocab_size, (8,), generator=torch.Generator().manual_seed(6))
    ids, lps = plain_greedy(tile_model, prompt.tolist(), 10)
    drafts = [(t + 1) % CFG.vocab_size if j % 3 == 2 else t for j, t in enumerate(ids.tolist())]
    engine = Engine(tile_model, lambda: ReplayDrafter({tuple(prompt.tolist()): drafts}), [])
    seq, _ = engine.start(0, prompt.tolist(), 10, 3, shadow=False)
    while not seq.done:
        engine.spec_step([seq], 3, "exact", 10)
    assert seq.ids == ids.tolist()
    assert torch.equal(torch.tensor(seq.logprobs, dtype=torch.float32), lps)
    assert any(s.accepted > 0 for s in seq.steps) and any(
        s.accepted < len(s.rows) - 1 for s in seq.steps
    ), "drafts were all accepted or all rejected"


def test_prefill_with_the_attention_kernel_computes_what_sdpa_does(monkeypatch) -> None:
    """A bf16 prefill on the CUDA route with `kernels.prefill_attention` next to the same prefill
    with SDPA (the shipped attention), in chunks: the first causal, the later ones lower-right
    causal after cached keys; the kernel's wiring (positions, the cache's used keys) on the CPU."""
    from specdash.engine import model as model_module
    from specdash.engine.rows import triton_prefill_rows

    m = Model.from_tensors(CFG, random_tensors(CFG, 5, torch.bfloat16))
    m.rows = row_implementations(CFG, m.rope, CUDA)
    prompt = torch.randint(0, CFG.vocab_size, (40,), generator=torch.Generator().manual_seed(7))
    monkeypatch.setattr(model_module, "PREFILL_CHUNK", 16)
    out = []
    for kernel in (True, False):
        m.rows["prefill"] = triton_prefill_rows(CFG, m.rope, attention_kernel=kernel)
        state = SeqState.empty(CFG, 64, torch.bfloat16, torch.device("cpu"))
        out.append(m.forward(prompt, state, "prefill", all_logits=True))
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0.1)  # bf16 model
    assert (out[0].argmax(-1) == out[1].argmax(-1)).float().mean() > 0.95
