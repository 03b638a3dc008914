"""Causal prefill attention for Hopper (sm_90): one chunk's queries over the cached keys.

Why: at 128k tokens the prefill spends half its time in attention, and torch's FlashAttention-2
reaches ~290 TFLOP/s there on an H200 (head dim 256, docs/PERF.md). This is a FlashAttention
forward in Triton, shaped for that case:

* Rows r of the chunk sit at positions start + r and see keys 0..start + r ("lower-right"
  causal; start == 0 is plain causal). A program's keys below the first row's position are seen
  by all its rows: that bulk loop carries no mask; only the last ~BLOCK_M keys go through a
  separate masked loop.
* Online softmax in fp32 with exp2: scale * log2(e) is applied to the fp32 scores in the same
  FMA that subtracts the running max (folding it into a bf16 q would round every q element).
* BLOCK_M = 128 rows with 8 warps (two warpgroups, 64 rows each) and BLOCK_N = 64: at head dim
  256 the fp32 output tile alone is 128 registers a thread; 128 x 64 takes 237-255 of the 255
  (Triton 3.9-3.6), wider key blocks leave no room and no shared memory for a second stage.
* K/V blocks come through TMA descriptors (the bulk tensor copy engine), pipelined num_stages
  deep; shared memory (q 64 KiB + 64 KiB of K/V per stage) caps the depth at 2 for 128 x 64.
* GQA: query head h reads kv head h // group; the programs of one kv head are adjacent in the
  grid, so they stream the same K/V blocks through L2 at about the same time.
* The grid launches the row blocks with the most keys first (the last rows of the chunk), so
  the short blocks of a causal first chunk fill the tail instead of the long ones.
* No warp specialization: Triton's (3.6, 3.9) ignores `tl.range(warp_specialize=True)` on sm_90
  at 8 warps and aborts in the compiler at 4.

Not an exactness path: the speculative and shadow runs share the prefill's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class PrefillAttentionConfig:
    """Launch parameters; CANDIDATES are swept by benchmarks/bench_prefill_attention.py."""

    block_m: int = 128  # query rows per program
    block_n: int = 64  # keys per online-softmax step
    num_warps: int = 8
    num_stages: int = 2  # software-pipeline depth of the K/V loads
    tma: bool = True  # K/V through TMA descriptors (sm_90+); else pointer loads (cp.async)


DEFAULT = PrefillAttentionConfig()
# Each compiles for sm_90 at head dim 256 within 255 registers and the 227 KiB of shared memory
# (Triton 3.6 and 3.9; only 128 x 128 spills, 24 bytes on 3.6); block_m = 64 runs two programs
# per SM, so one's softmax overlaps the other's MMAs.
CANDIDATES = (
    DEFAULT,
    PrefillAttentionConfig(tma=False),
    PrefillAttentionConfig(block_n=32, num_stages=4),
    PrefillAttentionConfig(block_n=128, num_stages=1),
    PrefillAttentionConfig(block_m=64, block_n=32, num_warps=4),
    PrefillAttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=1),
)


@triton.jit
def _kv_block(
    src,
    off,
    stride_n,
    kv_head,
    n0,
    keys,
    n_keys,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    TMA: tl.constexpr,
):
    """Keys (or values) n0..n0+BLOCK_N of one kv head, [BLOCK_N, HEAD_DIM]: a TMA tile, or
    pointer loads, masked to zeros past n_keys on the diagonal."""
    if TMA:
        block = src.load([kv_head, n0, 0]).reshape([BLOCK_N, HEAD_DIM])
    else:
        ptrs = src + off + keys[:, None] * stride_n + tl.arange(0, HEAD_DIM)[None, :]
        if MASKED:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            block = tl.load(ptrs, mask=keys[:, None] < n_keys, other=0.0)
        else:
            block = tl.load(ptrs)
    return block


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    k_src,
    v_src,
    kv_head,
    kv_off_k,
    kv_off_v,
    lo,
    hi,
    n_keys,
    q_pos,
    stride_kn,
    stride_vn,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    TMA: tl.constexpr,
):
    """Online softmax over keys lo..hi (BLOCK_N at a time); MASKED: the causal diagonal, whose
    last block may run past the n_keys keys (zeros there, and masked)."""
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        keys = n0 + offs_n
        k = _kv_block(k_src, kv_off_k, stride_kn, kv_head, n0, keys, n_keys, HEAD_DIM, BLOCK_N,
                      MASKED, TMA)  # fmt: skip
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            qk = tl.where(q_pos[:, None] >= keys[None, :], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = _kv_block(v_src, kv_off_v, stride_vn, kv_head, n0, keys, n_keys, HEAD_DIM, BLOCK_N,
                      MASKED, TMA)  # fmt: skip
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _prefill_attention_kernel(
    q_ptr,
    k_src,
    v_src,
    out_ptr,
    T,
    start,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kh,
    stride_kn,
    stride_vh,
    stride_vn,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    head = tl.program_id(0)
    m0 = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # most keys first
    kv_head = head // GROUP
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < T
    q_rows = q_ptr + head.to(tl.int64) * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt
    q = tl.load(q_rows + offs_d[None, :], mask=rows, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_off_k = kv_head.to(tl.int64) * stride_kh
    kv_off_v = kv_head.to(tl.int64) * stride_vh
    n_keys = start + T
    q_pos = start + offs_m
    # keys 0..start+m0 are seen by every row of the block: the unmasked bulk, whole blocks
    bulk_end = (start + m0 + 1) // BLOCK_N * BLOCK_N
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, k_src, v_src, kv_head, kv_off_k, kv_off_v, 0, bulk_end, n_keys, q_pos,
        stride_kn, stride_vn, qk_scale, HEAD_DIM, BLOCK_N, False, TMA,
    )  # fmt: skip
    diag_end = start + tl.minimum(m0 + BLOCK_M, T)
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, k_src, v_src, kv_head, kv_off_k, kv_off_v, bulk_end, diag_end, n_keys,
        q_pos, stride_kn, stride_vn, qk_scale, HEAD_DIM, BLOCK_N, True, TMA,
    )  # fmt: skip

    out = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
    o_rows = out_ptr + head.to(tl.int64) * stride_oh + offs_m[:, None].to(tl.int64) * stride_ot
    tl.store(o_rows + offs_d[None, :], out, mask=rows)


def _tma_available(device: torch.device) -> bool:
    """Hopper or later; a CPU tensor runs through the interpreter (or the offline sm_90
    compile, tests/kernels/compile_kernels_sm90.py), which takes descriptors too."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _tma_aligned(cache: torch.Tensor) -> bool:
    """A TMA descriptor needs a 16-byte aligned base and strides."""
    size = cache.element_size()
    return all(
        x % 16 == 0 for x in (cache.data_ptr(), cache.stride(0) * size, cache.stride(1) * size)
    )


def causal_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: int,
    scale: float,
    config: PrefillAttentionConfig = DEFAULT,
) -> torch.Tensor:
    """Rows q [T, Hq, D] at positions start..start+T-1 over keys 0..start+T-1 of the caches
    k, v [Hkv, L, D] (L >= start + T), row r seeing keys up to start + r; [T, Hq, D] in q's
    dtype. GQA: query head h reads kv head h // (Hq // Hkv)."""
    t, hq, d = q.shape
    hkv, cap, dk = k.shape
    if k.shape != v.shape or dk != d or hq % hkv or cap < start + t or start < 0:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, start {start}: "
            "want k, v [Hkv, >= start + T, D] with Hkv dividing Hq"
        )
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"bf16 or fp16 q, k, v of one dtype, not {q.dtype}, {k.dtype}, {v.dtype}")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head dim {d}: a power of two >= 16")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if t == 0:
        return out
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    n = start + t
    tma = config.tma and _tma_available(q.device) and _tma_aligned(k) and _tma_aligned(v)
    if tma:
        block = [1, config.block_n, d]
        k_src, v_src = (
            TensorDescriptor(x, [hkv, n, d], [x.stride(0), x.stride(1), 1], block) for x in (k, v)
        )
    else:
        k_src, v_src = k, v
    grid = (hq, triton.cdiv(t, config.block_m))
    _prefill_attention_kernel[grid](
        q, k_src, v_src, out, t, start, scale * LOG2_E, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), GROUP=hq // hkv,
        HEAD_DIM=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, TMA=tma,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out
