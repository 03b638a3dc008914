"""Decode attention: fp64 reference, verify rows == decode rows bitwise, batch composition."""

from __future__ import annotations

import pytest
import torch

from specdash.kernels.triton.decode_attention import decode_attention, verify_as_decode_rows


def _reference(q, k, v, n, scale):
    """fp64 attention of q[Hq,D] over k,v[Hkv,:n,D] with GQA."""
    rep = q.shape[0] // k.shape[0]
    kk = k[:, :n].double().repeat_interleave(rep, 0)
    vv = v[:, :n].double().repeat_interleave(rep, 0)
    s = torch.einsum("hd,htd->ht", q.double(), kk) * scale
    return torch.einsum("ht,htd->hd", s.softmax(-1), vv)


def _inputs(dtype, b=2, hq=6, hkv=2, d=32, lmax=300, t=5, device="cpu"):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(b, hkv, lmax, d, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, lmax, d, generator=g).to(device, dtype)
    q = torch.randn(b, t, hq, d, generator=g).to(device, dtype)
    return q, k, v


# Padding tile rows and rows with no token in a split compute -inf - -inf = NaN that is never read.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize(
    "dtype,hq,t",
    [(torch.bfloat16, 6, 5), (torch.float32, 6, 5), (torch.bfloat16, 12, 7)],
    ids=["bf16-one-pack", "fp32-one-pack", "bf16-two-packs"],
)
def test_verify_rows_equal_decode_rows_and_match_fp64(dtype, hq, t):
    q, k, v = _inputs(dtype, hq=hq, t=t)
    lens = torch.tensor([60, 190])  # verify rows cross the split boundary at 64 and 192
    ver = verify_as_decode_rows(q, k, v, lens, 0.2, split_size=64)
    for t in range(q.shape[1]):
        dec = decode_attention(q[:, t].contiguous(), k, v, lens + 1 + t, 0.2, split_size=64)
        assert torch.equal(dec, ver[:, t]), f"row {t}"
        for b in range(q.shape[0]):
            ref = _reference(q[b, t], k[b], v[b], int(lens[b]) + 1 + t, 0.2)
            err = ((ver[b, t].double() - ref).norm() / ref.norm()).item()
            assert err < (2e-2 if dtype == torch.bfloat16 else 1e-6)


def test_row_independent_of_batch_composition():
    q, k, v = _inputs(torch.bfloat16, b=3, t=1)
    q = q[:, 0].contiguous()
    lens = torch.tensor([100, 250, 7])
    both = decode_attention(q, k, v, lens, 0.1, split_size=64)
    for b in range(3):
        alone = decode_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], lens[b : b + 1], 0.1, 64)
        assert torch.equal(alone[0], both[b])


def test_slots_of_a_pool_give_each_sequence_its_own_bits():
    """Sequences anywhere in a pool of cache slots, one launch: each row's bits are those of the
    same sequence run alone on its own cache (the model's batched decode and verify)."""
    q, k, v = _inputs(torch.bfloat16, b=3, t=4)
    pool_k = torch.zeros(5, *k.shape[1:], dtype=k.dtype)
    pool_v = torch.zeros_like(pool_k)
    slots = torch.tensor([4, 0, 2])
    pool_k[slots], pool_v[slots] = k, v
    lens = torch.tensor([100, 250, 7])
    pooled = verify_as_decode_rows(q, pool_k, pool_v, lens, 0.1, split_size=64, slots=slots)
    for b in range(3):
        alone = verify_as_decode_rows(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], lens[b : b + 1], 0.1, 64
        )
        assert torch.equal(alone[0], pooled[b]), b


def test_split_size_must_divide_into_blocks():
    q, k, v = _inputs(torch.float32, t=1)
    with pytest.raises(ValueError, match="split_size"):
        decode_attention(q[:, 0].contiguous(), k, v, torch.tensor([5, 5]), 0.1, split_size=100)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_27b_shape_verify_equals_decode():
    q, k, v = _inputs(torch.bfloat16, b=2, hq=24, hkv=4, d=256, lmax=5000, t=10, device="cuda")
    lens = torch.tensor([250, 4000], device="cuda")
    ver = verify_as_decode_rows(q, k, v, lens, 256**-0.5)
    for t in range(10):
        dec = decode_attention(q[:, t].contiguous(), k, v, lens + 1 + t, 256**-0.5)
        assert torch.equal(dec, ver[:, t]), f"row {t}"
    ref = _reference(q[1, 9].cpu(), k[1].cpu(), v[1].cpu(), 4010, 256**-0.5)
    assert ((ver[1, 9].cpu().double() - ref).norm() / ref.norm()).item() < 2e-2
