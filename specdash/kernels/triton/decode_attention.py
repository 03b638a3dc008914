"""Split-KV decode attention with a fixed split size, so verify rows equal decode rows bit for bit.

Why: a verify step must produce, for its row i, exactly the bits decode produces for that token
at context length L+1+i. So verify does not use a multi-row extend kernel: its rows are issued as
decode rows (after their K/V are written to the cache) through this one kernel. Each row is split
into KV chunks of a fixed number of tokens S ([0,S), [S,2S), ...; never a fixed split *count*,
which would move boundaries as L grows); each split does an online softmax over BLOCK_T-token
blocks in ascending order, and the splits are merged by an LSE-combine in split order.
GQA: query head h reads kv head h // (Hq // Hkv). One program computes a TILE_M-row MMA tile: the
query group's heads for up to TILE_M // group consecutive rows of one sequence, each tile row with
its own length, mask and softmax state. A decode launch fills one row of the tile, a verify launch
several; the kernel and its constants are the same, MMA rows are independent, and the blocks a
longer row adds past a shorter row's end leave the shorter row's state exactly unchanged
(alpha = exp(0) = 1, p = 0). The one thing that can differ is the sign of an exactly-zero
accumulator element (0 * v is -0 for negative v), which no later nonzero sum can see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specdash.kernels.triton import pdl
from specdash.kernels.triton.pdl import start_after_predecessor


@dataclass(frozen=True)
class AttentionConfig:
    """The one launch configuration of the split kernel: pinned, the same for every row count.

    Chosen by benchmarks/bench_attention_gdn.py --attention-sweep on an H200 (docs/PERF.md).
    """

    split: int = 256  # KV tokens per split (a multiple of block_t): sets decode's parallelism
    block_t: int = 64  # KV tokens per online-softmax block inside a split
    tile_m: int = 32  # MMA rows per program: GQA-group heads x rows of one sequence
    num_warps: int = 4
    num_stages: int = 2


CONFIG = AttentionConfig()


@triton.jit(do_not_specialize=["max_splits", "rows_per_seq"])
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    seq_lens_ptr,
    slot_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    scale,
    max_splits,
    rows_per_seq,
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
    TILE_ROWS: tl.constexpr,
    TILE_M: tl.constexpr,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
    HAS_CACHE_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    # tile row i = (row, query head of the GQA group): up to TILE_ROWS consecutive rows of one
    # sequence share each K/V block; every tile row keeps its own length, mask and softmax state
    pack = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    packs_per_seq = tl.cdiv(rows_per_seq, TILE_ROWS)
    seq = pack // packs_per_seq
    offs_i = tl.arange(0, TILE_M)
    offs_d = tl.arange(0, D)
    tile_row = offs_i // GROUP
    step = (pack % packs_per_seq) * TILE_ROWS + tile_row
    valid = (tile_row < TILE_ROWS) & (step < rows_per_seq)
    row = seq * rows_per_seq + step
    heads = kv_head * GROUP + offs_i % GROUP
    q = tl.load(
        q_ptr + row[:, None] * stride_qr + heads[:, None] * stride_qh + offs_d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, tl.load(seq_lens_ptr + row, mask=valid, other=0))
    # with a pool, sequence `seq` keeps its K/V in cache slot slots[seq]
    if HAS_CACHE_SLOTS:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
        cache = tl.load(slot_ptr + seq).to(tl.int64)
    else:
        cache = seq.to(tl.int64)
    k_base = k_ptr + cache * stride_kb + kv_head * stride_kh
    v_base = v_ptr + cache * stride_vb + kv_head * stride_vh
    m_i = tl.full((TILE_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((TILE_M,), dtype=tl.float32)
    acc = tl.zeros((TILE_M, D), dtype=tl.float32)
    block_end = tl.max(end)
    for t0 in range(start, block_end, BLOCK_T):
        # a block past a tile row's end is an exact identity for it: alpha = 1, p = 0
        offs_t = t0 + tl.arange(0, BLOCK_T)
        t_mask = offs_t < block_end
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
        s = tl.where(offs_t[None, :] < end[:, None], s * scale, float("-inf"))
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
    tl.store(m_ptr + part, m_i, mask=valid)
    tl.store(l_ptr + part, l_i, mask=valid)
    tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=valid[:, None])


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
    PDL: tl.constexpr,
):
    """LSE-combine of a row's splits in split order 0, 1, ...: the same order for every row."""
    start_after_predecessor(PDL)
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


def _attention_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    rows_per_seq: int,
    scale: float,
    split_size: int | None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows q[B*T,Hq,D] (T = rows_per_seq per sequence, sequence-major), row r over cache batch
    r // T (cache slot slots[r // T] with `slots`), first seq_lens[r] tokens."""
    rows, hq, d = q.shape
    _, hkv, lmax, dk = k_cache.shape
    bsz = k_cache.shape[0] if slots is None else slots.shape[0]
    if dk != d or v_cache.shape != k_cache.shape or rows != bsz * rows_per_seq:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d} must be a power of two >= 16")
    cfg = CONFIG
    split_size = split_size or cfg.split
    if split_size % cfg.block_t:
        raise ValueError(f"split_size {split_size} must be a multiple of {cfg.block_t}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last dimension")
    group = hq // hkv
    tile_m = max(cfg.tile_m, triton.next_power_of_2(group))
    tile_rows = tile_m // group
    max_splits = triton.cdiv(lmax, split_size)
    dev = q.device
    m = torch.empty((rows, hq, max_splits), device=dev, dtype=torch.float32)
    lse_sum = torch.empty_like(m)
    acc = torch.empty((rows, hq, max_splits, d), device=dev, dtype=torch.float32)
    seq_lens = seq_lens.to(device=dev, dtype=torch.int32)
    pdl_mode = pdl.use_pdl(dev)
    _split_kernel[(bsz * triton.cdiv(rows_per_seq, tile_rows), hkv, max_splits)](
        q,
        k_cache,
        v_cache,
        seq_lens,
        seq_lens if slots is None else slots,
        m,
        lse_sum,
        acc,
        float(scale),
        max_splits,
        rows_per_seq,
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
        TILE_ROWS=tile_rows,
        TILE_M=tile_m,
        D=d,
        SPLIT=split_size,
        BLOCK_T=cfg.block_t,
        IEEE=q.dtype == torch.float32,
        HAS_CACHE_SLOTS=slots is not None,
        PDL=pdl_mode,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl_mode > 0,
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
        PDL=pdl_mode,
        launch_pdl=pdl_mode > 0,
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_size: int | None = None,
) -> torch.Tensor:
    """One decode row per sequence: q[B,Hq,D] over k/v_cache[B,Hkv,Lmax,D][:, :, :seq_lens[b]].

    No host sync: the grid covers Lmax, and programs past a row's length do no work.
    """
    return _attention_rows(q, k_cache, v_cache, seq_lens, 1, scale, split_size)


def verify_as_decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens_before: torch.Tensor,
    scale: float,
    split_size: int | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify attention q[B,T,Hq,D] as B*T decode rows of lengths L+1, ..., L+T.

    Sequence b's cache is k/v_cache[b], or with `slots` ([B] int) k/v_cache[slots[b]] of a pool
    of slots, so a batch of sequences anywhere in the pool is one launch; the arithmetic is the
    same either way. The K/V of the T tokens must already be in the cache at positions
    L..L+T-1. Up to
    AttentionConfig.tile_m // GQA-group consecutive rows share each K/V block load; a block past
    a row's own end leaves that row's state exactly unchanged (alpha = 1, p = 0).
    """
    b, t, hq, d = q.shape
    steps = torch.arange(1, t + 1, device=q.device, dtype=torch.int32)
    lens = (seq_lens_before.to(device=q.device, dtype=torch.int32)[:, None] + steps).reshape(-1)
    q = q.reshape(b * t, hq, d)
    out = _attention_rows(q, k_cache, v_cache, lens, t, scale, split_size, slots)
    return out.reshape(b, t, hq, d)
