"""GDN recurrent step: fp64 reference, decode == verify bitwise (outputs and per-step states)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from specdash.engine import ops
from specdash.kernels.triton.elementwise import causal_conv_silu_in_place
from specdash.kernels.triton.gdn import (
    conv_gdn_steps_in_place,
    gdn_recurrent_step,
    gdn_steps_in_place,
    gdn_verify_steps,
)


def _reference(q, k, v, a, b, a_log, dt_bias, state):
    """docs/exactness.md §3 in fp64, token by token."""
    q, k, v, a, b = (x.double() for x in (q, k, v, a, b))
    h = state.double().clone()
    rep, dk = v.shape[2] // q.shape[2], q.shape[-1]
    outs, states = [], []
    for t in range(q.shape[1]):
        qq = q[:, t].repeat_interleave(rep, 1)
        kk = k[:, t].repeat_interleave(rep, 1)
        qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
        g = -a_log.double().exp() * F.softplus(a[:, t] + dt_bias.double(), threshold=20.0)
        h = h * g.exp()[..., None, None]
        v_new = torch.sigmoid(b[:, t])[..., None] * (v[:, t] - (h * kk[..., None]).sum(-2))
        h = h + kk[..., None] * v_new[..., None, :]
        outs.append((h * qq[..., None]).sum(-2))
        states.append(h.clone())
    return torch.stack(outs, 1), torch.stack(states, 1)


def _inputs(dtype, b=2, t=5, h=2, hv=4, dk=16, dv=64, device="cpu"):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    q, k = r(b, t, h, dk).to(device, dtype), r(b, t, h, dk).to(device, dtype)
    v = r(b, t, hv, dv).to(device, dtype)
    a, bb = r(b, t, hv).to(device, dtype), r(b, t, hv).to(device, dtype)
    a[0, 0, 0] = 30.0  # softplus threshold branch
    return q, k, v, a, bb, r(hv).to(device), r(hv).to(device), r(b, hv, dk, dv).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_steps_equal_verify_bitwise_and_match_fp64(dtype):
    q, k, v, a, b, a_log, dt_bias, state = _inputs(dtype)
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state)
    st = state
    for t in range(q.shape[1]):
        od, st = gdn_recurrent_step(q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], a_log, dt_bias, st)
        assert torch.equal(od, o[:, t]) and torch.equal(st, states[:, t]), f"step {t}"
    ro, rs = _reference(q, k, v, a, b, a_log, dt_bias, state)
    tol = 5e-3 if dtype == torch.bfloat16 else 1e-6  # bf16: the output cast
    assert ((o.double() - ro).norm() / ro.norm()).item() < tol
    assert ((states.double() - rs).norm() / rs.norm()).item() < 1e-6


def test_sequence_independent_of_batch_composition():
    q, k, v, a, b, a_log, dt_bias, state = _inputs(torch.bfloat16, b=3)
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state)
    one = [x[1:2] for x in (q, k, v, a, b)]
    o1, s1 = gdn_verify_steps(*one, a_log, dt_bias, state[1:2])
    assert torch.equal(o1[0], o[1]) and torch.equal(s1[0], states[1])


def test_state_slots_of_a_pool_give_each_sequence_its_own_bits():
    """Sequences starting from slots anywhere in a state pool, one launch: each one's outputs and
    per-step states are those it gets alone, and the pool is only read."""
    q, k, v, a, b, a_log, dt_bias, state = _inputs(torch.bfloat16, b=3)
    pool = torch.randn(5, *state.shape[1:])
    slots = torch.tensor([3, 0, 4])
    pool[slots] = state
    before = pool.clone()
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, pool, slots=slots)
    assert torch.equal(pool, before)
    for i in range(3):
        one = [x[i : i + 1] for x in (q, k, v, a, b)]
        o1, s1 = gdn_verify_steps(*one, a_log, dt_bias, state[i : i + 1])
        assert torch.equal(o1[0], o[i]) and torch.equal(s1[0], states[i]), i


@pytest.mark.parametrize("t", [1, 3])
def test_in_place_steps_store_the_last_state_into_its_slot(t: int) -> None:
    """Every token kept (a decode row): the in-place launch gives the outputs of
    `gdn_verify_steps` and stores its last per-step state into each sequence's slot, bit for
    bit; the other slots are untouched."""
    q, k, v, a, b, a_log, dt_bias, state = _inputs(torch.bfloat16, b=3, t=t)
    pool = torch.randn(5, *state.shape[1:])
    slots = torch.tensor([3, 0, 4])
    pool[slots] = state
    want = pool.clone()
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, pool, slots=slots)
    want[slots] = states[:, -1]
    o_in_place = gdn_steps_in_place(q, k, v, a, b, a_log, dt_bias, pool, slots=slots)
    assert torch.equal(o_in_place, o) and torch.equal(pool, want)


def _conv_gdn_check(b, h, hv, dk, dv, device, steps=3):
    """The fused conv + GDN decode launch against the two launches it replaces, `steps` decode
    rows in a row on pool slots: o, the moved window and the state, bit for bit."""
    g = torch.Generator().manual_seed(1)
    c, w = 2 * h * dk + hv * dv, 4

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(device, dtype)

    conv_w, a_log, dt_bias = r(c, w), r(hv, dtype=torch.float32), r(hv, dtype=torch.float32)
    slots = torch.arange(b, device=device).flip(0) * 2  # in a pool of 2b slots, out of order
    windows, states = r(2 * b, w - 1, c), r(2 * b, hv, dk, dv, dtype=torch.float32)
    fused_win, fused_state = windows.clone(), states.clone()
    for step in range(steps):
        proj = r(b, c + 2 * hv)  # in_proj rows: raw q | k | v, then a, b as strided views
        qkv, aa, bb = proj.split([c, hv, hv], dim=-1)
        mixed = causal_conv_silu_in_place(windows, qkv, conv_w, slots)
        q, k, v = mixed.split([h * dk, h * dk, hv * dv], dim=-1)
        qkvab = (q.view(b, 1, h, dk), k.view(b, 1, h, dk), v.view(b, 1, hv, dv), aa, bb)
        qkvab = (*qkvab[:3], aa[:, None], bb[:, None])
        o = gdn_steps_in_place(*qkvab, a_log, dt_bias, states, slots=slots)[:, 0]
        args = (a_log, dt_bias, fused_win, fused_state)
        fused = conv_gdn_steps_in_place(qkv, aa, bb, conv_w, *args, slots=slots)
        assert torch.equal(fused, o), f"o, step {step}"
        assert torch.equal(fused_win, windows), f"conv window, step {step}"
        assert torch.equal(fused_state, states), f"state, step {step}"


def test_conv_fused_into_the_decode_step_gives_the_two_launches_bits() -> None:
    """Every program of a key head reads its q/k conv window; the last one moves it on (a
    ticket), so the window must come out right whatever order the programs ran in."""
    _conv_gdn_check(b=2, h=2, hv=6, dk=16, dv=32, device="cpu")


def test_chunked_prefill_matches_recurrence():
    q, k, v, a, b, a_log, dt_bias, state = _inputs(torch.float32, t=11)
    o, s = ops.gdn_chunked_prefill(q, k, v, a, b, a_log, dt_bias, state, chunk_size=4)
    ro, rs = _reference(q, k, v, a, b, a_log, dt_bias, state)
    assert ((o.double() - ro).norm() / ro.norm()).item() < 1e-5
    assert ((s.double() - rs[:, -1]).norm() / rs[:, -1].norm()).item() < 1e-5


def test_rejects_non_fp32_state():
    q, k, v, a, b, a_log, dt_bias, state = _inputs(torch.float32, t=1)
    with pytest.raises(ValueError, match="fp32"):
        gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state.bfloat16())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_27b_shape_decode_equals_verify():
    q, k, v, a, b, a_log, dt_bias, state = _inputs(
        torch.bfloat16, b=1, t=10, h=16, hv=48, dk=128, dv=128, device="cuda"
    )
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state)
    st = state
    for t in range(10):
        od, st = gdn_recurrent_step(q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], a_log, dt_bias, st)
        assert torch.equal(od, o[:, t]) and torch.equal(st, states[:, t]), f"step {t}"
    ro, rs = _reference(*(x.cpu() for x in (q, k, v, a, b, a_log, dt_bias, state)))
    assert ((states.cpu().double() - rs).norm() / rs.norm()).item() < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_27b_shape_conv_fused_into_the_decode_step() -> None:
    _conv_gdn_check(b=4, h=16, hv=48, dk=128, dv=128, device="cuda", steps=8)


def test_model_prefill_through_kernels_equals_the_native_torch_path() -> None:
    """The GPU prefill route's GDN (ops.gdn_prefill, torch fallback here) is the same
    math in the same order as the CPU engine's, bit for bit. (CUDA's prefill also takes the
    fused row kernels for its row-wise ops: close to torch's, not equal, in
    test_kernels_model_rows.)"""
    from specdash.engine.config import preset
    from specdash.engine.model import Model, random_tensors
    from specdash.engine.rows import prefill_rows, row_implementations
    from specdash.engine.rows.gdn import ChunkedGdn
    from specdash.engine.state import SeqState

    cfg = replace(preset("tiny-hybrid"), linear_value_head_dim=32)  # inside the kernels' shapes
    model = Model.from_tensors(cfg, random_tensors(cfg, 3))
    cuda_prefill = row_implementations(cfg, model.rope, torch.device("cuda"))["prefill"]
    assert isinstance(cuda_prefill.gdn, ChunkedGdn) and cuda_prefill.gdn.kernel
    tokens = torch.randint(0, cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(4))
    out = []
    for gdn_kernel in (False, True):  # the CPU route's GDN, then the one chosen on CUDA
        model.rows["prefill"] = prefill_rows(cfg, model.rope, gdn_kernel)
        state = SeqState.empty(cfg, 80, torch.float32, torch.device("cpu"))
        out.append((model.forward(tokens, state, "prefill"), state.gdn[0].ssm.clone()))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
