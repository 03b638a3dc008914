"""Batch-invariant FP8 GEMM: an fp64 dequantized reference, rows bit-identical across M.

On the CPU the kernels run in Triton's interpreter (float8_e4m3fn loads, conversions and dots as
the GPU rounds them: specdash.kernels.triton._interpreter); the GPU tests run the same checks on
the Qwen3.5-27B FP8 shapes.
"""

from __future__ import annotations

import pytest
import torch

from specdash.kernels.fp8 import FP8, Fp8Weight, dequantize, quantize_blocks
from specdash.kernels.triton import gemm_fp8, tickets
from specdash.kernels.triton.gemm_fp8 import Fp8GemmConfig, fp8_gemm_config, matmul, quantize_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rand(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def _dequantized_rows(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """fp64 rows of q * s, s per token ([M]) or per token and 128-column group ([M, K/128])."""
    if s.shape[1] == 1:
        return q.double() * s.double()
    return (q.double().view(q.shape[0], -1, 128) * s.double()[..., None]).view(q.shape)


def _rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def assert_rows_invariant(fn, m: int) -> None:
    """fn(rows) over the first m rows: every prefix, each row alone, another row order."""
    full = fn(slice(0, m))
    for n in range(1, m + 1):
        assert torch.equal(fn(slice(0, n)), full[:n]), f"M={n}"
    for i in range(m):
        assert torch.equal(fn(slice(i, i + 1)), full[i : i + 1]), f"row {i} alone"
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    assert torch.equal(fn(perm), full[perm])


def _block_case(m, n, k, seed=0):
    w = _rand(n, k, seed=seed, scale=k**-0.5)
    q, s = quantize_blocks(w)
    x = _rand(m, k, seed=seed + 1).bfloat16()
    return x, q, s


@pytest.mark.parametrize("group", [128, None])
def test_row_quantization_is_amax_over_448_per_group(group):
    """The kernel's scales and fp8 values are the exact torch formula's: scale = amax / 448,
    q = clamp(x / scale), rounded to nearest even; an all-zero group quantizes to zeros."""
    x = _rand(5, 384, seed=3) * torch.logspace(-3, 2, 384, device=DEVICE)
    x[2, :128] = 0
    x = x.bfloat16()
    q, s = quantize_rows(x, group)
    g = 384 if group is None else group
    xf = x.float().view(5, -1, g)
    ref_s = xf.abs().amax(-1).clamp(min=1e-10) / 448
    ref_q = (xf / ref_s[..., None]).clamp(-448, 448).to(FP8).view(5, 384)
    if DEVICE == "cpu":
        assert torch.equal(s, ref_s)
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    else:  # the GPU's fp32 division may differ in its last bit from torch's
        assert torch.allclose(s, ref_s, rtol=1e-6, atol=0)
        assert (q.float() - ref_q.float()).abs().max() <= ref_q.float().abs().max() / 8
    assert not q[2, :128].float().any()
    assert torch.equal(quantize_rows(x[1:3], group)[0], q[1:3])


BLOCK_CONFIGS = [None, Fp8GemmConfig(32, 128, 2), Fp8GemmConfig(16, 256, 1, num_stages=2)]


@pytest.mark.parametrize("config", BLOCK_CONFIGS)
def test_block_layout_matches_fp64_and_rows_are_batch_invariant(config):
    x, q, s = _block_case(16, 80, 512)  # 80: a partly filled weight block and output tile
    xq, xs = quantize_rows(x)
    out = matmul(xq, xs, q, s, "block", config=config)
    assert out.dtype == torch.bfloat16 and out.shape == (16, 80)
    ref = _dequantized_rows(xq, xs) @ dequantize(q, s).double().T
    assert _rel_err(out, ref) < 5e-3
    assert_rows_invariant(lambda i: matmul(xq[i], xs[i], q, s, "block", config=config), 16)
    assert not tickets.counters("gemm_fp8", xq.device, 1).any()  # left zero for the next launch


def test_linear_is_quantize_rows_then_the_tile():
    """`linear` quantizes x per token and 128-column group, then runs the tile: those two
    launches' bits, its rows batch-invariant, any leading shape."""
    x, q, s = _block_case(9, 64, 384, seed=4)
    w = Fp8Weight(q, s)
    two = matmul(*quantize_rows(x), q, s, "block")
    assert torch.equal(gemm_fp8.linear(x, w), two)
    assert_rows_invariant(lambda i: gemm_fp8.linear(x[i], w), 9)
    assert gemm_fp8.linear(x.view(3, 3, 384), w).shape == (3, 3, 64)


def test_row_scales_give_the_stored_blocks_bits():
    """A fused projection whose parts' rows are not multiples of 128 keeps one scale row per
    weight row; the same blocks' scales read either way give the same bits."""
    x, q, s = _block_case(4, 200, 256, seed=5)
    stored = gemm_fp8.linear(x, Fp8Weight(q, s))
    expanded = Fp8Weight(q, s).row_scales()
    assert torch.equal(gemm_fp8.linear(x, Fp8Weight(q, expanded, 1)), stored)
    qa, sa = quantize_blocks(_rand(72, 256, seed=6))
    fused = Fp8Weight.cat([Fp8Weight(qa, sa), Fp8Weight(q, s)])
    assert fused.group_n == 1 and fused.scale.shape == (272, 2)
    out = gemm_fp8.linear(x, fused)
    assert torch.equal(out[:, 72:], stored)
    assert torch.equal(out[:, :72], gemm_fp8.linear(x, Fp8Weight(qa, sa)))
    aligned = Fp8Weight.cat([Fp8Weight(*quantize_blocks(_rand(128, 256))), Fp8Weight(q, s)])
    assert aligned.group_n == 128 and aligned.scale.shape == (1 + 2, 2)


@pytest.mark.parametrize("config", [None, Fp8GemmConfig(32, 128, 2)])
def test_channel_layout_matches_fp64_and_rows_are_batch_invariant(config):
    """SGLang's online FP8: per-token x scales, per-output-channel w scales, one fp32 dot over
    K and the epilogue (acc * xs) * ws, through `fp8_scaled_mm`'s signature."""
    w = _rand(48, 512, seed=7)
    ws = w.abs().amax(1) / 448
    wq = (w / ws[:, None]).to(FP8)
    xq, xs = quantize_rows(_rand(16, 512, seed=8).bfloat16(), None)
    fn = lambda i: gemm_fp8.fp8_scaled_mm(  # noqa: E731
        xq[i], wq.t(), xs[i], ws[None], torch.bfloat16
    )
    ref = _dequantized_rows(xq, xs) @ (wq.double() * ws.double()[:, None]).T
    assert _rel_err(fn(slice(None)), ref) < 5e-3
    assert_rows_invariant(fn, 16)
    direct = lambda i: matmul(xq[i], xs[i, 0], wq, ws, "channel", config=config)  # noqa: E731
    assert_rows_invariant(direct, 16)
    bias = _rand(48, seed=9).bfloat16()
    with_bias = gemm_fp8.fp8_scaled_mm(xq, wq.t(), xs, ws[None], torch.bfloat16, bias)
    assert torch.equal(with_bias, fn(slice(None)) + bias)


def test_sglang_block_signature():
    x, q, s = _block_case(6, 64, 256, seed=10)
    xq, xs = quantize_rows(x)
    out = gemm_fp8.w8a8_block_fp8_matmul_triton(
        xq.view(2, 3, 256), q, xs.view(2, 3, 2), s, [128, 128], torch.bfloat16
    )
    assert out.shape == (2, 3, 64)
    assert torch.equal(out.view(6, 64), matmul(xq, xs, q, s, "block"))
    with pytest.raises(ValueError, match=r"block_size \[64, 64\] is not supported"):
        gemm_fp8.w8a8_block_fp8_matmul_triton(xq, q, xs, s, [64, 64], torch.bfloat16)


def test_bad_operands_are_refused():
    x, q, s = _block_case(2, 64, 256)
    xq, xs = quantize_rows(x)
    with pytest.raises(ValueError, match="weight scales"):
        matmul(xq, xs, q, s[:, :1], "block")
    with pytest.raises(ValueError, match="multiple of 128"):
        matmul(xq[:, :192], xs, q[:, :192], s, "block")
    with pytest.raises(ValueError, match="does not pair"):
        matmul(xq, xs, q.float(), s, "block")
    with pytest.raises(ValueError, match="not float8_e4m3fn"):
        matmul(x, xs, q, s, "block")


QWEN35_27B_FP8_SHAPES = [
    (14336, 5120),  # attn q|k|v
    (16384, 5120),  # GDN in_proj q|k|v|z (b|a stay bf16)
    (5120, 6144),  # attn o_proj, GDN out_proj
    (34816, 5120),  # mlp gate|up
    (5120, 17408),  # mlp down
]


@pytest.mark.parametrize("n,k", QWEN35_27B_FP8_SHAPES)
def test_27b_configs_fill_the_gpu_from_n_and_k_alone(n, k):
    cfg = fp8_gemm_config(n, k, "block")
    assert cfg == fp8_gemm_config(n, k, "block")
    assert (cfg.block_n, cfg.block_k) == (64, 256)
    assert -(-n // cfg.block_n) * cfg.split_k >= 128  # about one program per SM, or more
    assert k % (cfg.split_k * cfg.block_k) == 0


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("n,k", QWEN35_27B_FP8_SHAPES)
def test_gpu_27b_fp8_rows_invariant(n, k):
    x, q, s = _block_case(64, n, k)
    w = Fp8Weight(q, s)
    xq, xs = quantize_rows(x)
    ref = _dequantized_rows(xq, xs) @ dequantize(q, s).double().T
    assert _rel_err(gemm_fp8.linear(x, w), ref) < 5e-3
    assert torch.equal(gemm_fp8.linear(x, w), matmul(xq, xs, q, s, "block"))
    assert_rows_invariant(lambda i: gemm_fp8.linear(x[i], w), 64)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("n,k", [(14336, 5120), (5120, 17408)])
def test_gpu_27b_channel_layout_rows_invariant(n, k):
    w = _rand(n, k, scale=k**-0.5)
    ws = w.abs().amax(1) / 448
    wq = (w / ws[:, None]).to(FP8)
    xq, xs = quantize_rows(_rand(64, k, seed=1).bfloat16(), None)
    fn = lambda i: gemm_fp8.fp8_scaled_mm(  # noqa: E731
        xq[i], wq.t(), xs[i], ws[None], torch.bfloat16
    )
    ref = _dequantized_rows(xq, xs) @ (wq.double() * ws.double()[:, None]).T
    assert _rel_err(fn(slice(None)), ref) < 5e-3
    assert_rows_invariant(fn, 64)
