"""Batch-invariant GEMM for decode and verify: ``x @ w.T`` with an M-independent reduction order.

Why: a verify step runs k+1 rows through the same weights that decode runs one row through, and
the speculative output is only bit-exact if every output element goes through the identical
sequence of floating-point operations in both. So the launch configuration is a function of
(N, K, dtype) alone: BLOCK_M is pinned to 16 (one MMA instruction shape whatever M is), each
program walks its K range sequentially, and a split-K, where used, is fixed per (N, K) with its fp32
partials summed in split order by a second kernel. Rows beyond M are masked loads of zeros, which
cannot change the other rows' bits because MMA rows are independent.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

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


# Measured on an H200 by benchmarks/bench_gemm.py --sweep (see docs/PERF.md): (N, K) -> config
# for bf16 weights. Shapes not listed use _heuristic_config.
TUNED_BF16: dict[tuple[int, int], GemmConfig] = {}

# Work items (N tiles x K splits) wanted in flight: a few per SM of a 132-SM H200.
_TARGET_ITEMS = 528
_MIN_K_PER_SPLIT = 1024


def _heuristic_config(n: int, k: int, dtype: torch.dtype) -> GemmConfig:
    block_k = 128 if dtype != torch.float32 else 32
    block_n = 64 if dtype != torch.float32 else 32
    while block_k > 16 and k % block_k:
        block_k //= 2
    tiles = triton.cdiv(n, block_n)
    split = 1
    while (
        tiles * split < _TARGET_ITEMS
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


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K_PER_SPLIT,
    stride_xm,
    stride_wn,
    stride_om,
    stride_os,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_s * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    m_mask = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K_PER_SPLIT, BLOCK_K):
        xt = tl.load(x_ptrs, mask=m_mask, other=0.0)
        if EVEN_N:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            wt = tl.load(w_ptrs)
        else:
            wt = tl.load(w_ptrs, mask=offs_n[:, None] < N, other=0.0)
        if IEEE:
            acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, tl.trans(wt), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask & (offs_n[None, :] < N))


@triton.jit
def _splitk_sum_kernel(part_ptr, out_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """Sums the fp32 partials in split order 0, 1, ..., SPLIT_K-1: a fixed order for every M."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


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


def matmul_batch_invariant(
    x: torch.Tensor, w: torch.Tensor, *, config: GemmConfig | None = None
) -> torch.Tensor:
    """``F.linear(x, w)`` whose every output row is bit-identical whatever M and the other rows are.

    ``config`` overrides the (N, K) table; only benchmarks use it.
    """
    if w.dim() != 2 or x.shape[-1] != w.shape[1] or x.dtype != w.dtype or x.device != w.device:
        return F.linear(x, w)  # invalid inputs: F.linear raises its own clear error
    reason = _unsupported_reason(x, w)
    if reason is not None:
        _warn_once(reason)
        return F.linear(x, w)
    lead_shape = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != x2.shape[1]):
        x2 = x2.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    m, k = x2.shape
    n = w.shape[0]
    cfg = config or gemm_config(n, k, w.dtype)
    if k % (cfg.split_k * cfg.block_k):
        raise ValueError(f"config {cfg} does not divide K={k}")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return out.reshape(*lead_shape, n)
    k_per_split = k // cfg.split_k
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k, triton.cdiv(m, BLOCK_M))
    if cfg.split_k == 1:
        target, stride_os = out, 0
    else:
        target = torch.empty((cfg.split_k, m, n), device=x.device, dtype=torch.float32)
        stride_os = m * n
    _gemm_kernel[grid](
        x2,
        w,
        target,
        m,
        n,
        k_per_split,
        x2.stride(0),
        w.stride(0),
        n,
        stride_os,
        BLOCK_M=BLOCK_M,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_N=n % cfg.block_n == 0,
        IEEE=x.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1:
        block = 1024
        _splitk_sum_kernel[(triton.cdiv(m * n, block),)](
            target, out, m * n, SPLIT_K=cfg.split_k, BLOCK=block
        )
    return out.reshape(*lead_shape, n)
