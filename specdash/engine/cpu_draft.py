"""A draft model's single-token step on the CPU in compiled C: one call per layer.

A draft step of the embedded pair is ~230 torch ops for a 2-layer, 1 M-parameter model: on a
2-core CPU at ~10 us per dispatch that is 2.3 ms a draft token, a quarter of a target decode
step, and it alone kept exact speculation below plain decode. Drafts need no exactness (the
target's verify decides every emitted token), so this step is free to compute differently:
the same model (RMSNorm, gated attention with q/k norms and partial RoPE over the KV cache,
Gated DeltaNet with its causal conv, SwiGLU MLP, greedy head) in plain C loops, built with
``-O3 -ffast-math`` by `cpu_gemm.compile_library`. Its logits agree with the torch `fast`
forward to ~1e-5 (tests/engine/test_cpu_draft.py), so it proposes the same tokens but for near-ties.

It reads and writes the drafter's `SeqState` as the torch forward does: K/V written into the
cache at the position, GDN conv window and recurrent state replaced by new tensors (never
written in place, so the drafter's snapshots stay valid). Used by `ModelDrafter` on the CPU in
fp32 when the library builds; ``SPECDASH_CPU_DRAFT=0`` turns it off (the torch step).
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import torch

from specdash.engine.model import Model
from specdash.engine.state import SeqState
from specdash.engine.weights import AttentionWeights, plain
from specdash.kernels import cpu_gemm
from specdash.kernels.gemm_backends import _kn

Tensor = torch.Tensor

SOURCE = r"""
#include <math.h>
#include <stdlib.h>
typedef const float cf;

/* y = x @ wt, wt [k, n] row-major */
static void gemv(cf *x, cf *wt, float *y, long k_dim, long n_dim) {
    for (long n = 0; n < n_dim; n++) y[n] = 0.0f;
    for (long k = 0; k < k_dim; k++) {
        const float xv = x[k];
        cf *w = wt + k * n_dim;
        for (long n = 0; n < n_dim; n++) y[n] += xv * w[n];
    }
}

static void rmsnorm(cf *x, cf *w, float *y, long n, float eps, int zero_centred) {
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += x[i] * x[i];
    const float r = 1.0f / sqrtf(s / (float)n + eps);
    for (long i = 0; i < n; i++) y[i] = x[i] * r * (zero_centred ? 1.0f + w[i] : w[i]);
}

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* x += down(silu(gate) * up) of norm(x) */
static void mlp(float *x, cf *post_norm, cf *gate_up_t, cf *down_t, long hid, long inter,
                float eps, int zc) {
    float *h = malloc(sizeof(float) * (hid + 3 * inter));
    float *gu = h + hid, *act = gu + 2 * inter;
    rmsnorm(x, post_norm, h, hid, eps, zc);
    gemv(h, gate_up_t, gu, hid, 2 * inter);
    for (long i = 0; i < inter; i++) act[i] = silu(gu[i]) * gu[inter + i];
    float *m = h; /* reuse: hid floats */
    gemv(act, down_t, m, inter, hid);
    for (long i = 0; i < hid; i++) x[i] += m[i];
    free(h);
}

/* partial RoPE of `rows` rows `stride` floats apart, on the first `rot` dims (the cos/sin
   table's width, even: an odd rotary dim's table has one more column, and the torch step
   rotates them all): x*cos + rotate_half(x)*sin. The products go through volatiles so that
   -ffast-math cannot fuse them into an FMA: the same bits as torch's separate ops. */
void draft_rope(float *x, long stride, long rows, cf *cos_p, cf *sin_p, long rot) {
    const long half = rot / 2;
    for (long r = 0; r < rows; r++, x += stride)
        for (long j = 0; j < half; j++) {
            const float x1 = x[j], x2 = x[j + half];
            volatile float a = x1 * cos_p[j], b = x2 * sin_p[j];
            volatile float c = x2 * cos_p[j + half], e = x1 * sin_p[j + half];
            x[j] = a - b;
            x[j + half] = c + e;
        }
}

/* one attention layer + MLP on the residual x [hid] at position pos */
void draft_attention_layer(float *x, cf *in_norm, cf *post_norm, cf *qkv_t, cf *q_norm,
                           cf *k_norm, cf *o_t, cf *gate_up_t, cf *down_t, float *kc, float *vc,
                           cf *cos_p, cf *sin_p, long pos, long cap, long hid, long hq, long hkv,
                           long d, long rot, long gated, long inter, float eps, long zc) {
    const long qw = hq * d * (gated ? 2 : 1), width = qw + 2 * hkv * d;
    float *h = malloc(sizeof(float) * (hid + width + 2 * hq * d + hid + pos + 1));
    float *qkv = h + hid, *q = qkv + width, *o = q + hq * d, *a = o + hq * d, *p = a + hid;
    rmsnorm(x, in_norm, h, hid, eps, zc);
    gemv(h, qkv_t, qkv, hid, width);
    for (long i = 0; i < hq; i++)
        rmsnorm(qkv + i * d * (gated ? 2 : 1), q_norm, q + i * d, d, eps, zc);
    draft_rope(q, d, hq, cos_p, sin_p, rot);
    for (long g = 0; g < hkv; g++) {
        float *kr = kc + (g * cap + pos) * d, *vr = vc + (g * cap + pos) * d;
        rmsnorm(qkv + qw + g * d, k_norm, kr, d, eps, zc);
        for (long j = 0; j < d; j++) vr[j] = qkv[qw + hkv * d + g * d + j];
    }
    draft_rope(kc + pos * d, cap * d, hkv, cos_p, sin_p, rot);
    const float scale = 1.0f / sqrtf((float)d);
    for (long i = 0; i < hq; i++) {
        const long g = i / (hq / hkv);
        cf *qi = q + i * d, *kg = kc + g * cap * d, *vg = vc + g * cap * d;
        float mx = -INFINITY, sum = 0.0f;
        for (long t = 0; t <= pos; t++) {
            float s = 0.0f;
            for (long j = 0; j < d; j++) s += qi[j] * kg[t * d + j];
            p[t] = s * scale;
            if (p[t] > mx) mx = p[t];
        }
        for (long t = 0; t <= pos; t++) {
            p[t] = expf(p[t] - mx);
            sum += p[t];
        }
        float *oi = o + i * d;
        for (long j = 0; j < d; j++) oi[j] = 0.0f;
        for (long t = 0; t <= pos; t++) {
            const float w = p[t] / sum;
            for (long j = 0; j < d; j++) oi[j] += w * vg[t * d + j];
        }
        if (gated)
            for (long j = 0; j < d; j++) oi[j] *= sigmoid(qkv[i * 2 * d + d + j]);
    }
    gemv(o, o_t, a, hq * d, hid);
    for (long i = 0; i < hid; i++) x[i] += a[i];
    free(h);
    mlp(x, post_norm, gate_up_t, down_t, hid, inter, eps, (int)zc);
}

/* one Gated DeltaNet layer + MLP; reads window/ssm, writes new_window/new_ssm */
void draft_gdn_layer(float *x, cf *in_norm, cf *post_norm, cf *proj_t, cf *conv_w, cf *a_log,
                     cf *dt_bias, cf *gnorm, cf *out_t, cf *gate_up_t, cf *down_t, cf *window,
                     float *new_window, cf *ssm, float *new_ssm, long hid, long nk, long nv,
                     long dk, long dv, long wlen, long inter, float eps, long zc) {
    const long kd = nk * dk, vd = nv * dv, c = 2 * kd + vd, width = c + vd + 2 * nv;
    float *h = malloc(sizeof(float) * (hid + width + c + vd + hid + dv));
    float *proj = h + hid, *mixed = proj + width, *o = mixed + c, *a = o + vd, *tmp = a + hid;
    rmsnorm(x, in_norm, h, hid, eps, zc);
    gemv(h, proj_t, proj, hid, width);
    cf *z = proj + c, *bb = proj + c + vd, *aa = bb + nv;
    for (long ch = 0; ch < c; ch++) {
        float acc = 0.0f;
        for (long j = 0; j < wlen - 1; j++) acc += window[j * c + ch] * conv_w[ch * wlen + j];
        acc += proj[ch] * conv_w[ch * wlen + wlen - 1];
        mixed[ch] = silu(acc);
    }
    for (long j = 0; j + 1 < wlen - 1; j++)
        for (long ch = 0; ch < c; ch++) new_window[j * c + ch] = window[(j + 1) * c + ch];
    for (long ch = 0; ch < c; ch++) new_window[(wlen - 2) * c + ch] = proj[ch];
    float *q = mixed, *k = mixed + kd, *v = mixed + 2 * kd;
    for (long i = 0; i < 2 * nk; i++) { /* l2norm q and k heads; q scaled */
        float *r = mixed + i * dk, s = 0.0f;
        for (long j = 0; j < dk; j++) s += r[j] * r[j];
        const float f = (i < nk ? 1.0f / sqrtf((float)dk) : 1.0f) / sqrtf(s + 1e-6f);
        for (long j = 0; j < dk; j++) r[j] *= f;
    }
    const long rep = nv / nk;
    for (long hh = 0; hh < nv; hh++) {
        cf *qh = q + (hh / rep) * dk, *kh = k + (hh / rep) * dk, *vh = v + hh * dv;
        const float av = aa[hh] + dt_bias[hh];
        const float sp = av > 20.0f ? av : log1pf(expf(av));
        const float decay = expf(-expf(a_log[hh]) * sp), beta = sigmoid(bb[hh]);
        cf *s0 = ssm + hh * dk * dv;
        float *s1 = new_ssm + hh * dk * dv, *oh = o + hh * dv;
        for (long j = 0; j < dv; j++) tmp[j] = 0.0f;
        for (long i = 0; i < dk; i++)
            for (long j = 0; j < dv; j++) {
                s1[i * dv + j] = s0[i * dv + j] * decay;
                tmp[j] += s1[i * dv + j] * kh[i];
            }
        for (long j = 0; j < dv; j++) tmp[j] = (vh[j] - tmp[j]) * beta;
        for (long j = 0; j < dv; j++) oh[j] = 0.0f;
        for (long i = 0; i < dk; i++)
            for (long j = 0; j < dv; j++) {
                s1[i * dv + j] += kh[i] * tmp[j];
                oh[j] += s1[i * dv + j] * qh[i];
            }
        rmsnorm(oh, gnorm, oh, dv, eps, 0);
        for (long j = 0; j < dv; j++) oh[j] *= silu(z[hh * dv + j]);
    }
    gemv(o, out_t, a, vd, hid);
    for (long i = 0; i < hid; i++) x[i] += a[i];
    free(h);
    mlp(x, post_norm, gate_up_t, down_t, hid, inter, eps, (int)zc);
}

/* final norm, lm_head, argmax; logits [vocab] written too */
long draft_head(cf *x, cf *final_norm, cf *lm_t, float *logits, long hid, long vocab, float eps,
                long zc) {
    float *h = malloc(sizeof(float) * hid);
    rmsnorm(x, final_norm, h, hid, eps, (int)zc);
    gemv(h, lm_t, logits, hid, vocab);
    free(h);
    long best = 0;
    for (long i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}
"""
FLAGS = ["-O3", "-ffast-math", "-fPIC", "-shared"]
_lib: ctypes.CDLL | None = None
unavailable: str | None = None


def load() -> ctypes.CDLL | None:
    """The compiled library (built on first use), or None and `unavailable` says why."""
    global _lib, unavailable
    if _lib is None and unavailable is None:
        if os.environ.get("SPECDASH_CPU_DRAFT") == "0":
            unavailable = "SPECDASH_CPU_DRAFT=0"
            return None
        try:
            dll = cpu_gemm.compile_library("cpu_draft", SOURCE, FLAGS)
        except (OSError, subprocess.SubprocessError) as exc:
            unavailable = f"{type(exc).__name__}: {exc}"
            return None
        p, i, f = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
        dll.draft_attention_layer.argtypes = [p] * 13 + [i] * 8 + [i, f, i]
        dll.draft_attention_layer.restype = None
        dll.draft_gdn_layer.argtypes = [p] * 15 + [i] * 7 + [f, i]
        dll.draft_gdn_layer.restype = None
        dll.draft_head.argtypes = [p] * 4 + [i, i, f, i]
        dll.draft_head.restype = ctypes.c_long
        dll.draft_rope.argtypes = [p, i, i, p, p, i]
        dll.draft_rope.restype = None
        _lib = dll
    return _lib


def supported(model: Model) -> bool:
    """The C step covers fp32 models on the CPU; anything else keeps the torch step."""
    return model.device.type == "cpu" and model.dtype == torch.float32 and load() is not None


class DraftStep:
    """`step(token, state)`: feed one token at `state.length`, advance the state, return the
    greedy next token (and keep the logits in `self.logits`)."""

    def __init__(self, model: Model) -> None:
        lib = load()
        assert lib is not None
        self.lib, self.model, cfg = lib, model, model.cfg
        self.logits = torch.empty(cfg.vocab_size)
        self.x = torch.empty(cfg.hidden_size)
        keep: list[Tensor] = []  # every tensor a pointer below refers to

        def ptr(t: Tensor) -> int:
            t = t.contiguous()
            keep.append(t)
            return t.data_ptr()

        self.calls: list[tuple[str, int, tuple[int, ...]]] = []  # (layer kind, index, pointers)
        for i, lw in enumerate(model.layers):
            mlp = (ptr(_kn(plain(lw.gate_up))), ptr(_kn(plain(lw.down))))
            m = lw.mixer
            if isinstance(m, AttentionWeights):
                self.calls.append(
                    ("attn", i, (ptr(lw.input_norm), ptr(lw.post_norm), ptr(_kn(plain(m.qkv))),
                     ptr(m.q_norm), ptr(m.k_norm), ptr(_kn(plain(m.o))), *mlp))
                )  # fmt: skip
            else:
                self.calls.append(
                    ("gdn", i, (ptr(lw.input_norm), ptr(lw.post_norm), ptr(_kn(plain(m.proj))),
                     ptr(m.conv), ptr(m.a_log.float()), ptr(m.dt_bias.float()), ptr(m.norm),
                     ptr(_kn(plain(m.out))), *mlp))
                )  # fmt: skip
        self.head = (ptr(model.final_norm), ptr(_kn(model.lm_head)))
        self.keep = keep

    def step(self, token: int, state: SeqState) -> int:
        cfg, lib, pos = self.model.cfg, self.lib, state.length
        x = self.x
        x.copy_(self.model.embed[token])
        xp, eps, zc = x.data_ptr(), cfg.rms_norm_eps, int(cfg.zero_centred_norm)
        hid, inter = cfg.hidden_size, cfg.intermediate_size
        rope = self.model.rope
        for kind, i, w in self.calls:
            if kind == "attn":
                cache = state.kv[i]
                lib.draft_attention_layer(
                    xp, *w[:6], w[6], w[7], cache.k.data_ptr(), cache.v.data_ptr(),
                    rope.cos[pos].data_ptr(), rope.sin[pos].data_ptr(), pos, cache.k.shape[1],
                    hid, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                    rope.cos.shape[-1], int(cfg.gated_attention), inter, eps, zc,
                )  # fmt: skip
            else:
                g = state.gdn[i]
                window, ssm = g.conv.contiguous(), g.ssm.contiguous()
                new_window, new_ssm = torch.empty_like(window), torch.empty_like(ssm)
                lib.draft_gdn_layer(
                    xp, *w[:8], w[8], w[9], window.data_ptr(), new_window.data_ptr(),
                    ssm.data_ptr(), new_ssm.data_ptr(), hid, cfg.linear_num_key_heads,
                    cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                    cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim, inter, eps, zc,
                )  # fmt: skip
                g.conv, g.ssm = new_window, new_ssm
        state.length += 1
        return int(
            lib.draft_head(xp, *self.head, self.logits.data_ptr(), hid, cfg.vocab_size, eps, zc)
        )
