"""Split-KV decode attention with a fixed split size, so verify rows equal decode rows bit for bit.

Why: a verify step must produce, for its row i, exactly the bits decode produces for that token
at context length L+1+i. So verify does not use a multi-row extend kernel: its rows are issued as
decode rows (after their K/V are written to the cache) through this one kernel. Each row is split
into KV chunks of a fixed number of tokens S ([0,S), [S,2S), ...; never a fixed split *count*,
which would move boundaries as L grows); each split does an online softmax over BLOCK_T-token
blocks in ascending order, and the splits are merged by an LSE-combine in split order. Nothing in a
row's arithmetic depends on the other rows, on how many rows share the launch, or on the grid.
GQA: query head h reads kv head h // (Hq // Hkv); one program serves the whole query group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class AttentionConfig:
    """The one launch configuration of the split kernel: pinned, the same for every row count.

    Chosen by benchmarks/bench_attention_gdn.py --attention-sweep on an H200 (docs/PERF.md).
    """

    block_t: int = 64  # KV tokens per online-softmax block inside a split
    num_warps: int = 4
    num_stages: int = 2


CONFIG = AttentionConfig()


@triton.jit(do_not_specialize=["max_splits"])
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    seq_lens_ptr,
    kv_index_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    scale,
    max_splits,
    stride_qr,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + row)
    kv_b = tl.load(kv_index_ptr + row).to(tl.int64)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, D)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    q = tl.load(
        q_ptr + row * stride_qr + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )
    k_base = k_ptr + kv_b * stride_kb + kv_head * stride_kh
    v_base = v_ptr + kv_b * stride_vb + kv_head * stride_vh
    m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, D), dtype=tl.float32)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, seq_len)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        t_mask = offs_t < end
        kt = tl.load(
            k_base + offs_t[:, None] * stride_kt + offs_d[None, :], mask=t_mask[:, None], other=0.0
        )
        vt = tl.load(
            v_base + offs_t[:, None] * stride_vt + offs_d[None, :], mask=t_mask[:, None], other=0.0
        )
        if IEEE:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            s = tl.dot(q, tl.trans(kt), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kt))
        s = tl.where(t_mask[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m_i = m_new
    part = (row * HQ + heads) * max_splits + split
    tl.store(m_ptr + part, m_i, mask=g_mask)
    tl.store(l_ptr + part, l_i, mask=g_mask)
    tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=g_mask[:, None])


@triton.jit(do_not_specialize=["max_splits"])
def _merge_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    seq_lens_ptr,
    out_ptr,
    max_splits,
    stride_or,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """LSE-combine of a row's splits in split order 0, 1, ...: the same order for every row."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    n_splits = tl.cdiv(tl.load(seq_lens_ptr + row), SPLIT)
    base = (row * HQ + head) * max_splits
    offs_d = tl.arange(0, D)
    m_max = tl.load(m_ptr + base)
    for s in range(1, n_splits):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + s))
    denom = tl.zeros((1,), dtype=tl.float32)
    num = tl.zeros((D,), dtype=tl.float32)
    for s in range(0, n_splits):
        w = tl.exp(tl.load(m_ptr + base + s) - m_max)
        denom += w * tl.load(l_ptr + base + s)
        num += w * tl.load(acc_ptr + (base + s) * D + offs_d)
    out = num / denom
    out_ptrs = out_ptr + row * stride_or + head * stride_oh + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty))


def _decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_index: torch.Tensor,
    scale: float,
    split_size: int,
) -> torch.Tensor:
    """Attention of rows q[R,Hq,D] over cache batch kv_index[R], first seq_lens[R] tokens."""
    rows, hq, d = q.shape
    _, hkv, lmax, dk = k_cache.shape
    if dk != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d} must be a power of two >= 16")
    cfg = CONFIG
    if split_size % cfg.block_t:
        raise ValueError(f"split_size {split_size} must be a multiple of {cfg.block_t}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last dimension")
    group = hq // hkv
    max_splits = triton.cdiv(lmax, split_size)
    dev = q.device
    m = torch.empty((rows, hq, max_splits), device=dev, dtype=torch.float32)
    lse_sum = torch.empty_like(m)
    acc = torch.empty((rows, hq, max_splits, d), device=dev, dtype=torch.float32)
    seq_lens = seq_lens.to(device=dev, dtype=torch.int32)
    kv_index = kv_index.to(device=dev, dtype=torch.int32)
    _split_kernel[(rows, hkv, max_splits)](
        q,
        k_cache,
        v_cache,
        seq_lens,
        kv_index,
        m,
        lse_sum,
        acc,
        float(scale),
        max_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        HQ=hq,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        D=d,
        SPLIT=split_size,
        BLOCK_T=cfg.block_t,
        IEEE=q.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    out = torch.empty_like(q)
    _merge_kernel[(rows, hq)](
        m,
        lse_sum,
        acc,
        seq_lens,
        out,
        max_splits,
        out.stride(0),
        out.stride(1),
        HQ=hq,
        D=d,
        SPLIT=split_size,
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_size: int = 256,
) -> torch.Tensor:
    """One decode row per sequence: q[B,Hq,D] over k/v_cache[B,Hkv,Lmax,D][:, :, :seq_lens[b]].

    No host sync: the grid covers Lmax, and programs past a row's length do no work.
    """
    index = torch.arange(q.shape[0], device=q.device, dtype=torch.int32)
    return _decode_rows(q, k_cache, v_cache, seq_lens, index, scale, split_size)


def verify_as_decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens_before: torch.Tensor,
    scale: float,
    split_size: int = 256,
) -> torch.Tensor:
    """Verify attention q[B,T,Hq,D] as B*T decode rows of lengths L+1, ..., L+T.

    The K/V of the T tokens must already be in the cache at positions L..L+T-1.
    """
    b, t, hq, d = q.shape
    steps = torch.arange(1, t + 1, device=q.device, dtype=torch.int32)
    lens = (seq_lens_before.to(device=q.device, dtype=torch.int32)[:, None] + steps).reshape(-1)
    index = torch.arange(b, device=q.device, dtype=torch.int32).repeat_interleave(t)
    rows = q.reshape(b * t, hq, d)
    out = _decode_rows(rows, k_cache, v_cache, lens, index, scale, split_size)
    return out.reshape(b, t, hq, d)
