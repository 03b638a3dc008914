"""The attention prologue in one launch: per-head q/k RMSNorm, partial RoPE, K/V into the cache.

Why: in torch this is ~20 small launches per attention layer (two norms, the table gathers,
rotate-half's slices and concatenations, two index_copy's). One program handles one head of
one row with instructions that depend only on the head width, so a verify row's q and cached
k/v equal the decode row's bit for bit. Positions are read on the device (`position[0] + t`),
so a captured CUDA graph stays valid at every length; with cache slots, the rows of several
sequences of a slot pool are one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdash.kernels.triton import pdl
from specdash.kernels.triton.pdl import start_after_predecessor


@triton.jit(do_not_specialize=["rows_per_seq"])
def _qk_norm_rope_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    rows_per_seq,
    stride_row,
    stride_cache_b,
    stride_cache_h,
    eps,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    R: tl.constexpr,
    Q_STRIDE: tl.constexpr,
    ZERO_CENTRED: tl.constexpr,
    HAS_CACHE_SLOTS: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    seq = t // rows_per_seq
    pos = tl.load(pos_ptr + seq) + t % rows_per_seq
    offs = tl.arange(0, D)
    half = R // 2
    partner = tl.where(offs < half, offs + half, tl.where(offs < R, offs - half, offs))
    row = qkv_ptr + t * stride_row
    if h < HQ:
        src = row + h * Q_STRIDE
        w_ptr = q_norm_ptr
    else:
        src = row + HQ * Q_STRIDE + (h - HQ) * D
        w_ptr = k_norm_ptr
    x = tl.load(src + offs).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + offs).to(tl.float32)
    wp = tl.load(w_ptr + partner).to(tl.float32)
    if ZERO_CENTRED:
        w = 1.0 + w
        wp = 1.0 + wp
    y = x * inv * w
    yp = tl.load(src + partner).to(tl.float32) * inv * wp
    rot = offs < R
    cos = tl.load(cos_ptr + pos * R + offs, mask=rot, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * R + offs, mask=rot, other=0.0).to(tl.float32)
    y = tl.where(rot, y * cos + tl.where(offs < half, -yp, yp) * sin, y)
    if h < HQ:
        tl.store(q_out_ptr + (t * HQ + h) * D + offs, y.to(q_out_ptr.dtype.element_ty))
    else:
        if HAS_CACHE_SLOTS:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            cache = tl.load(slot_ptr + seq).to(tl.int64)
        else:
            cache = seq.to(tl.int64)
        dst = cache * stride_cache_b + (h - HQ) * stride_cache_h + pos * D + offs
        tl.store(k_cache_ptr + dst, y.to(k_cache_ptr.dtype.element_ty))
        v = tl.load(row + HQ * Q_STRIDE + HKV * D + (h - HQ) * D + offs)
        tl.store(v_cache_ptr + dst, v)


def qk_norm_rope_rows(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    gated: bool,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    zero_centred: bool,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows qkv [T, Hq*(2 if gated)*D + 2*Hkv*D] at positions position[0]+t: returns normed,
    roped q [T, Hq, D]; writes normed, roped k and raw v into k/v_cache [Hkv, cap, D] at those
    positions. With `gated`, each q head is followed by its D gate columns (left in qkv).
    cos/sin tables: [max positions, R] for the first R (rotary) dims.

    With `slots` ([B] int), the rows are B sequences of T/B rows each: sequence b's rows sit at
    positions position[b]+j and write cache slot slots[b] of pools k/v_cache [S, Hkv, cap, D].
    Each row's arithmetic is the same either way."""
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    r = cos_table.shape[-1]
    q_stride = d * (2 if gated else 1)
    width = num_heads * q_stride + 2 * num_kv_heads * d
    if qkv.shape[1] != width or qkv.stride(-1) != 1 or d & (d - 1) or r % 2 or r > d:
        raise ValueError(f"qkv {tuple(qkv.shape)}: expected width {width}, D={d} pow2, R={r}")
    seqs = 1 if slots is None else slots.shape[0]
    if k_cache.dim() != (3 if slots is None else 4) or t % seqs:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} for {t} rows of {seqs} sequences")
    if k_cache.stride(-1) != 1 or k_cache.stride(-2) != d or v_cache.stride() != k_cache.stride():
        raise ValueError("k/v caches need the [Hkv, cap, D] contiguous layout")
    q = torch.empty((t, num_heads, d), device=qkv.device, dtype=qkv.dtype)
    pdl_mode = pdl.use_pdl(qkv.device)
    _qk_norm_rope_kernel[(t, num_heads + num_kv_heads)](
        qkv,
        q_norm,
        k_norm,
        cos_table,
        sin_table,
        position,
        q,
        k_cache,
        v_cache,
        position if slots is None else slots,
        t // seqs,
        qkv.stride(0),
        0 if slots is None else k_cache.stride(0),
        k_cache.stride(-3),
        eps,
        HQ=num_heads,
        HKV=num_kv_heads,
        D=d,
        R=r,
        Q_STRIDE=q_stride,
        ZERO_CENTRED=zero_centred,
        HAS_CACHE_SLOTS=slots is not None,
        PDL=pdl_mode,
        num_warps=1 if d <= 128 else 2,
        launch_pdl=pdl_mode > 0,
    )
    return q
