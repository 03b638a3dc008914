"""The fused row kernels (residual+norm, gated norm, SwiGLU, output gate, causal conv, q/k
norm + RoPE + cache store): fp64 references, and every row's bits independent of the other rows
and of how many there are (verify rows == decode rows)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdash.kernels.triton.elementwise import (
    causal_conv_silu_in_place,
    causal_conv_silu_rows,
    sigmoid_gate_rows,
    swiglu_rows,
)
from specdash.kernels.triton.rmsnorm import add_rms_norm_rows, gated_rms_norm_rows
from specdash.kernels.triton.rope import qk_norm_rope_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32]


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _close(got, want, dtype):
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def _rms(x, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centred", [False, True])
def test_add_rms_norm(dtype, zero_centred):
    a, x, w = _randn(9, 96, seed=1, dtype=dtype), _randn(9, 96, seed=2, dtype=dtype), _randn(96)
    s, y = add_rms_norm_rows(a, x, w, 1e-6, zero_centred)
    if DEVICE == "cuda" or dtype == torch.float32:  # the interpreter's bf16 cast truncates
        assert torch.equal(s, x + a)  # the residual stream rounds exactly as torch's add
    _close(s, x.double() + a.double(), dtype)
    scale = (1 + w.double()) if zero_centred else w.double()
    _close(y, _rms(s.double()) * scale, dtype)
    for m in (1, 4):
        sm, ym = add_rms_norm_rows(a[:m].clone(), x[:m].clone(), w, 1e-6, zero_centred)
        assert torch.equal(sm, s[:m]) and torch.equal(ym, y[:m])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm_reads_strided_head_rows(dtype):
    t, h, d = 5, 3, 64
    o = _randn(t, h, d, seed=3, dtype=dtype)
    proj = _randn(t, 7 + h * d + 5, seed=4, dtype=dtype)
    z = proj[:, 7 : 7 + h * d].view(t, h, d)  # as GDN's z sits inside the in_proj output
    w = _randn(d, seed=5)
    y = gated_rms_norm_rows(o, z, w, 1e-6)
    zz = z.double()
    _close(y, w.double() * _rms(o.double()) * zz * torch.sigmoid(zz), dtype)
    assert torch.equal(y, gated_rms_norm_rows(o.contiguous(), z.contiguous(), w, 1e-6))
    assert torch.equal(gated_rms_norm_rows(o[2:3].clone(), z[2:3], w, 1e-6), y[2:3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_and_sigmoid_gate(dtype):
    gu = _randn(9, 2 * 1100, seed=6, dtype=dtype)  # wider than one block: two programs per row
    g, u = gu.double().chunk(2, dim=-1)
    y = swiglu_rows(gu)
    _close(y, g * torch.sigmoid(g) * u, dtype)
    assert torch.equal(swiglu_rows(gu[3:4].clone()), y[3:4])
    x = _randn(9, 3, 32, seed=7, dtype=dtype)
    gate = _randn(9, 3, 64, seed=8, dtype=dtype)[..., 32:]  # [q | gate] per head, as in qkv
    yg = sigmoid_gate_rows(x, gate)
    _close(yg, x.double() * torch.sigmoid(gate.double()), dtype)
    assert torch.equal(sigmoid_gate_rows(x[:1].clone(), gate[:1].contiguous()), yg[:1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_conv_verify_rows_equal_decode_rows(dtype):
    c, w_len, t = 1100, 4, 6
    window, w = _randn(w_len - 1, c, seed=9, dtype=dtype), _randn(c, w_len, seed=10, dtype=dtype)
    proj = _randn(t, c + 13, seed=11, dtype=dtype)
    x = proj[:, :c]  # strided rows, as qkv inside the in_proj output
    out, seq = causal_conv_silu_rows(window, x, w)
    assert torch.equal(seq, torch.cat((window, x)))
    full = seq.double()
    ref = sum(full[j : j + t] * w.double()[:, j] for j in range(w_len))
    _close(out, F.silu(ref), dtype)
    win = window
    for i in range(t):  # decode: one row at a time, the window sliding as the state keeps it
        o1, s1 = causal_conv_silu_rows(win, x[i : i + 1], w)
        assert torch.equal(o1[0], out[i]), f"row {i}"
        win = s1[1:]


def test_causal_conv_window_slots_of_a_pool():
    """Several sequences' rows in one launch, each window a slot of a pool: each sequence's
    output and kept sequence equal its own launch."""
    c, w_len, t, dtype = 300, 4, 3, torch.bfloat16
    pool = _randn(5, w_len - 1, c, seed=15, dtype=dtype)
    w = _randn(c, w_len, seed=16, dtype=dtype)
    proj = _randn(2 * t, c + 7, seed=17, dtype=dtype)
    x, slots = proj[:, :c], torch.tensor([4, 1], device=DEVICE)
    out, seq = causal_conv_silu_rows(pool, x, w, slots=slots)
    for b, s in enumerate(slots.tolist()):
        o1, s1 = causal_conv_silu_rows(pool[s], x[b * t : (b + 1) * t], w)
        assert torch.equal(o1, out[b * t : (b + 1) * t]) and torch.equal(s1, seq[b]), b


def test_causal_conv_in_place_moves_each_window_on_by_its_row():
    """Decode rows (one per sequence, kept) at pool slots: the output of the seq-returning
    launch, and each slot's window becomes that launch's kept window; other slots untouched."""
    c, w_len, dtype = 300, 4, torch.bfloat16
    pool = _randn(5, w_len - 1, c, seed=22, dtype=dtype)
    w = _randn(c, w_len, seed=23, dtype=dtype)
    x, slots = _randn(3, c + 7, seed=24, dtype=dtype)[:, :c], torch.tensor([4, 0, 2], device=DEVICE)
    out, seq = causal_conv_silu_rows(pool, x, w, slots=slots)
    want = pool.clone()
    want[slots] = seq[:, 1:]
    assert torch.equal(causal_conv_silu_in_place(pool, x, w, slots=slots), out)
    assert torch.equal(pool, want)
    single = pool[1].clone()
    o1, s1 = causal_conv_silu_rows(single, x[:1], w)
    assert torch.equal(causal_conv_silu_in_place(single, x[:1], w), o1)
    assert torch.equal(single, s1[1:])


def test_qk_norm_rope_cache_slots_of_a_pool():
    """Rows of several sequences at their own positions, K/V into their own slots of a pool,
    one launch: the same q and cache bits as each sequence's own launch."""
    hq, hkv, d, r, t, cap, dtype = 4, 2, 32, 16, 3, 32, torch.bfloat16
    qkv = _randn(2 * t, hq * 2 * d + 2 * hkv * d, seed=18, dtype=dtype)
    qn, kn = _randn(d, seed=19, dtype=dtype), _randn(d, seed=20, dtype=dtype)
    table = _randn(cap, r, seed=21, dtype=dtype)
    args = (hq, hkv, True, qn, kn, 1e-6, True, table, table)
    kc = torch.zeros(4, hkv, cap, d, device=DEVICE, dtype=dtype)
    vc = torch.zeros_like(kc)
    starts, slots = torch.tensor([5, 11], device=DEVICE), torch.tensor([3, 0], device=DEVICE)
    q = qk_norm_rope_rows(qkv, *args, starts, kc, vc, slots=slots)
    for b, s in enumerate(slots.tolist()):
        kc1, vc1 = torch.zeros_like(kc[0]), torch.zeros_like(vc[0])
        q1 = qk_norm_rope_rows(qkv[b * t : (b + 1) * t], *args, starts[b : b + 1], kc1, vc1)
        assert torch.equal(q1, q[b * t : (b + 1) * t])
        assert torch.equal(kc1, kc[s]) and torch.equal(vc1, vc[s]), b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated,zero_centred", [(True, True), (False, False)])
def test_qk_norm_rope_store(dtype, gated, zero_centred):
    hq, hkv, d, r, t, cap, start = 4, 2, 32, 16, 5, 64, 9
    qs = d * (2 if gated else 1)
    qkv = _randn(t, hq * qs + 2 * hkv * d, seed=12, dtype=dtype)
    qn, kn = _randn(d, seed=13, dtype=dtype) * 0.1, _randn(d, seed=14, dtype=dtype) * 0.1
    pos_all = torch.arange(cap, dtype=torch.float64)[:, None]
    inv = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    ang = torch.cat((pos_all * inv, pos_all * inv), -1)
    cos, sin = ang.cos().to(DEVICE, dtype), ang.sin().to(DEVICE, dtype)
    kc = torch.zeros(hkv, cap, d, device=DEVICE, dtype=dtype)
    vc = torch.zeros_like(kc)
    position = torch.tensor([start], device=DEVICE)
    args = (hq, hkv, gated, qn, kn, 1e-6, zero_centred, cos, sin)
    q = qk_norm_rope_rows(qkv, *args, position, kc, vc)

    def ref(x, w, rows):
        y = _rms(x.double()) * ((1 + w.double()) if zero_centred else w.double())
        c, s = cos[rows].double()[:, None], sin[rows].double()[:, None]
        rot = torch.cat((-y[..., r // 2 : r], y[..., : r // 2]), -1)
        return torch.cat((y[..., :r] * c + rot * s, y[..., r:]), -1)

    rows = torch.arange(start, start + t)
    qq = qkv[:, : hq * qs].view(t, hq, qs)[..., :d]
    kk = qkv[:, hq * qs : hq * qs + hkv * d].view(t, hkv, d)
    vv = qkv[:, hq * qs + hkv * d :].view(t, hkv, d)
    _close(q, ref(qq, qn, rows), dtype)
    _close(kc[:, start : start + t].transpose(0, 1), ref(kk, kn, rows), dtype)
    assert torch.equal(vc[:, start : start + t].transpose(0, 1), vv)
    assert not kc[:, :start].any() and not kc[:, start + t :].any()
    for i in range(t):  # decode rows: position start+i, one row
        kc1, vc1 = torch.zeros_like(kc), torch.zeros_like(vc)
        p1 = torch.tensor([start + i], device=DEVICE)
        q1 = qk_norm_rope_rows(qkv[i : i + 1], *args, p1, kc1, vc1)
        assert torch.equal(q1[0], q[i])
        assert torch.equal(kc1[:, start + i], kc[:, start + i])
