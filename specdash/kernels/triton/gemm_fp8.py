"""Batch-invariant FP8 GEMM for decode and verify: float8_e4m3fn rows times a float8_e4m3fn
weight [N, K] (K contiguous), bf16 out, with an M-independent order of every operation.

Why: as for the bf16 tile (`gemm`), a verify row is only bit-exact with its decode row if both go
through the same floating-point operations, so the launch is a function of (N, K, scale layout)
alone: BLOCK_M pinned to 16 (one MMA shape whatever M is), K walked in order, a fixed split-K
summed in split order by the program that takes the last ticket. Two scale layouts:

* per channel (SGLang's online FP8): x scales [M] (per token), w scales [N]; the fp32 dot runs
  over the whole K range and the epilogue is ``(acc * xs[m]) * ws[n]``, in that order always.
* block (a block-FP8 checkpoint): x scales [M, K/128] (per token and 128-column group), w scales
  per 128 x 128 block; every 128-column step is a fresh fp32 dot, scaled as
  ``dot * xs[m, kb] * ws[n, kb]`` and added to the accumulator in K order (SGLang's kernel's
  arithmetic). A weight scale is read per output column, so scales expanded to one row per
  weight row (`fp8.Fp8Weight`, fused projections) take the same path.

The activation quantization is per row (scale = amax / 448 over a token or a token's 128-column
group; a max is exact in any order), hence batch-invariant by construction. `quantize_rows` is
its kernel, one launch before each GEMM (SGLang launches its own): computed inside the tile's x
loads instead it gave the same bits, but the amax and the division on every K step of every
program made the 27B-shape decode 1.21x slower on an H100 (docs/PERF.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

from specdash.kernels.fp8 import BLOCK, FP8, FP8_MAX, SCALE_FLOOR, Fp8Weight
from specdash.kernels.triton import pdl
from specdash.kernels.triton.gemm import _aligned  # Triton specializes on pointer alignment too
from specdash.kernels.triton.pdl import (
    let_successor_launch,
    prefetch_rows_to_l2,
    wait_for_predecessor,
)
from specdash.kernels.triton.tickets import counters, sum_splits_in_order

BLOCK_M = 16
_FP8_MAX = tl.constexpr(FP8_MAX)  # a kernel reads module globals only as constexprs
_SCALE_FLOOR = tl.constexpr(SCALE_FLOOR)
Layout = Literal["channel", "block"]


@dataclass(frozen=True)
class Fp8GemmConfig:
    """Launch parameters of one (N, K, scale layout); never chosen from M."""

    block_n: int
    block_k: int  # a multiple of 128 in the block layout: that many columns per pipeline stage
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


_MIN_PROGRAMS = 128
"""Decode streams the weight once: below about one program per SM (132 on an H100) the HBM
bandwidth is not reached, so the N=5120 shapes (80 tiles of 64) split K in two."""
_MIN_K_PER_SPLIT = 1024


def fp8_gemm_config(n: int, k: int, layout: Layout) -> Fp8GemmConfig:
    """The one configuration for every M with this weight shape and scale layout: BN 64 x BK 256
    fp8 stages (16 KB of weight each, four in flight per program), split-K until about one
    program per SM."""
    block_k = 256 if k % 256 == 0 else BLOCK
    tiles = triton.cdiv(n, 64)
    split = 1
    while (
        tiles * split < _MIN_PROGRAMS
        and k % (2 * split * block_k) == 0
        and k // (2 * split) >= _MIN_K_PER_SPLIT
    ):
        split *= 2
    return Fp8GemmConfig(block_n=64, block_k=block_k, split_k=split)


@triton.jit
def _quantize_group(xf):
    """fp32 rows [R, G] -> (float8_e4m3fn rows, fp32 scale [R]): scale = max(amax, floor) / 448,
    q = clamp(x / scale). Per row: M never reaches it."""
    amax = tl.max(tl.abs(xf), axis=1)
    scale = tl.maximum(amax, _SCALE_FLOOR) / _FP8_MAX
    q = tl.clamp(xf / scale[:, None], -_FP8_MAX, _FP8_MAX).to(tl.float8e4nv)
    return q, scale


@triton.jit(do_not_specialize=["M"])
def _quantize_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, GROUP: tl.constexpr, CHUNK: tl.constexpr
):  # fmt: skip
    """One program: BLOCK_M rows x one group of GROUP columns, read in CHUNK-column pieces (the
    amax first, then the quantization with it)."""
    offs_m = tl.program_id(0) * 16 + tl.arange(0, 16)
    g = tl.program_id(1)
    m_mask = offs_m[:, None] < M
    offs_c = tl.arange(0, CHUNK)
    rows = offs_m[:, None] * stride_xm
    if GROUP == CHUNK:
        xf = tl.load(x_ptr + rows + (g * GROUP + offs_c)[None, :], mask=m_mask, other=0.0)
        q, scale = _quantize_group(xf.to(tl.float32))
        tl.store(q_ptr + offs_m[:, None] * K + (g * GROUP + offs_c)[None, :], q, mask=m_mask)
    else:
        amax = tl.zeros((16,), dtype=tl.float32)
        for c in range(0, GROUP, CHUNK):
            cols = g * GROUP + c + offs_c
            col_mask = m_mask & ((c + offs_c)[None, :] < GROUP)
            xf = tl.load(x_ptr + rows + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(xf), axis=1))
        scale = tl.maximum(amax, _SCALE_FLOOR) / _FP8_MAX
        for c in range(0, GROUP, CHUNK):
            cols = g * GROUP + c + offs_c
            col_mask = m_mask & ((c + offs_c)[None, :] < GROUP)
            xf = tl.load(x_ptr + rows + cols[None, :], mask=col_mask, other=0.0).to(tl.float32)
            q = tl.clamp(xf / scale[:, None], -_FP8_MAX, _FP8_MAX).to(tl.float8e4nv)
            tl.store(q_ptr + offs_m[:, None] * K + cols[None, :], q, mask=col_mask)
    groups = tl.num_programs(1)
    tl.store(s_ptr + offs_m * groups + g, scale, mask=offs_m < M)


def quantize_rows(x: torch.Tensor, group: int | None = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (bf16/fp16/fp32) -> (float8_e4m3fn [M, K], fp32 scales [M, K / group]): each
    token's `group`-column groups quantized on their own (None: the whole row, scales [M, 1])."""
    m, k = x.shape
    group = k if group is None else group
    if k % group:
        raise ValueError(f"K={k} is not a multiple of the group size {group}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    q = torch.empty((m, k), device=x.device, dtype=FP8)
    scales = torch.empty((m, k // group), device=x.device, dtype=torch.float32)
    if m:
        chunk = min(BLOCK, triton.next_power_of_2(group))
        grid = (triton.cdiv(m, BLOCK_M), k // group)
        _quantize_kernel[grid](x, q, scales, m, k, x.stride(0), GROUP=group, CHUNK=chunk)
    return q, scales


@triton.jit
def _finish(out_ptr, acc, xs_ptr, ws_ptr, offs_m, offs_n, M, N, BLOCKWISE: tl.constexpr):
    """Scale (per-channel layout: ``(acc * xs[m]) * ws[n]``) and store, rounded once."""
    n_valid = offs_n < N
    if not BLOCKWISE:
        xs = tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)
        ws = tl.load(ws_ptr + offs_n, mask=n_valid, other=0.0)
        acc = (acc * xs[:, None]) * ws[None, :]
    mask = (offs_m[:, None] < M) & n_valid[None, :]
    out = out_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    M,
    N,
    K_PER_SPLIT,
    stride_xm,
    stride_xsm,
    stride_wn,
    stride_wsn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    BLOCKWISE: tl.constexpr,
    WS_GROUP_N: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_BYTES: tl.constexpr,
):
    # M tiles vary fastest (as in the bf16 tile): the programs reading one weight tile for
    # different rows run side by side, so L2 serves the weight to all but the first.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    KG: tl.constexpr = 128 if BLOCKWISE else BLOCK_K  # columns per dot
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_valid = offs_n < N
    offs_k = tl.arange(0, KG)
    k_start = pid_s * K_PER_SPLIT
    w_rows = w_ptr + tl.minimum(offs_n, N - 1) * stride_wn
    if PREFETCH_BYTES:  # EARLY PDL: the weight is never written by a predecessor
        prefetch_rows_to_l2(w_rows + k_start, tl.full([BLOCK_N], PREFETCH_BYTES, tl.int32))
    wait_for_predecessor(PDL)
    m_mask = offs_m[:, None] < M
    ws_rows = ws_ptr + (tl.minimum(offs_n, N - 1) // WS_GROUP_N) * stride_wsn
    x_rows = x_ptr + offs_m * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        for j in tl.static_range(BLOCK_K // KG):
            kb = (kk + j * KG) // 128  # the 128-column scale group (block layout)
            cols = kk + j * KG + offs_k
            xt = tl.load(x_rows[:, None] + cols[None, :], mask=m_mask, other=0.0)
            if BLOCKWISE:
                xs = tl.load(xs_ptr + offs_m * stride_xsm + kb, mask=offs_m < M, other=0.0)
            if EVEN_N:
                wt = tl.load(w_rows[:, None] + cols[None, :])
            else:
                wt = tl.load(w_rows[:, None] + cols[None, :], mask=n_valid[:, None], other=0.0)
            if BLOCKWISE:
                ws = tl.load(ws_rows + kb)
                acc += tl.dot(xt, tl.trans(wt)) * xs[:, None] * ws[None, :]
            else:
                acc = tl.dot(xt, tl.trans(wt), acc)
    let_successor_launch(PDL)
    if SPLIT_K == 1:
        _finish(out_ptr, acc, xs_ptr, ws_ptr, offs_m, offs_n, M, N, BLOCKWISE)
    else:  # fp32 partials [SPLIT_K, M, N]; the last to arrive sums them in split order
        tile = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask & n_valid[None, :]
        group = pid_m * tl.num_programs(1) + pid_n
        last, total = sum_splits_in_order(
            part_ptr, ticket_ptr, acc, tile, mask, group, M * N, SPLIT_K
        )
        if last:
            _finish(out_ptr, total, xs_ptr, ws_ptr, offs_m, offs_n, M, N, BLOCKWISE)


def _interpretable(device: torch.device) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the FP8 tile runs on CUDA (or under TRITON_INTERPRET=1), not {device}")


def matmul(
    x: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    layout: Layout,
    out_dtype: torch.dtype = torch.bfloat16,
    ws_group_n: int = BLOCK,
    config: Fp8GemmConfig | None = None,
) -> torch.Tensor:
    """``(x * xs) @ (w * ws).T`` rounded once to `out_dtype`, each row's bits independent of M.

    x [M, K] float8_e4m3fn with scales xs ([M] per channel, [M, K/128] block). w [N, K]
    float8_e4m3fn with scales ws ([N] per channel; [ceil(N / ws_group_n), K/128] block).
    `config` overrides the (N, K, layout) choice; only benchmarks and tests use it.
    """
    m, k = x.shape
    n = w.shape[0]
    blockwise = layout == "block"
    _interpretable(x.device)
    if w.dtype != FP8 or w.shape[1] != k or w.device != x.device:
        raise ValueError(f"weight {w.dtype} {tuple(w.shape)} does not pair with x {tuple(x.shape)}")
    if blockwise and k % BLOCK:
        raise ValueError(f"K={k} is not a multiple of {BLOCK}, the block layout's K step")
    if x.dtype != FP8:
        raise ValueError(f"x is {x.dtype}, not float8_e4m3fn (quantize_rows quantizes it)")
    cfg = config or fp8_gemm_config(n, k, layout)
    if k % (cfg.split_k * cfg.block_k) or (blockwise and cfg.block_k % BLOCK):
        raise ValueError(f"config {cfg} does not divide K={k}")
    x, w = _aligned(x), _aligned(w)
    if blockwise:
        ws = ws if ws.stride(-1) == 1 else ws.contiguous()
        expected = (triton.cdiv(n, ws_group_n), k // BLOCK)
        if tuple(ws.shape) != expected:
            raise ValueError(f"weight scales {tuple(ws.shape)}, expected {expected}")
    else:
        ws = ws.reshape(-1).contiguous()
    xs_t = xs.reshape(m, -1).contiguous()
    out = torch.empty((m, n), device=x.device, dtype=out_dtype)
    if m == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, cfg.block_n), cfg.split_k)
    if cfg.split_k == 1:
        partials, tickets = out, out  # unused
    else:
        partials = torch.empty((cfg.split_k, m, n), device=x.device, dtype=torch.float32)
        tickets = counters("gemm_fp8", x.device, grid[0] * grid[1])
    pdl_mode = pdl.use_pdl(x.device)
    prefetch = 0
    if pdl_mode == pdl.EARLY:
        prefetch = min(cfg.num_stages * cfg.block_k, k // cfg.split_k)
    _fp8_gemm_kernel[grid](
        x, xs_t, w, ws, out, partials, tickets, m, n, k // cfg.split_k, x.stride(0),
        xs_t.stride(0), k, ws.stride(0) if blockwise else 0, BLOCK_M=BLOCK_M,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_N=n % cfg.block_n == 0, BLOCKWISE=blockwise,
        WS_GROUP_N=ws_group_n if blockwise else 1, PDL=pdl_mode, PREFETCH_BYTES=prefetch,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl_mode > 0,
    )  # fmt: skip
    return out


def linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """bf16 rows x [..., K] times the FP8 rows of `w` ([..., w.q rows]), x quantized per token
    and 128-column group first (`quantize_rows`): the native engine's FP8 linear (w8a8, block
    scales)."""
    lead = x.shape[:-1]
    xq, xs = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = matmul(xq, xs, w.q, w.scale, "block", x.dtype, w.group_n)
    return out.reshape(*lead, out.shape[-1])


# ------------------------------------------------- SGLang's FP8 GEMM signatures, for its routing


def fp8_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sgl_kernel.fp8_scaled_mm`'s contract (online FP8, per-channel): mat_a fp8 [M, K], mat_b
    fp8 [K, N] column-major (the weight [N, K] transposed), scales_a fp32 [M, 1] (or one for all
    rows), scales_b fp32 [1, N] (or [N, 1]); the bias, if any, added after the rounding."""
    m = mat_a.shape[0]
    xs = scales_a.reshape(-1)
    if xs.numel() == 1:
        xs = xs.expand(m)
    out = matmul(mat_a, xs.float(), mat_b.t(), scales_b.float(), "channel", out_dtype)
    return out if bias is None else out.add_(bias)


def w8a8_block_fp8_matmul_triton(
    A: torch.Tensor,  # noqa: N803 (SGLang's names)
    B: torch.Tensor,  # noqa: N803
    As: torch.Tensor,  # noqa: N803
    Bs: torch.Tensor,  # noqa: N803
    block_size: list[int],
    output_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """SGLang's block-FP8 GEMM contract: A fp8 [..., K] with As fp32 [..., K/128] (per token and
    128-column group), B fp8 [N, K] with Bs fp32 [ceil(N/128), ceil(K/128)]; block_size
    [128, 128], the only one this tile runs."""
    if list(block_size) != [BLOCK, BLOCK]:
        raise ValueError(f"block_size {list(block_size)} is not supported (only [128, 128])")
    lead = A.shape[:-1]
    k = A.shape[-1]
    out = matmul(A.reshape(-1, k), As.reshape(-1, k // BLOCK), B, Bs, "block", output_dtype)
    return out.reshape(*lead, B.shape[0])
