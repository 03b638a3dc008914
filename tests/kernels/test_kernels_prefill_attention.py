"""Causal prefill attention (specdash/kernels/triton/prefill_attention.py) against SDPA in fp32.

On CPU the kernel runs in Triton's interpreter at tiny shapes; the GPU test runs every candidate
config at the Qwen3.5-27B head shape. Not an exactness path: closeness only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from specdash.kernels.triton.prefill_attention import (
    CANDIDATES,
    DEFAULT,
    PrefillAttentionConfig,
    causal_prefill_attention,
)

SMALL = [
    PrefillAttentionConfig(block_m=32, block_n=16, num_warps=4, num_stages=1),
    PrefillAttentionConfig(block_m=16, block_n=32, num_warps=4, num_stages=2, tma=False),
    DEFAULT,
]


def _reference(q, k, v, start, scale):
    """fp32 SDPA of the rows at positions start.. over keys 0..start+r (lower-right causal)."""
    t = q.shape[0]
    n = start + t
    mask = torch.ones(t, n, dtype=torch.bool, device=q.device).tril(start)
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k[None, :, :n].float(),
        v[None, :, :n].float(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _inputs(t, start, hq=4, hkv=2, d=32, spare=5, device="cpu", seed=0):
    """q [T, Hq, D] as a strided view of a fused projection (as the engine slices it), caches
    [Hkv, start + T + spare, D] whose slots past the chunk hold NaN: never to be read."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(t, hq * d + 2 * hkv * d, generator=g).to(device, torch.bfloat16)
    q = fused[:, : hq * d].view(t, hq, d)
    n = start + t
    k, v = (torch.randn(hkv, n + spare, d, generator=g).to(device, torch.bfloat16) for _ in "kv")
    k[:, n:], v[:, n:] = float("nan"), float("nan")
    return q, k, v


@pytest.mark.parametrize("config", SMALL, ids=["32x16", "16x32-pointer", "default"])
@pytest.mark.parametrize(
    "t,start,d",
    [(40, 0, 32), (37, 19, 16), (64, 64, 32), (1, 23, 16)],
    ids=["first-chunk-tail", "later-unaligned", "later-aligned", "one-row"],
)
def test_matches_sdpa(config, t, start, d):
    q, k, v = _inputs(t, start, d=d)
    out = causal_prefill_attention(q, k, v, start, d**-0.5, config)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = _reference(q, k, v, start, d**-0.5)
    # bf16 output and bf16 probabilities into the P @ V product (the interpreter truncates)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_caches_unaligned_for_tma_take_pointer_loads():
    """Key rows 17 elements apart (not 16-byte multiples): no TMA descriptor, the same result."""
    q, k, v = _inputs(21, 9, d=16)
    padded = [torch.zeros(*x.shape[:2], 17, dtype=x.dtype) for x in (k, v)]
    for p, x in zip(padded, (k, v), strict=True):
        p[..., :16] = x
    kp, vp = (p[..., :16] for p in padded)
    out = causal_prefill_attention(q, kp, vp, 9, 0.25, SMALL[0])
    assert torch.equal(
        out, causal_prefill_attention(q, k, v, 9, 0.25, replace(SMALL[0], tma=False))
    )


def test_rejects_mismatched_inputs():
    q, k, v = _inputs(8, 4)
    with pytest.raises(ValueError, match="start"):
        causal_prefill_attention(q, k[:, :10], v[:, :10], 4, 0.1)  # cache shorter than start + T
    with pytest.raises(ValueError, match="Hkv"):
        causal_prefill_attention(q[:, :3], k, v, 4, 0.1)  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="bf16"):
        causal_prefill_attention(q.float(), k.float(), v.float(), 4, 0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", CANDIDATES, ids=str)
def test_gpu_27b_shape(config):
    """24 query heads over 4 kv heads of 256: a first chunk and a later one, T not a multiple
    of any block."""
    for t, start in ((1000, 0), (1000, 3000)):
        q, k, v = _inputs(t, start, hq=24, hkv=4, d=256, spare=100, device="cuda")
        out = causal_prefill_attention(q, k, v, start, 256**-0.5, config)
        ref = _reference(q, k, v, start, 256**-0.5)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, (t, start)
        assert (out.float() - ref).abs().max().item() < 2e-2, (t, start)
