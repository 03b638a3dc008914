"""The elementwise chains between GEMMs, one launch each: SwiGLU, the attention output gate and
GDN's causal conv + SiLU.

Why kernels: in torch each is a chain of 4-12 small launches (SiLU alone is neg, exp, add, div),
and on the 27B shape a decode step spent ~4 ms of its ~17 ms in such launches (docs/PERF.md).
Every element is computed by the same instructions wherever it sits in the tensor and however
many rows there are (fp32 inside, one rounding to the output dtype), so a verify row still
equals the decode row bit for bit. Block sizes are fixed constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdash.kernels.triton import pdl
from specdash.kernels.triton.pdl import start_after_predecessor

_BLOCK = 1024


@triton.jit
def silu(x):
    """x * sigmoid(x) in fp32, one expression for every kernel that applies it."""
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _gated_kernel(
    x_ptr,
    g_ptr,
    out_ptr,
    n_cols,
    stride_x,
    group,
    stride_g,
    stride_gi,
    SILU: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    g_row = g_ptr + (row // group) * stride_g + (row % group) * stride_gi
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_row + offs, mask=mask, other=0.0).to(tl.float32)
    if SILU:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
        y = silu(g) * x
    else:
        y = x / (1.0 + tl.exp(-g))
    tl.store(out_ptr + row * n_cols + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _gated(x: torch.Tensor, g: torch.Tensor, silu: bool) -> torch.Tensor:
    """x [M, N] rows; g [M, N] rows, or [M', G, N] head rows (any outer/inner strides)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if g.dim() == 3:
        group, stride_g, stride_gi = g.shape[1], g.stride(0), g.stride(1)
    else:
        group, stride_g, stride_gi = 1, g.stride(0), 0
    if g.shape[-1] != n or g.numel() != x2.numel() or g.stride(-1) != 1:
        raise ValueError(f"x {tuple(x.shape)} and gate {tuple(g.shape)} do not pair up")
    m = x2.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    pdl_mode = pdl.use_pdl(x.device)
    _gated_kernel[(m, triton.cdiv(n, _BLOCK))](
        x2,
        g,
        out,
        n,
        x2.stride(0),
        group,
        stride_g,
        stride_gi,
        SILU=silu,
        BLOCK=_BLOCK,
        PDL=pdl_mode,
        num_warps=4,
        launch_pdl=pdl_mode > 0,
    )
    return out.reshape(x.shape)


def swiglu_rows(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for gate_up = [gate | up] rows [M, 2I] -> [M, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return _gated(up, gate, silu=True)


def sigmoid_gate_rows(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`x * sigmoid(gate)` (the gated-attention output gate): x [T, H, D], gate [T, H, D] with
    any row and head strides (the gate columns interleaved with q in the projection)."""
    return _gated(x, gate, silu=False)


@triton.jit
def conv_silu_row(win, x_row, w_ptr, ch, C, W: tl.constexpr, N: tl.constexpr):
    """One kept row's causal conv + SiLU at channels ch [N]: the window's W-1 rows then x_row,
    taps in ascending order in fp32 and rounded to x's dtype, as `_conv_kernel` computes and
    stores it, so a kernel that fuses the conv reads the same bits. Returned in fp32."""
    acc = tl.zeros((N,), dtype=tl.float32)
    for j in tl.static_range(W):
        if j < W - 1:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            val = tl.load(win + j * C + ch)
        else:
            val = tl.load(x_row + ch)
        acc += val.to(tl.float32) * tl.load(w_ptr + ch * W + j).to(tl.float32)
    return silu(acc).to(x_row.dtype.element_ty).to(tl.float32)


@triton.jit
def shift_window(win, x_row, ch, C, W: tl.constexpr, mask):
    """Move a conv window on by the kept row x_row at channels ch: each lane loads a row before
    it stores over it, so no other program may still read these channels."""
    for r in tl.static_range(W - 1):
        if r + 1 < W - 1:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            nxt = tl.load(win + (r + 1) * C + ch, mask=mask)
        else:
            nxt = tl.load(x_row + ch, mask=mask)
        tl.store(win + r * C + ch, nxt, mask=mask)


@triton.jit(do_not_specialize=["rows_per_seq"])
def _conv_kernel(
    win_ptr,
    x_ptr,
    w_ptr,
    out_ptr,
    seq_ptr,
    slot_ptr,
    C,
    rows_per_seq,
    stride_x,
    W: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_WINDOW_SLOTS: tl.constexpr,
    IN_PLACE: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    row = tl.program_id(0)
    b = row // rows_per_seq  # the sequence, and its row t
    t = row % rows_per_seq
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < C
    if HAS_WINDOW_SLOTS:  # sequence b's window is slot slots[b] of a pool
        win = win_ptr + tl.load(slot_ptr + b).to(tl.int64) * (W - 1) * C
    else:
        win = win_ptr + b.to(tl.int64) * (W - 1) * C
    x_seq = x_ptr + (b * rows_per_seq) * stride_x
    seq_out = seq_ptr + b.to(tl.int64) * (W - 1 + rows_per_seq) * C
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(W):  # taps in ascending order, the same for every row
        i = t + j  # index into seq = [window (W-1 rows) ; x]
        if i < W - 1:
            val = tl.load(win + i * C + offs, mask=mask, other=0.0)
        else:
            val = tl.load(x_seq + (i - (W - 1)) * stride_x + offs, mask=mask, other=0.0)
        tap = tl.load(w_ptr + offs * W + j, mask=mask, other=0.0)
        acc += val.to(tl.float32) * tap.to(tl.float32)
    tl.store(out_ptr + row * C + offs, silu(acc).to(out_ptr.dtype.element_ty), mask=mask)
    if IN_PLACE:  # one row, kept: the window moves on by it
        shift_window(win, x_seq, offs, C, W, mask)
    else:
        x_t = tl.load(x_seq + t * stride_x + offs, mask=mask, other=0.0)
        tl.store(seq_out + (t + W - 1) * C + offs, x_t, mask=mask)
        if t == 0:
            for r in tl.static_range(W - 1):
                tl.store(seq_out + r * C + offs, tl.load(win + r * C + offs, mask=mask), mask=mask)


def causal_conv_silu_rows(
    window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over the new rows, taps in a fixed order, fp32 accumulation.

    window [W-1, C] (the inputs before x), x [T, C] (rows may be strided), weight [C, W].
    Returns (out [T, C], seq [W-1+T, C] = window then x, what the state keeps on commit).
    With `slots` ([B] int), x holds B sequences of T/B rows, sequence b's window is slot
    slots[b] of a pool window [S, W-1, C], and seq is [B, W-1+T/B, C]; the arithmetic is the same.
    """
    out, seq = _conv(window, x, weight, slots, in_place=False)
    assert seq is not None
    return out, seq if slots is not None else seq[0]


def causal_conv_silu_in_place(
    window: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor | None = None
) -> torch.Tensor:
    """`causal_conv_silu_rows` of one row per sequence that is kept (a decode row): the window
    moves on by that row in place (at `slots`), so there is no seq to commit. Returns out."""
    return _conv(window, x, weight, slots, in_place=True)[0]


def _conv(
    window: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor | None,
    in_place: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    t, c = x.shape
    w = weight.shape[1]
    seqs = 1 if slots is None else slots.shape[0]
    win_shape = (w - 1, c) if slots is None else (window.shape[0], w - 1, c)
    if window.shape != win_shape or weight.shape[0] != c or x.stride(-1) != 1 or t % seqs:
        shapes = f"window {tuple(window.shape)}, x {tuple(x.shape)}, w {tuple(weight.shape)}"
        raise ValueError(f"conv shapes disagree: {shapes}")
    if in_place and (t != seqs or not window.is_contiguous()):
        raise ValueError("an in-place conv takes one row per sequence and a contiguous window")
    window, weight = window.contiguous(), weight.contiguous()
    out = torch.empty((t, c), device=x.device, dtype=x.dtype)
    seq = None
    if not in_place:
        seq = torch.empty((seqs, w - 1 + t // seqs, c), device=x.device, dtype=x.dtype)
    pdl_mode = pdl.use_pdl(x.device)
    _conv_kernel[(t, triton.cdiv(c, _BLOCK))](
        window, x, weight, out, window if seq is None else seq, window if slots is None else slots,
        c, t // seqs, x.stride(0), W=w, BLOCK=_BLOCK, HAS_WINDOW_SLOTS=slots is not None,
        IN_PLACE=in_place, PDL=pdl_mode, num_warps=4, launch_pdl=pdl_mode > 0,
    )  # fmt: skip
    return out, seq
