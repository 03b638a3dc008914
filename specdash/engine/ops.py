"""Numeric primitives of the native engine, written so that exactness can be argued op by op.

Two rules make a verify row bit-identical to the decode row at the same position:

* **Row ops** (GEMM, attention, log_softmax) run in exact mode once per row with the
  shapes decode uses, unless the GEMM backend is batch-invariant by construction (the
  Triton tile on GPU; see `gemm_backends`). Same op, same shape, same input bits: same
  output bits. Norms reduce with `fixed_order_sum`, a pairwise tree of elementwise adds,
  so they batch.
* **Elementwise ops** run batched. They are exact per element only if every element takes
  the same code path, so sigmoid / SiLU / softplus are composed from `exp` and `log1p`
  here: torch's own CPU kernels for those switch between a vector and a scalar formula
  depending on where an element falls in the tensor (measured: sizes 1..33 disagree).

The rule and the proving test for every sub-op, per path: docs/exactness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from torch.nn.attention.bias import CausalBias

Tensor = torch.Tensor


# ---------------------------------------------------------------- elementwise


def sigmoid(x: Tensor) -> Tensor:
    """fp32 `1 / (1 + exp(-x))`, the formula the exact GDN beta needs on both paths."""
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: Tensor) -> Tensor:
    return x / (1.0 + torch.exp(-x))


def softplus(x: Tensor) -> Tensor:
    """torch's softplus with beta=1, threshold=20, from exp/log1p."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(x.clamp(max=20.0))))


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Partial RoPE: rotate the first `cos.shape[-1]` dims. x: [T, H, D], cos/sin: [T, R]."""
    r = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    x_rot = x[..., :r]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x[..., r:]), dim=-1)


def causal_conv_silu(window: Tensor, x: Tensor, w: Tensor) -> Tensor:
    """Depthwise causal conv + SiLU over new inputs, in a fixed tap order.

    window: [W-1, C] inputs before x; x: [T, C]; w: [C, W]. Returns [T, C].
    Elementwise only, so row t's bits do not depend on T: decode (T=1), verify and
    prefill share one formula.
    """
    seq = torch.cat((window, x), dim=0)
    t = x.shape[0]
    acc = seq[0:t] * w[:, 0]
    for j in range(1, w.shape[1]):
        acc = acc + seq[j : j + t] * w[:, j]
    return silu(acc)


# ---------------------------------------------------------------- row ops


def per_row(fn: Callable[[Tensor], Tensor], x: Tensor, exact: bool) -> Tensor:
    """Apply a reducing op row by row in exact mode, so each call has decode's shape."""
    if exact and x.shape[0] > 1:
        return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])
    return fn(x)


def fixed_order_sum(x: Tensor) -> Tensor:
    """Sum of non-negative fp32 values over the last dim (keepdim) by pairwise halving.

    Level by level, element i of the first half is added to element i of the second
    (`x[..., :w] + x[..., w:]`), zero-padded to a power of two. Every row gets the same
    sequence of IEEE additions whatever the leading dims hold, so rows can be batched and
    still match decode bit for bit; torch's own reductions choose their vectorisation and
    threading from the whole tensor's shape. A level is one `sum` over a size-2 dim of a
    binary reshape: a sum of two values is fl(a + b) in any order, and the 0 it starts
    from changes nothing for values >= +0 (the squares this is used on) -- 2 dispatches
    per level fewer than slicing.
    """
    width = 1 << max(x.shape[-1] - 1, 0).bit_length()
    if width != x.shape[-1]:
        x = F.pad(x, (0, width - x.shape[-1]))
    levels = width.bit_length() - 1
    if levels == 0:
        return x
    x = x.reshape(*x.shape[:-1], *[2] * levels)
    for level in range(levels, 0, -1):
        x = x.sum(-level)
    return x[..., None]


def _rms_normed(xf: Tensor, eps: float, exact: bool) -> Tensor:
    """x / sqrt(mean(x^2) + eps): fixed-order in exact mode, torch's one fused op otherwise."""
    if exact:
        return xf * (1.0 / torch.sqrt(fixed_order_sum(xf * xf) / xf.shape[-1] + eps))
    return F.rms_norm(xf, xf.shape[-1:], eps=eps)


def rms_norm(x: Tensor, w: Tensor, eps: float, zero_centred: bool, exact: bool) -> Tensor:
    """Qwen3 RMSNorm (`w * norm(x)`) or the zero-centred Qwen3-Next one (`norm(x) * (1 + w)`)."""
    xf = _rms_normed(x.float(), eps, exact)
    if zero_centred:
        return (xf * (1.0 + w.float())).to(x.dtype)
    return w * xf.to(x.dtype)


def gated_rms_norm(x: Tensor, z: Tensor, w: Tensor, eps: float, exact: bool) -> Tensor:
    """GDN output norm: `w * rmsnorm(x) * silu(z)`, x and z: [T, HV, Dv]."""
    normed = _rms_normed(x.float(), eps, exact).to(x.dtype)
    return (w * normed * silu(z.float())).to(x.dtype)


def l2norm(x: Tensor, exact: bool) -> Tensor:
    """FLA/SGLang form `x / sqrt(sum(x^2) + 1e-6)` over the last dim, in fp32."""
    xf = x.float()
    sq = fixed_order_sum(xf * xf) if exact else (xf * xf).sum(-1, keepdim=True)
    return xf / torch.sqrt(sq + 1e-6)


def log_softmax(logits: Tensor, exact: bool) -> Tensor:
    """Row by row when exact, except on CUDA: its softmax gives each row its own thread block
    (a warp for short rows) whose reduction is set by the row length alone, so a batch of rows
    has each row's bits (tests/engine/test_gpu_engine.py: B = 1 against 32); one launch instead of B
    launches of one block each (1.7 ms per step at B = 32 on the 27B shape)."""
    row_by_row = exact and logits.device.type != "cuda"
    return per_row(lambda r: torch.log_softmax(r.float(), dim=-1), logits, row_by_row)


def greedy(logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """Argmax (first index on ties) and its logprob, per row."""
    ids = logprobs.argmax(dim=-1)
    return ids, logprobs.gather(-1, ids[:, None])[:, 0]


def attention_decode_rows(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, start: int, scale: float
) -> Tensor:
    """Query rows at positions start.., each over its own prefix of the cache, one by one.

    q: [T, Hq, D]; caches: [Hkv, cap, D]. Row r attends to the first start+r+1 keys with
    decode's shapes, so a verify row is exactly the decode row of its position.
    """
    t, hkv, d = q.shape[0], k_cache.shape[0], k_cache.shape[-1]
    k_t = k_cache.transpose(1, 2)
    rows = []
    for r, qg in enumerate(q.reshape(t, hkv, -1, d).unbind(0)):
        n = start + r + 1
        scores = torch.matmul(qg, k_t[:, :, :n]).float() * scale
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        rows.append(torch.matmul(probs, v_cache[:, :n]).view(-1, d))
    return rows[0][None] if t == 1 else torch.stack(rows)


def attention_batched(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, start: int, scale: float
) -> Tensor:
    """T query rows at positions start..start+T-1 in one SDPA call (prefill and fast verify)."""
    t = q.shape[0]
    n = start + t
    # from position 0 plain causal attention: the flash kernel, O(T) memory at 128k tokens;
    # one row (a draft step) sees every cached key, so it needs no mask at all. Rows after
    # cached keys (a later prefill chunk, a verify) see keys up to their own position: on CUDA
    # the lower-right causal bias keeps the flash kernel (a [T, n] mask would not); the CPU
    # kernels take the mask
    causal = start == 0 and t > 1
    mask: Tensor | CausalBias | None = None
    if start > 0 and t > 1:
        if q.is_cuda:
            # imported here: it imports Triton, which on a CPU machine must first see
            # TRITON_INTERPRET (set by specdash.kernels)
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(t, n)
        else:
            mask = torch.ones(t, n, dtype=torch.bool, device=q.device).tril(start)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k_cache[None, :, :n],
        v_cache[None, :, :n],
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def attention_masked(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, scale: float
) -> Tensor:
    """Rows q [T, Hq, D] at device positions `pos` [T], each over the cached keys up to its own
    position, in one SDPA call over the whole cache: fast verify on CUDA, whose CUDA graph must
    not depend on the host-side length (`attention_batched` slices by it)."""
    keys = torch.arange(k_cache.shape[1], device=q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k_cache[None],
        v_cache[None],
        attn_mask=keys[None, :] <= pos[:, None],
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


# ---------------------------------------------------------------- gated delta rule


def gdn_gates(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """decay = exp(-exp(A_log) * softplus(a + dt_bias)) and beta = sigmoid(b), both fp32."""
    g = -torch.exp(a_log.float()) * softplus(a.float() + dt_bias.float())
    return torch.exp(g), sigmoid(b.float())


def gdn_recurrent_steps(
    q: Tensor, k: Tensor, v: Tensor, decay: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The decode recurrence, one token at a time. Decode runs T=1; verify runs T=k+1.

    q, k: [T, HV, Dk] (l2-normalised, q scaled); v: [T, HV, Dv]; decay, beta: [T, HV];
    state: fp32 [HV, Dk, Dv]. Returns o [T, HV, Dv] fp32 and the per-step states
    [T, HV, Dk, Dv] so a rejected suffix can be rolled back.

    fp32 on the CPU: `cpu_gemm.gdn_steps`, the same loop in C (one call instead of 7 ops a
    token); a token's arithmetic there does not depend on T either.
    """
    if _c_gdn(q, state):
        from specdash.kernels import cpu_gemm

        return cpu_gemm.gdn_steps(q, k, v, decay, beta, state)
    steps = []
    outs = []
    h = state
    # per-token views made once (each indexing op is a dispatch; the math is unchanged)
    decay_t, beta_t = decay[:, :, None, None].unbind(0), beta[:, :, None].unbind(0)
    q_t, k_t, v_t = q[..., None].unbind(0), k[..., None].unbind(0), v.unbind(0)
    for t in range(q.shape[0]):
        h = h * decay_t[t]
        kv_mem = (h * k_t[t]).sum(-2)
        delta = (v_t[t] - kv_mem) * beta_t[t]
        h = h + k_t[t] * delta[:, None, :]
        outs.append((h * q_t[t]).sum(-2))
        steps.append(h)
    if len(steps) == 1:  # decode: views, not copies
        return outs[0][None], h[None]
    return torch.stack(outs), torch.stack(steps)


def _c_gdn(q: Tensor, state: Tensor) -> bool:
    """The compiled recurrence serves fp32 CPU tensors without gradients, where it builds;
    decided by dtype, device and machine only, never by T."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or state.dtype != torch.float32:
        return False
    if q.requires_grad or state.requires_grad:
        return False
    from specdash.kernels import cpu_gemm

    return cpu_gemm.load() is not None


def gdn_chunked(
    q: Tensor, k: Tensor, v: Tensor, decay: Tensor, beta: Tensor, state: Tensor, chunk: int = 64
) -> tuple[Tensor, Tensor]:
    """Chunked (WY/UT) form of the same recurrence, for prefill only.

    Same math in a different order, so different bits: prefill is shared by the
    speculative run and the shadow, so it need not match decode.
    Shapes as `gdn_recurrent_steps`; returns o [T, HV, Dv] and the final state.
    """
    t_len = q.shape[0]
    pad = (-t_len) % chunk
    g = torch.log(decay)
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))  # [HV, Tp, D]
    beta, g = (F.pad(x.transpose(0, 1), (0, pad)) for x in (beta, g))
    hv, tp = q.shape[0], q.shape[1]
    n = tp // chunk
    q, k, v = (x.reshape(hv, n, chunk, -1) for x in (q, k, v))
    beta, g = beta.reshape(hv, n, chunk), g.reshape(hv, n, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = ((k_beta @ k.transpose(-1, -2)) * pair).tril(-1)  # unit diagonal is implied
    new_v = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    intra = (q @ k.transpose(-1, -2)) * pair
    q_dec = q * cum.exp()[..., None]
    k_dec = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()
    h = state
    out = torch.empty_like(new_v)
    for i in range(n):
        v_new = new_v[:, i] - k_cum[:, i] @ h
        out[:, i] = q_dec[:, i] @ h + intra[:, i] @ v_new
        h = h * chunk_decay[:, i, None, None] + k_dec[:, i].transpose(-1, -2) @ v_new
    out = out.reshape(hv, tp, -1)[:, :t_len].transpose(0, 1)
    return out, h


def gdn_chunked_prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Chunked (WY) prefill in torch, fp32, per sequence of a batch -> (o, final state).

    q, k: [B, T, H, Dk] (raw: normalised and scaled here); v: [B, T, HV, Dv]; a, b: [B, T, HV];
    state: fp32 [B, HV, Dk, Dv] or None (zeros); o: [B, T, HV, Dv], final state fp32. Prefill
    is shared by the speculative and the plain run, so it need not match the recurrent bits;
    this is the same math as the recurrence in chunk-parallel order (HF's torch reference).
    """
    bsz, _, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    outs, finals = [], []
    for i in range(bsz):
        qi = l2norm(q[i].repeat_interleave(hv // h, dim=1), exact=False) * dk**-0.5
        ki = l2norm(k[i].repeat_interleave(hv // h, dim=1), exact=False)
        decay, beta = gdn_gates(a[i], b[i], A_log, dt_bias)
        s0 = torch.zeros(hv, dk, dv, device=q.device) if state is None else state[i].float()
        o, final = gdn_chunked(qi, ki, v[i].float(), decay, beta, s0, chunk_size)
        outs.append(o.to(v.dtype))
        finals.append(final)
    return torch.stack(outs), torch.stack(finals)


def gdn_prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The prefill's GDN (shapes as `gdn_chunked_prefill`): FLA's chunked Triton kernel on CUDA
    when fla-core imports, else the torch one. Not specdash's kernel: the engine picks it.

    Measured on an H200 (docs/PERF.md): FLA 1.2 ms vs torch 33 ms at 4096 tokens per layer.
    """
    if q.is_cuda:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        except ImportError:
            pass
        else:
            rep = v.shape[2] // q.shape[2]
            g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), threshold=20.0)
            o, final = chunk_gated_delta_rule(
                q.repeat_interleave(rep, dim=2),
                k.repeat_interleave(rep, dim=2),
                v,
                g,
                torch.sigmoid(b.float()),
                initial_state=None if state is None else state.float(),
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            return o.to(v.dtype), final.float()
    return gdn_chunked_prefill(q, k, v, a, b, A_log, dt_bias, state)
