"""Gated DeltaNet: one recurrent-step kernel for decode and verify (the prefill's chunked form is
`specdash.engine.ops.gdn_prefill`: FLA's kernel or torch, the same for both runs).

Why one kernel: verify must leave, after each of its T tokens, the same fp32 state and output bits
that T decode steps would. So verify runs the decode recurrence token by token (never the chunked
WY form, which is the same math in another order) through the same compiled kernel: decode is the
T=1 launch of it. beta = sigmoid(b) stays fp32, the state is fp32, and the launch configuration
(BV, num_warps) is pinned. Every step's state is written out so that accepting j of T tokens
restores the state after step j. Math (docs/exactness.md §3), per token and v-head, in fp32:
q, k <- x / sqrt(sum x^2 + 1e-6); q *= Dk^-1/2; g = -exp(A_log) * softplus(a + dt_bias) (threshold
20); beta = sigmoid(b); h *= exp(g); v' = beta * (v - sum_K h*k); h += k (x) v'; o = sum_K h*q.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdash.kernels.triton import pdl
from specdash.kernels.triton.elementwise import conv_silu_row, shift_window
from specdash.kernels.triton.pdl import start_after_predecessor
from specdash.kernels.triton.tickets import counters

BLOCK_V = 32  # pinned: the state tile per program, [Dk, BLOCK_V]
_NUM_WARPS = 4  # pinned
_EPS = 1e-6


@triton.jit(do_not_specialize=["T"])
def _gdn_steps_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    h0_ptr,
    slot_ptr,
    o_ptr,
    hs_ptr,
    win_ptr,
    conv_w_ptr,
    ticket_ptr,
    T,
    HV,
    C,
    stride_qb,
    stride_qt,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    stride_ab,
    stride_at,
    stride_bb,
    stride_bt,
    stride_ob,
    stride_ot,
    scale,
    V_PER_K: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BV: tl.constexpr,
    HAS_STATE_SLOTS: tl.constexpr,
    IN_PLACE: tl.constexpr,
    CONV_W: tl.constexpr,
    PDL: tl.constexpr,
):
    start_after_predecessor(PDL)
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    hk = hv // V_PER_K
    offs_k = tl.arange(0, DK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    tile = offs_k[:, None] * DV + offs_v[None, :]
    # with a pool, sequence b's state is slot slots[b]
    if HAS_STATE_SLOTS:  # noqa: SIM108 (a constexpr branch inside a Triton kernel)
        seq_at = tl.load(slot_ptr + b).to(tl.int64)
    else:
        seq_at = b.to(tl.int64)
    h0_at = seq_at * HV + hv
    h = tl.load(h0_ptr + h0_at * DK * DV + tile)
    # with CONV_W, q/k/v are the causal conv + SiLU of the raw in_proj row at q_ptr (T == 1)
    key_dim = HV // V_PER_K * DK
    ch_q, ch_v = hk * DK + offs_k, 2 * key_dim + hv * DV + offs_v
    win, x_row = win_ptr + seq_at * (CONV_W - 1) * C, q_ptr + b * stride_qb
    neg_a = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    hs_step = HV * DK * DV
    hs_ptrs = hs_ptr + (b.to(tl.int64) * T * HV + hv) * DK * DV + tile
    for t in range(T):
        if CONV_W:
            q = conv_silu_row(win, x_row, conv_w_ptr, ch_q, C, CONV_W, DK)
            k = conv_silu_row(win, x_row, conv_w_ptr, key_dim + ch_q, C, CONV_W, DK)
            v = conv_silu_row(win, x_row, conv_w_ptr, ch_v, C, CONV_W, BV)
        else:
            q = tl.load(q_ptr + b * stride_qb + t * stride_qt + hk * DK + offs_k).to(tl.float32)
            k = tl.load(k_ptr + b * stride_kb + t * stride_kt + hk * DK + offs_k).to(tl.float32)
            v = tl.load(v_ptr + b * stride_vb + t * stride_vt + hv * DV + offs_v).to(tl.float32)
        a = tl.load(a_ptr + b * stride_ab + t * stride_at + hv).to(tl.float32) + dt_bias
        beta_in = tl.load(b_ptr + b * stride_bb + t * stride_bt + hv).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q) + 1e-6) * scale
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
        decay = tl.exp(neg_a * softplus)
        beta = 1.0 / (1.0 + tl.exp(-beta_in))
        h = h * decay
        v_new = beta * (v - tl.sum(h * k[:, None], axis=0))
        h = h + k[:, None] * v_new[None, :]
        o = tl.sum(h * q[:, None], axis=0)
        o_ptrs = o_ptr + b * stride_ob + t * stride_ot + hv * DV + offs_v
        tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty))
        if not IN_PLACE:
            tl.store(hs_ptrs, h)
            hs_ptrs += hs_step
    if IN_PLACE:  # every token kept: only the last state, back where it came from
        tl.store(h0_ptr + h0_at * DK * DV + tile, h)
    if CONV_W:  # the conv window moves on by the row
        shift_window(win, x_row, ch_v, C, CONV_W, offs_v < DV)  # v: this program's alone
        # q and k are read by every program of key head hk: the last one to finish moves them
        tl.debug_barrier()  # every thread's window loads are done before the ticket is taken
        ticket_at = ticket_ptr + b * (HV // V_PER_K) + hk
        if tl.atomic_add(ticket_at, 1, sem="acq_rel") == V_PER_K * (DV // BV) - 1:
            shift_window(win, x_row, ch_q, C, CONV_W, offs_k < DK)
            shift_window(win, x_row, key_dim + ch_q, C, CONV_W, offs_k < DK)
            tl.atomic_xchg(ticket_at, 0)  # ready for the next launch (and CUDA graph replays)


def gdn_verify_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T recurrent steps, token by token: q,k [B,T,H,Dk], v [B,T,HV,Dv], a,b [B,T,HV], state fp32
    [B,HV,Dk,Dv] -> (o [B,T,HV,Dv] in v.dtype, per-step states [B,T,HV,Dk,Dv] fp32).

    states[:, j] is the state after token j, the one to keep when j+1 tokens are accepted.
    With `slots` ([B] int), `state` is a pool [S,HV,Dk,Dv] and sequence b starts from
    state[slots[b]] (read only: the caller commits); the arithmetic is the same.
    """
    o, states = _launch((q, k, v, a, b, A_log, dt_bias, state), slots, in_place=False)
    assert states is not None
    return o, states


def gdn_steps_in_place(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gdn_verify_steps` when every token is kept (a decode row): the state after the last
    token is stored back into `state` (at `slots`) and no per-step states are written, so a
    batched decode needs neither the per-step buffer nor the commit's gather and copy
    (B x 3.1 MB each per layer on the 27B shape). The same kernel and arithmetic; returns o."""
    return _launch((q, k, v, a, b, A_log, dt_bias, state), slots, in_place=True)[0]


def conv_gdn_steps_in_place(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    window: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """A decode row's causal conv + SiLU and recurrent step in one launch: qkv [B, C] the raw
    in_proj rows (q | k | v before the conv), a, b [B, HV], conv_weight [C, W], window
    [S, W-1, C] and state [S, HV, Dk, Dv] (S = B without `slots`), both moved on in place.

    Each program computes the conv of the channels it reads with `causal_conv_silu_rows`'
    arithmetic and rounding, so o, the state and the window are bit for bit those of that
    kernel followed by `gdn_steps_in_place`, one launch fewer per GDN layer (48 per decode step
    on the 27B shape). Returns o [B, HV, Dv]."""
    bsz, c = qkv.shape
    hv, dk, dv = state.shape[1:]
    key_dim = (c - hv * dv) // 2
    w = conv_weight.shape[1]
    n_states = bsz if slots is None else state.shape[0]
    if key_dim % dk or conv_weight.shape[0] != c or window.shape != (n_states, w - 1, c):
        shapes = f"qkv {tuple(qkv.shape)}, conv {tuple(conv_weight.shape)}, state {state.shape}"
        raise ValueError(f"conv and state shapes disagree: {shapes}, window {window.shape}")
    if qkv.stride(-1) != 1 or not window.is_contiguous():
        raise ValueError("need qkv rows with contiguous channels and a contiguous window")
    h = key_dim // dk
    q, k, v = qkv.split([key_dim, key_dim, hv * dv], dim=-1)
    views = (q.view(bsz, 1, h, dk), k.view(bsz, 1, h, dk), v.view(bsz, 1, hv, dv))
    conv = (qkv, window, conv_weight.contiguous())
    inputs = (*views, a[:, None], b[:, None], A_log, dt_bias, state)
    return _launch(inputs, slots, in_place=True, conv=conv)[0][:, 0]


def _launch(
    inputs: tuple[torch.Tensor, ...],
    slots: torch.Tensor | None,
    in_place: bool,
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The public functions' launch: `inputs` = (q, k, v, a, b, A_log, dt_bias, state); with
    `conv` = (raw qkv rows, window, conv weight), q/k/v only give the shapes."""
    q, k, v, a, b, A_log, dt_bias, state = inputs
    bsz, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (bsz, t) or a.shape != (bsz, t, hv):
        raise ValueError(f"q {q.shape} k {k.shape} v {v.shape} a {a.shape}: shapes disagree")
    n_states = bsz if slots is None else state.shape[0]
    if slots is not None and slots.shape != (bsz,):
        raise ValueError(f"slots {tuple(slots.shape)}: need one per sequence ({bsz})")
    if b.shape != a.shape or state.shape != (n_states, hv, dk, dv) or state.dtype != torch.float32:
        raise ValueError(f"b {b.shape}, state {state.shape} {state.dtype}: need fp32 [B,HV,Dk,Dv]")
    if hv % h or dv % BLOCK_V or dk & (dk - 1):
        raise ValueError(f"need HV={hv} a multiple of H={h}, Dv={dv} of {BLOCK_V}, Dk={dk} a pow2")
    # rows may be strided (views into the conv output and in_proj): the kernel needs only each
    # row's heads contiguous, so copy nothing else
    q, k, v, a, b = (_rows_contiguous(x) for x in (q, k, v, a, b))
    if in_place and not state.is_contiguous():
        raise ValueError("an in-place step needs a contiguous state")
    state = state.contiguous()
    o = torch.empty((bsz, t, hv, dv), device=v.device, dtype=v.dtype)
    states = None
    if not in_place:
        states = torch.empty((bsz, t, hv, dk, dv), device=v.device, dtype=torch.float32)
    win = conv_w = tickets = state  # unused pointers without a fused conv
    if conv is not None:
        q, win, conv_w = conv  # the kernel reads the raw rows at q
        tickets = counters("gdn-conv", v.device, bsz * h)
    pdl_mode = pdl.use_pdl(v.device)
    _gdn_steps_kernel[(bsz * hv, dv // BLOCK_V)](
        q,
        k,
        v,
        a,
        b,
        A_log.contiguous(),
        dt_bias.contiguous(),
        state,
        state if slots is None else slots,
        o,
        state if states is None else states,
        win,
        conv_w,
        tickets,
        t,
        hv,
        q.shape[-1] if conv is not None else 0,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        o.stride(0),
        o.stride(1),
        dk**-0.5,
        V_PER_K=hv // h,
        DK=dk,
        DV=dv,
        BV=BLOCK_V,
        HAS_STATE_SLOTS=slots is not None,
        IN_PLACE=in_place,
        CONV_W=0 if conv is None else conv[2].shape[1],
        PDL=pdl_mode,
        num_warps=_NUM_WARPS,
        launch_pdl=pdl_mode > 0,
    )
    return o, states


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    inner = x.stride(-1) == 1 and (x.dim() < 4 or x.stride(-2) == x.shape[-1])
    return x if inner else x.contiguous()


def gdn_recurrent_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: q,k [B,H,Dk], v [B,HV,Dv], a,b [B,HV] -> (o [B,HV,Dv], new fp32 state).

    The T=1 launch of the verify kernel, so decode and verify share every instruction.
    """
    o, states = gdn_verify_steps(
        q[:, None], k[:, None], v[:, None], a[:, None], b[:, None], A_log, dt_bias, state
    )
    return o[:, 0], states[:, 0]
