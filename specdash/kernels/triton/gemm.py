"""Batch-invariant GEMM for decode and verify: ``x @ w.T`` with an M-independent reduction order.

Why: a verify step runs k+1 rows through the same weights that decode runs one row through, and
the speculative output is only bit-exact if every output element goes through the identical
sequence of floating-point operations in both. So the launch configuration is a function of
(N, K, dtype) alone: BLOCK_M is pinned to 16 (one MMA instruction shape whatever M is), each
program walks its K range sequentially, and a split-K, where used, is fixed per (N, K): the
program that finishes a tile last (an atomic ticket) sums the fp32 partials in split order 0, 1,
..., so the order of arrival never reaches the arithmetic. Rows beyond M are zeros (masked or TMA
out-of-bounds loads), which cannot change the other rows' bits because MMA rows are independent.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from specdash.kernels.triton import pdl
from specdash.kernels.triton.elementwise import sigmoid_gate_rows, silu, swiglu_rows
from specdash.kernels.triton.pdl import (
    let_successor_launch,
    prefetch_rows_to_l2,
    wait_for_predecessor,
)
from specdash.kernels.triton.rmsnorm import gated_rms_norm_rows
from specdash.kernels.triton.tickets import counters, sum_splits_in_order

BLOCK_M = 16
_SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_warned: set[str] = set()


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one (N, K, dtype); never chosen from M."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    tma: bool = False  # tiles through the Hopper bulk tensor copy engine instead of pointer loads


# The fastest CUDA-graph time of a sweep on an H200 (benchmarks/bench_gemm.py --sweep; docs/PERF.md,
# GEMM section) for the Qwen3.5-27B GEMMs as the native model runs them (q|k|v, GDN q|k|v|z|b|a and
# gate|up fused): (N, K) -> bf16 config. Where a pointer-load config was within 2% of a TMA one it
# is kept, since eager (non-graph) launches of TMA descriptors cost more host time.
TUNED_BF16: dict[tuple[int, int], GemmConfig] = {
    (14336, 5120): GemmConfig(128, 128, 1, num_warps=4, num_stages=4),  # attn qkv
    (5120, 6144): GemmConfig(64, 128, 1, num_warps=4, num_stages=6),  # attn o_proj, gdn out_proj
    (16480, 5120): GemmConfig(64, 128, 1, num_warps=4, num_stages=4),  # gdn in_proj qkvzba
    (34816, 5120): GemmConfig(64, 64, 1, num_warps=4, num_stages=3),  # mlp gate_up
    (5120, 17408): GemmConfig(64, 256, 1, num_warps=4, num_stages=4, tma=True),  # mlp down
    (248320, 5120): GemmConfig(128, 128, 1, num_warps=4, num_stages=4),  # lm_head
}

PREFETCH_FILLS = 1
"""EARLY PDL: how many pipeline fills (num_stages x block_k columns) of each weight row a GEMM
prefetches into L2 while the row kernel before it runs. One is best: two gave 0.97x and four
0.92x the decode rate on an H100, the longer prefetch competing with the GEMM's own stream
(bench_spec_gpu.py, docs/PERF.md)."""

# Below this many output tiles, K is split so that about this many programs stream the weight
# (the sweep found no split worth it above ~80 tiles on 132 SMs).
_MIN_PROGRAMS = 64
_MIN_K_PER_SPLIT = 1024


def _heuristic_config(n: int, k: int, dtype: torch.dtype) -> GemmConfig:
    block_k = 128 if dtype != torch.float32 else 32
    block_n = 64 if dtype != torch.float32 else 32
    while block_k > 16 and k % block_k:
        block_k //= 2
    tiles = triton.cdiv(n, block_n)
    split = 1
    while (
        tiles * split < _MIN_PROGRAMS
        and k % (2 * split * block_k) == 0
        and k // (2 * split) >= _MIN_K_PER_SPLIT
    ):
        split *= 2
    return GemmConfig(block_n=block_n, block_k=block_k, split_k=split)


def gemm_config(n: int, k: int, dtype: torch.dtype) -> GemmConfig:
    """The one launch configuration used for every M with this weight shape and dtype."""
    if dtype == torch.bfloat16 and (n, k) in TUNED_BF16:
        return TUNED_BF16[(n, k)]
    return _heuristic_config(n, k, dtype)


@triton.jit
def _x_tile(
    x_src,
    p1_ptr,
    p2_ptr,
    offs_m,
    m_mask,
    kk,
    offs_k,
    K,
    stride_xm,
    stride_p1m,
    stride_p1h,
    eps,
    out_dtype: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    X_TMA: tl.constexpr,
    PROLOGUE: tl.constexpr,
    HEAD: tl.constexpr,
):
    """Columns kk..kk+BLOCK_K of the GEMM's x operand: loaded, or computed by the prologue from
    the op before the GEMM in fp32 and rounded once to the output's dtype, with that op's row
    kernel's arithmetic (`Prologue`). Rows beyond M are zeros."""
    if X_TMA:
        xt = x_src.load([tl.program_id(0) * BLOCK_M, kk])
    else:
        cols = kk + offs_k
        rows = offs_m[:, None] * stride_xm
        xt = tl.load(x_src + rows + cols[None, :], mask=m_mask, other=0.0)
        if PROLOGUE == 1:  # SwiGLU: x holds [gate | up]; silu(gate) * up
            g = xt.to(tl.float32)
            up = tl.load(x_src + rows + (K + cols)[None, :], mask=m_mask, other=0.0)
            xt = (g / (1.0 + tl.exp(-g)) * up.to(tl.float32)).to(out_dtype)
        elif PROLOGUE == 2:  # the attention output gate: x * sigmoid(gate), gate in head rows
            at = offs_m[:, None] * stride_p1m + (cols // HEAD * stride_p1h + cols % HEAD)[None, :]
            g = tl.load(p1_ptr + at, mask=m_mask, other=0.0).to(tl.float32)
            xt = (xt.to(tl.float32) / (1.0 + tl.exp(-g))).to(out_dtype)
        elif PROLOGUE == 3:  # GDN's gated norm of one head (BLOCK_K == HEAD): w*rmsnorm(x)*silu(z)
            at = offs_m[:, None] * stride_p1m + (kk // HEAD) * stride_p1h + offs_k[None, :]
            z = tl.load(p1_ptr + at, mask=m_mask, other=0.0).to(tl.float32)
            w = tl.load(p2_ptr + offs_k).to(tl.float32)
            x = xt.to(tl.float32)
            y = x / tl.sqrt(tl.sum(x * x, axis=1) / HEAD + eps)[:, None]
            xt = (y * w[None, :] * (z / (1.0 + tl.exp(-z)))).to(out_dtype)
    return xt


@triton.jit
def _store_out(out_ptr, acc, offs_m, m_mask, pid_n, N, BLOCK_N: tl.constexpr, SWIGLU: tl.constexpr):
    """Store the fp32 tile, rounded once to the output's dtype. SWIGLU: the tile's first half
    of columns are gate rows of the weight and its second half the matching up rows (`_w_rows`);
    store `silu(gate) * up` [.., N/2] from the rounded values with `swiglu_rows`' arithmetic,
    so the bits are those of the GEMM followed by that kernel."""
    dtype = out_ptr.dtype.element_ty
    if SWIGLU:
        half: tl.constexpr = BLOCK_N // 2
        gate, up = tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, half)), (0, 2, 1)))
        gate, up = gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)
        cols = pid_n * half + tl.arange(0, half)
        mask = m_mask & (cols[None, :] < N // 2)
        y = silu(gate) * up
        tl.store(out_ptr + offs_m[:, None] * (N // 2) + cols[None, :], y.to(dtype), mask=mask)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = m_mask & (offs_n[None, :] < N)
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(dtype), mask=mask)


@triton.jit
def _w_rows(pid_n, N, BLOCK_N: tl.constexpr, SWIGLU: tl.constexpr):
    """(The weight rows of output tile pid_n, which of them exist). SWIGLU (w = [gate | up]):
    BLOCK_N/2 gate rows, then the up rows of the same channels."""
    j = tl.arange(0, BLOCK_N)
    if SWIGLU:
        channel = pid_n * (BLOCK_N // 2) + j % (BLOCK_N // 2)
        return channel + (j // (BLOCK_N // 2)) * (N // 2), channel < N // 2
    else:
        rows = pid_n * BLOCK_N + j
        return rows, rows < N


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_src,
    w_src,
    w_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    p1_ptr,
    p2_ptr,
    M,
    N,
    K_PER_SPLIT,
    stride_xm,
    stride_wn,
    stride_p1m,
    stride_p1h,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    X_TMA: tl.constexpr,
    W_TMA: tl.constexpr,
    PROLOGUE: tl.constexpr,
    HEAD: tl.constexpr,
    SWIGLU: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_BYTES: tl.constexpr,
):
    # M tiles vary fastest: the programs that read one weight tile for different rows run side
    # by side, so a batch of many rows streams the weight from DRAM about once (L2 serves the
    # rest). The launch order never reaches a program's arithmetic.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n, n_valid = _w_rows(pid_n, N, BLOCK_N, SWIGLU)
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_s * K_PER_SPLIT
    if PREFETCH_BYTES:  # EARLY PDL: launched while the row kernel before runs; weights are ready
        w_rows = w_ptr + tl.minimum(offs_n, N - 1) * stride_wn + k_start
        prefetch_rows_to_l2(w_rows, tl.full([BLOCK_N], PREFETCH_BYTES, tl.int32))
    wait_for_predecessor(PDL)
    m_mask = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        xt = _x_tile(
            x_src, p1_ptr, p2_ptr, offs_m, m_mask, kk, offs_k, K_PER_SPLIT * SPLIT_K, stride_xm,
            stride_p1m, stride_p1h, eps, out_ptr.dtype.element_ty, BLOCK_M, BLOCK_K, X_TMA,
            PROLOGUE, HEAD,
        )  # fmt: skip
        if W_TMA:
            wt = w_src.load([pid_n * BLOCK_N, kk])
        else:
            w_ptrs = w_src + offs_n[:, None] * stride_wn + (kk + offs_k)[None, :]
            if EVEN_N:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
                wt = tl.load(w_ptrs)
            else:
                wt = tl.load(w_ptrs, mask=n_valid[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, tl.trans(wt), acc)
    let_successor_launch(PDL)
    if SPLIT_K == 1:
        _store_out(out_ptr, acc, offs_m, m_mask, pid_n, N, BLOCK_N, SWIGLU)
    else:  # partials [SPLIT_K, M, tiles * BLOCK_N] in tile order, whatever rows a tile reads
        width = tl.num_programs(1) * BLOCK_N
        tile = offs_m[:, None] * width + (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
        mask = m_mask & n_valid[None, :]
        group = pid_m * tl.num_programs(1) + pid_n
        last, total = sum_splits_in_order(
            part_ptr, ticket_ptr, acc, tile, mask, group, M * width, SPLIT_K
        )
        if last:
            _store_out(out_ptr, total, offs_m, m_mask, pid_n, N, BLOCK_N, SWIGLU)


@dataclass(frozen=True)
class SwiGLU:
    """The operand is `silu(gate) * up` of x = [gate | up] rows [M, 2K]: `swiglu_rows` inside
    the down projection's operand loads (one launch fewer per MLP)."""

    code: ClassVar[int] = 1

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_rows(x)


@dataclass(frozen=True)
class SigmoidGate:
    """The operand is `x * sigmoid(gate)`, gate [M, H, D] head rows with any row and head
    strides: `sigmoid_gate_rows` (gated attention's output gate) inside o_proj's loads."""

    gate: torch.Tensor
    code: ClassVar[int] = 2

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return sigmoid_gate_rows(x.view(self.gate.shape), self.gate).view(x.shape)


@dataclass(frozen=True)
class GatedRmsNorm:
    """The operand is `weight * rmsnorm(x) * silu(z)` per head of width D, z [M, H, D]:
    `gated_rms_norm_rows` (GDN's output norm) inside out_proj's loads. A K tile is one head,
    whose norm is reduced inside the tile: a shape fixed by D, so M never reaches it."""

    z: torch.Tensor
    weight: torch.Tensor
    eps: float
    code: ClassVar[int] = 3

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        out = gated_rms_norm_rows(x.view(self.z.shape), self.z, self.weight, self.eps)
        return out.view(x.shape)


Prologue = SwiGLU | SigmoidGate | GatedRmsNorm
"""The row op before a GEMM, computed in the GEMM's x-operand loads instead of its own launch."""


def _unsupported_reason(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why valid F.linear inputs cannot take the Triton path (None: they can)."""
    if x.dtype not in _SUPPORTED_DTYPES:
        return f"dtype {x.dtype} not supported (bf16, fp16, fp32 are)"
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"device {x.device.type} without TRITON_INTERPRET=1"
    if w.shape[1] % 16:
        return f"K={w.shape[1]} is not a multiple of 16"
    return None


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"matmul_batch_invariant: {reason}; using torch F.linear, which is not batch-invariant",
            RuntimeWarning,
            stacklevel=3,
        )


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with a 16-byte aligned start, as the tensor copy engine needs."""
    if not t.is_contiguous() or t.data_ptr() % 16:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _operand_width(x: torch.Tensor, prologue: Prologue | None) -> int:
    return x.shape[-1] // 2 if isinstance(prologue, SwiGLU) else x.shape[-1]


def _head_config(cfg: GemmConfig, head: int, k: int) -> GemmConfig:
    """`cfg` with one head per K tile (the gated norm reduces a head inside its tile)."""
    split = cfg.split_k if k % (cfg.split_k * head) == 0 else 1
    return replace(cfg, block_k=head, split_k=split, tma=False)


def matmul_batch_invariant(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    prologue: Prologue | None = None,
    swiglu_out: bool = False,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """``F.linear(x, w)`` whose every output row is bit-identical whatever M and the other rows are.

    With a `prologue`, the operand is `prologue.rows(x)`, computed per row inside the tile loads
    with that row kernel's arithmetic: still one configuration per (N, K) and per-row work in
    tiles of fixed shape, so still batch-invariant. With `swiglu_out` (w = [gate | up], the MLP's
    gate_up), the result is `swiglu_rows` of the product, computed in the epilogue: the same
    tiles and configuration, the bits of the GEMM followed by that kernel, one launch fewer.
    ``config`` overrides the (N, K) table; only benchmarks use it.
    """
    k_in = _operand_width(x, prologue)
    if w.dim() != 2 or k_in != w.shape[1] or x.dtype != w.dtype or x.device != w.device:
        return F.linear(x if prologue is None else prologue.rows(x), w)  # F.linear's own error
    reason = _unsupported_reason(x, w)
    if reason is not None:
        _warn_once(reason)
        y = F.linear(x if prologue is None else prologue.rows(x), w)
        if not swiglu_out:
            return y
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    lead_shape = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    x2 = _aligned(x2) if prologue is None else x2 if x2.stride(-1) == 1 else x2.contiguous()
    cfg = config or gemm_config(w.shape[0], k_in, w.dtype)
    out = launch(x2, _aligned(w), cfg, prologue, swiglu_out)
    return out.reshape(*lead_shape, out.shape[-1])


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    cfg: GemmConfig,
    prologue: Prologue | None,
    swiglu_out: bool = False,
) -> torch.Tensor:
    """The kernel launch for rows x [M, K] (or [M, 2K] for SwiGLU) and a contiguous weight w."""
    m, (n, k) = x.shape[0], w.shape
    if swiglu_out and (prologue is not None or cfg.tma or n % 2):
        raise ValueError("the SwiGLU epilogue takes a [gate | up] weight by pointer loads alone")
    n_out, tile_cols = (n // 2, cfg.block_n // 2) if swiglu_out else (n, cfg.block_n)
    p1 = p2 = w  # unused pointers
    stride_p1, eps, head = (0, 0), 0.0, 1
    if isinstance(prologue, SigmoidGate | GatedRmsNorm):
        z = prologue.gate if isinstance(prologue, SigmoidGate) else prologue.z
        head = z.shape[-1]
        if z.shape[0] != m or z.shape[1] * head != k or z.stride(-1) != 1:
            raise ValueError(f"prologue rows {tuple(z.shape)} do not pair with x {tuple(x.shape)}")
        p1, stride_p1 = z, (z.stride(0), z.stride(1))
    if isinstance(prologue, GatedRmsNorm):
        p2, eps = prologue.weight.contiguous(), prologue.eps
        cfg = _head_config(cfg, head, k)
    if k % (cfg.split_k * cfg.block_k):
        raise ValueError(f"config {cfg} does not divide K={k}")
    out = torch.empty((m, n_out), device=x.device, dtype=x.dtype)
    if m == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n_out, tile_cols), cfg.split_k)
    if cfg.split_k == 1:
        partials, tickets = out, out  # unused
    else:
        shape = (cfg.split_k, m, grid[1] * cfg.block_n)
        partials = torch.empty(shape, device=x.device, dtype=torch.float32)
        tickets = counters("gemm", x.device, grid[0] * grid[1])
    x_tma = cfg.tma and prologue is None
    x_src = TensorDescriptor.from_tensor(x, [BLOCK_M, cfg.block_k]) if x_tma else x
    w_src = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]) if cfg.tma else w
    pdl_mode = pdl.use_pdl(x.device)
    prefetch = 0  # EARLY PDL: each weight row's first pipeline fill, prefetched while it waits
    if pdl_mode == pdl.EARLY:
        fill = PREFETCH_FILLS * cfg.num_stages * cfg.block_k
        prefetch = min(fill, k // cfg.split_k) * w.element_size()
    _gemm_kernel[grid](
        x_src, w_src, w, out, partials, tickets, p1, p2, m, n, k // cfg.split_k, x.stride(0), k,
        *stride_p1, eps, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k, EVEN_N=n_out % tile_cols == 0, X_TMA=x_tma, W_TMA=cfg.tma,
        PROLOGUE=0 if prologue is None else prologue.code, HEAD=head, SWIGLU=swiglu_out,
        IEEE=x.dtype == torch.float32, PDL=pdl_mode, PREFETCH_BYTES=prefetch,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl_mode > 0,
    )  # fmt: skip
    return out
