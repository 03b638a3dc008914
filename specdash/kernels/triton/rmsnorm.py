"""RMSNorm over rows, one program per row: the norms of a verify row equal decode's bit for bit.

Why a kernel: torch's CUDA reduction picks its launch shape from the whole tensor, so a row
normalised among k+1 others can take another reduction order than the same row alone; issuing
the rows one by one is exact but costs a launch per row and norm (measured: verify(k=9) at
2.7x a decode step on the 27B shape). Here every row is reduced inside one program whose
block and warp count depend only on the row width, so M never changes a row's bits.

The same kernel carries the two neighbours every norm in the model has, so a decode step
launches one kernel where torch launched a chain of small ones: the residual add before the
layer norms (`add_rms_norm_rows`) and GDN's SiLU output gate (`gated_rms_norm_rows`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdash.kernels.triton import pdl
from specdash.kernels.triton.pdl import start_after_predecessor


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    res_out_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    group,
    stride_x,
    stride_r,
    stride_g,
    stride_o,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ZERO_CENTRED: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    # row r of width n_cols is element (r // group, r % group) of a [rows/group, group, n_cols]
    # view whose last two dims are contiguous: head rows of a strided projection need no copy
    row = tl.program_id(0)
    outer, inner = row // group, (row % group) * n_cols
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + outer * stride_x + inner + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        # the residual stream keeps its dtype: round the sum as `x + a` would, then normalise
        r = tl.load(res_ptr + outer * stride_r + inner + offs, mask=mask, other=0.0)
        x = (x + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n_cols + offs, x, mask=mask)
        x = x.to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if ZERO_CENTRED:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
            y = y * (1.0 + w)
        else:
            y = y * w
    if HAS_GATE:
        z = tl.load(gate_ptr + outer * stride_g + inner + offs, mask=mask, other=0.0)
        z = z.to(tl.float32)
        y = y * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int, int]:
    """(tensor, group, outer stride) for the kernel's addressing, without a copy for [M, n] rows
    and for [T, H, n] head rows sliced out of a wider [T, W] projection."""
    if t.stride(-1) == 1:
        if t.dim() == 2:
            return t, 1, t.stride(0)
        if t.dim() == 3 and t.stride(1) == n:
            return t, t.shape[1], t.stride(0)
    return t.reshape(-1, n).contiguous(), 1, n


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    zero_centred: bool,
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = x.shape[-1]
    for name, t in (("residual", residual), ("gate", gate)):
        if t is not None and t.shape != x.shape:
            raise ValueError(f"{name} {tuple(t.shape)} != x {tuple(x.shape)}")
    views = [_rows(t, n) for t in (x, residual, gate) if t is not None]
    if len({group for _, group, _ in views}) > 1:  # mixed layouts: plain contiguous rows
        views = [(t.reshape(-1, n).contiguous(), 1, n) for t, _, _ in views]
    (xv, group, stride_x), rest = views[0], views[1:]
    rv, _, stride_r = rest.pop(0) if residual is not None else (xv, group, 0)
    gv, _, stride_g = rest.pop(0) if gate is not None else (xv, group, 0)
    out_dtype = x.dtype if residual is None else residual.dtype
    out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    res_out = None if residual is None else torch.empty_like(out)
    block = triton.next_power_of_2(n)
    pdl_mode = pdl.use_pdl(x.device)
    _rms_norm_kernel[(x.numel() // n,)](
        xv,
        rv,
        out if res_out is None else res_out,
        gv,
        xv if weight is None else weight,
        out,
        n,
        group,
        stride_x,
        stride_r,
        stride_g,
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        HAS_GATE=gate is not None,
        HAS_WEIGHT=weight is not None,
        ZERO_CENTRED=zero_centred,
        BLOCK=block,
        PDL=pdl_mode,
        num_warps=min(max(block // 512, 1), 16),  # a function of the row width only
        launch_pdl=pdl_mode > 0,
    )
    return out, res_out


def rms_norm_rows(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, zero_centred: bool = False
) -> torch.Tensor:
    """`x * rsqrt(mean(x^2) + eps)` over the last dim, times `weight` (or `1 + weight`), in fp32.

    Any leading shape; each last-dim row is one program. Output in x's dtype.
    """
    return _launch(x, weight, eps, zero_centred)[0]


def add_rms_norm_rows(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rms_norm(s)) with s = residual + x rounded to residual's dtype: the pre-norm
    residual add and the norm after it in one launch."""
    out, res_out = _launch(x, weight, eps, zero_centred, residual=residual)
    assert res_out is not None
    return res_out, out


def gated_rms_norm_rows(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`weight * rms_norm(x) * silu(gate)` per last-dim row, fp32 inside, x's dtype out (GDN)."""
    return _launch(x, weight, eps, False, gate=gate)[0]
