"""The native decoder: Qwen3 (dense) and Qwen3-Next / Qwen3.5 (Gated DeltaNet + gated attention).

Plain tensors, no nn.Module: weights are kept in the layout the forward wants (q/k/v,
GDN input and gate/up projections fused into one GEMM each), built from Hugging Face
tensor names by `Model.from_tensors`, which uses only differentiable ops so the
training script can reuse it.

`forward` has three modes, one per way rows are computed:
  * ``prefill``: all prompt rows batched (SDPA, chunked GDN). Shared by the speculative
    run and the shadow, so it need not match decode.
  * ``exact``: every row computed as decode computes that position (see `ops`). Decode is
    `exact` with one row; an exact verify is `exact` with k+1 rows.
  * ``fast``: one batched verify pass the usual way (batched GEMMs and SDPA).

Why each sub-op is exact on each path, and which test proves it: docs/exactness.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

import torch

from specdash.engine import gemm_backends, ops
from specdash.engine.config import ModelConfig
from specdash.engine.state import GdnSteps, SeqState
from specdash.errors import UsageError

Tensor = torch.Tensor
Mode = Literal["prefill", "exact", "fast"]
PREFILL_CHUNK = 16384
"""Prompt tokens per prefill pass. Activations grow with the tokens in a pass (a 131072-token
pass of the 27B shape would hold ~9 GB in the gate/up projection alone, next to 51 GB of
weights); chunks keep them bounded, and the GEMMs stay compute-bound at this size."""
Observer = Callable[[int, str, Tensor], Tensor]
"""Called as `observer(layer, sub_op, rows)` after each sub-op; returns the rows to use.

Root-cause analysis records with it; fault-injection tests perturb with it. Layer -1 is
the embedding, `num_layers` the head (final norm, lm_head, log_softmax).
"""


@dataclass(slots=True)
class AttentionWeights:
    qkv: Tensor
    o: Tensor
    q_norm: Tensor
    k_norm: Tensor


@dataclass(slots=True)
class GdnWeights:
    proj: Tensor  # [qkv | z | b | a] rows
    conv: Tensor  # [C, W]
    a_log: Tensor
    dt_bias: Tensor
    norm: Tensor
    out: Tensor


@dataclass(slots=True)
class LayerWeights:
    input_norm: Tensor
    post_norm: Tensor
    mixer: AttentionWeights | GdnWeights
    gate_up: Tensor
    down: Tensor


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `cfg` must hold, by Hugging Face name."""
    p, h = cfg.weight_prefix, cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {f"{p}embed_tokens.weight": (cfg.vocab_size, h)}
    for i, lt in enumerate(cfg.layer_types):
        lp = f"{p}layers.{i}."
        shapes[f"{lp}input_layernorm.weight"] = (h,)
        shapes[f"{lp}post_attention_layernorm.weight"] = (h,)
        if lt == "full_attention":
            d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            q_out = hq * d * (2 if cfg.gated_attention else 1)
            shapes |= {
                f"{lp}self_attn.q_proj.weight": (q_out, h),
                f"{lp}self_attn.k_proj.weight": (hkv * d, h),
                f"{lp}self_attn.v_proj.weight": (hkv * d, h),
                f"{lp}self_attn.o_proj.weight": (h, hq * d),
                f"{lp}self_attn.q_norm.weight": (d,),
                f"{lp}self_attn.k_norm.weight": (d,),
            }
        else:
            la, hv = f"{lp}linear_attn.", cfg.linear_num_value_heads
            if cfg.family == "qwen3_next":
                shapes[f"{la}in_proj_qkvz.weight"] = (cfg.gdn_conv_dim + cfg.gdn_value_dim, h)
                shapes[f"{la}in_proj_ba.weight"] = (2 * hv, h)
            else:
                shapes[f"{la}in_proj_qkv.weight"] = (cfg.gdn_conv_dim, h)
                shapes[f"{la}in_proj_z.weight"] = (cfg.gdn_value_dim, h)
                shapes[f"{la}in_proj_b.weight"] = (hv, h)
                shapes[f"{la}in_proj_a.weight"] = (hv, h)
            shapes |= {
                f"{la}conv1d.weight": (cfg.gdn_conv_dim, 1, cfg.linear_conv_kernel_dim),
                f"{la}dt_bias": (hv,),
                f"{la}A_log": (hv,),
                f"{la}norm.weight": (cfg.linear_value_head_dim,),
                f"{la}out_proj.weight": (h, cfg.gdn_value_dim),
            }
        shapes |= {
            f"{lp}mlp.gate_proj.weight": (cfg.intermediate_size, h),
            f"{lp}mlp.up_proj.weight": (cfg.intermediate_size, h),
            f"{lp}mlp.down_proj.weight": (h, cfg.intermediate_size),
        }
    shapes[f"{p}norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def random_tensors(
    cfg: ModelConfig, seed: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, Tensor]:
    """Random weights of `cfg` by HF name, scaled so activations stay O(1) over many layers."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in hf_tensor_shapes(cfg).items():
        if name.endswith("A_log"):
            t = torch.empty(shape, device=device).uniform_(0, 4, generator=gen).log()
        elif name.endswith("dt_bias"):
            t = torch.ones(shape, device=device)
        elif len(shape) == 1:
            # zero-centred norms start at w=0 (scale 1); plain ones otherwise
            zero = cfg.zero_centred_norm and not name.endswith("linear_attn.norm.weight")
            t = (torch.zeros if zero else torch.ones)(shape, device=device)
        elif name.endswith("conv1d.weight"):
            t = torch.randn(shape, generator=gen, device=device) * 0.5
        else:
            t = torch.randn(shape, generator=gen, device=device) * shape[-1] ** -0.5
            if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
                t = t / (2 * cfg.num_hidden_layers) ** 0.5
        out[name] = t.to(dtype)
    return out


class Model:
    def __init__(
        self,
        cfg: ModelConfig,
        embed: Tensor,
        layers: list[LayerWeights],
        final_norm: Tensor,
        lm_head: Tensor,
        gemm: gemm_backends.GemmBackend,
    ) -> None:
        self.cfg, self.embed, self.layers = cfg, embed, layers
        self.final_norm, self.lm_head, self.gemm = final_norm, lm_head, gemm
        self.dtype, self.device = embed.dtype, embed.device
        # Built once for every position the model supports and never rebound: captured CUDA
        # graphs hold these tables' addresses.
        n_pos = cfg.max_position_embeddings
        r = cfg.rotary_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1).to(embed.device)
        self._rope_cos, self._rope_sin = emb.cos().to(embed.dtype), emb.sin().to(embed.dtype)
        self._arange = torch.arange(n_pos, device=embed.device)
        self.triton_rows = embed.is_cuda and _triton_rows_supported(cfg)
        """Exact rows through specdash.kernels (GPU); else the per-row torch ops, also exact."""

    @classmethod
    def from_tensors(
        cls, cfg: ModelConfig, t: dict[str, Tensor], gemm: gemm_backends.GemmBackend | None = None
    ) -> Model:
        p = cfg.weight_prefix
        layers = []
        for i, lt in enumerate(cfg.layer_types):
            lp = f"{p}layers.{i}."
            mixer: AttentionWeights | GdnWeights
            if lt == "full_attention":
                a = f"{lp}self_attn."
                qkv = torch.cat([t[f"{a}{n}_proj.weight"] for n in "qkv"])
                mixer = AttentionWeights(
                    qkv, t[f"{a}o_proj.weight"], t[f"{a}q_norm.weight"], t[f"{a}k_norm.weight"]
                )
            else:
                la = f"{lp}linear_attn."
                mixer = GdnWeights(
                    proj=torch.cat(_gdn_in_proj(cfg, t, la)),
                    conv=t[f"{la}conv1d.weight"][:, 0],
                    a_log=t[f"{la}A_log"],
                    dt_bias=t[f"{la}dt_bias"],
                    norm=t[f"{la}norm.weight"],
                    out=t[f"{la}out_proj.weight"],
                )
            layers.append(
                LayerWeights(
                    input_norm=t[f"{lp}input_layernorm.weight"],
                    post_norm=t[f"{lp}post_attention_layernorm.weight"],
                    mixer=mixer,
                    gate_up=torch.cat(
                        [t[f"{lp}mlp.gate_proj.weight"], t[f"{lp}mlp.up_proj.weight"]]
                    ),
                    down=t[f"{lp}mlp.down_proj.weight"],
                )
            )
        embed = t[f"{p}embed_tokens.weight"]
        lm_head = embed if cfg.tie_word_embeddings else t["lm_head.weight"]
        gemm = gemm or gemm_backends.resolve("auto", embed.device)
        return cls(cfg, embed, layers, t[f"{p}norm.weight"], lm_head, gemm)

    @classmethod
    def random(
        cls,
        cfg: ModelConfig,
        seed: int,
        dtype: torch.dtype,
        device: torch.device,
        gemm: gemm_backends.GemmBackend | None = None,
    ) -> Model:
        """Random weights of `cfg` (a shape preset) built on `device`; for benchmarks."""
        model = cls.from_tensors(cfg, random_tensors(cfg, seed, dtype, str(device)), gemm)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the unfused copies are gone
        return model

    @property
    def step_weight_bytes(self) -> int:
        """Bytes of GEMM weights a decode step reads (the embedding is gathered, not read)."""
        mats = [self.lm_head]
        for lw in self.layers:
            mats += [lw.gate_up, lw.down]
            mixer = [getattr(lw.mixer, f.name) for f in fields(lw.mixer)]
            mats += [t for t in mixer if t.dim() == 2 and t is not getattr(lw.mixer, "conv", None)]
        return sum(t.numel() * t.element_size() for t in mats)

    # ------------------------------------------------------------------ rope

    def _positions(self, state: SeqState, n: int) -> slice | Tensor:
        """Positions of the n new rows: a slice on CPU, a device tensor read at run time on
        CUDA (from `state.position`), so a captured graph is valid at every length."""
        if state.position is None:
            return slice(state.length, state.length + n)
        return state.position + self._arange[:n]

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        tokens: Tensor,
        state: SeqState,
        mode: Mode,
        observe: Observer | None = None,
        all_logits: bool = False,
    ) -> Tensor:
        """Run `tokens` [T] at positions state.length.. and return fp32 log-probs.

        Returns [T, V] (for prefill only the last row unless `all_logits`). Prefill
        updates `state` in place, PREFILL_CHUNK tokens per pass unless observed; exact/fast
        leave the GDN steps pending for `state.commit(rows)`.
        """
        t_len, start = tokens.shape[0], state.length
        if start + t_len > min(state.capacity, self.cfg.max_position_embeddings):
            raise UsageError(
                f"sequence of {start + t_len} tokens exceeds the allocated context of "
                f"{state.capacity} or the model's {self.cfg.max_position_embeddings} positions"
            )
        if state.graphs is not None and self.triton_rows and mode != "prefill" and not observe:
            from specdash.engine.graphs import graphed_forward

            return graphed_forward(self, tokens, state, mode)
        if mode == "prefill" and t_len > PREFILL_CHUNK and observe is None:
            out = [
                self.forward_eager(tokens[c : c + PREFILL_CHUNK], state, mode, None, all_logits)
                for c in range(0, t_len, PREFILL_CHUNK)
            ]
            return torch.cat(out) if all_logits else out[-1]
        return self.forward_eager(tokens, state, mode, observe, all_logits)

    def forward_eager(
        self,
        tokens: Tensor,
        state: SeqState,
        mode: Mode,
        observe: Observer | None = None,
        all_logits: bool = False,
    ) -> Tensor:
        t_len = tokens.shape[0]
        exact = mode == "exact"
        rows = self.triton_rows and mode != "prefill"
        """Decode/verify rows through specdash.kernels' fused row kernels (graph-safe)."""
        obs = observe or _identity
        x = obs(-1, "embed", self.embed[tokens])
        # the row kernels read positions on the device themselves; the torch path gathers here
        pos = None if rows else self._positions(state, t_len)
        cos, sin = (None, None) if pos is None else (self._rope_cos[pos], self._rope_sin[pos])
        head = len(self.layers)
        norms = [lw.input_norm for lw in self.layers[1:]] + [self.final_norm]
        h = obs(0, "input_norm", self._norm(x, self.layers[0].input_norm, exact, rows))
        for i, lw in enumerate(self.layers):
            if isinstance(lw.mixer, AttentionWeights):
                a = self._attention(i, lw.mixer, h, state, pos, cos, sin, mode, obs)
            else:
                a = self._gdn(i, lw.mixer, h, state, mode, obs)
            at = ((i, "mixer_residual"), (i, "post_norm"))
            x, h = self._residual_norm(x, a, lw.post_norm, rows, exact, obs, *at)
            gu = obs(i, "gate_up_proj", self._linear(h, lw.gate_up, mode))
            m = obs(i, "down_proj", self._linear(self._swiglu(gu, rows), lw.down, mode))
            at = ((i, "output"), (i + 1, "input_norm") if i + 1 < head else (head, "final_norm"))
            x, h = self._residual_norm(x, m, norms[i], rows, exact, obs, *at)
        if mode == "prefill":
            state.advance(t_len)
            if not all_logits:
                h = h[-1:]
        logits = obs(head, "lm_head", self._linear(h, self.lm_head, mode))
        return obs(head, "log_softmax", ops.log_softmax(logits, exact))

    def _residual_norm(
        self,
        x: Tensor,
        a: Tensor,
        w: Tensor,
        rows: bool,
        exact: bool,
        obs: Observer,
        sum_at: tuple[int, str],
        norm_at: tuple[int, str],
    ) -> tuple[Tensor, Tensor]:
        """x + a and the norm after it: one kernel on the GPU row path. Observed at `sum_at`
        and `norm_at`; a sum an observer replaced (fault injection) is normed again."""
        if rows:
            from specdash.kernels.rmsnorm import add_rms_norm_rows

            eps, zc = self.cfg.rms_norm_eps, self.cfg.zero_centred_norm
            s, h = add_rms_norm_rows(a, x, w, eps, zc)
            seen = obs(*sum_at, s)
            if seen is not s:
                s, h = seen, self._norm(seen, w, exact, rows)
        else:
            s = obs(*sum_at, x + a)
            h = self._norm(s, w, exact, rows)
        return s, obs(*norm_at, h)

    def _swiglu(self, gate_up: Tensor, rows: bool) -> Tensor:
        if rows:
            from specdash.kernels.elementwise import swiglu_rows

            return swiglu_rows(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return ops.silu(gate) * up

    def _linear(self, x: Tensor, w: Tensor, mode: Mode) -> Tensor:
        """Prefill is shared by both runs, so it takes the plain batched GEMM (cuBLAS on GPU);
        decode and verify take the session's backend, row by row unless batch-invariant."""
        if mode == "prefill":
            return torch.nn.functional.linear(x, w)
        return self.gemm(x, w, mode == "exact")

    def _norm(self, x: Tensor, w: Tensor, exact: bool, rows: bool) -> Tensor:
        if rows:
            from specdash.kernels.rmsnorm import rms_norm_rows

            return rms_norm_rows(x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm)
        return ops.rms_norm(x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm, exact)

    def _attention(
        self,
        i: int,
        w: AttentionWeights,
        h: Tensor,
        state: SeqState,
        pos: slice | Tensor | None,
        cos: Tensor,
        sin: Tensor,
        mode: Mode,
        obs: Observer,
    ) -> Tensor:
        cfg, t_len, exact = self.cfg, h.shape[0], mode == "exact"
        d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = obs(i, "qkv_proj", self._linear(h, w.qkv, mode))
        cache, scale = state.kv[i], d**-0.5
        gated = cfg.gated_attention
        q_width = hq * d * (2 if gated else 1)
        if pos is None:  # the GPU row path: norms, RoPE and the cache write in one kernel
            from specdash.kernels.decode_attention import verify_as_decode_rows
            from specdash.kernels.elementwise import sigmoid_gate_rows
            from specdash.kernels.rope import qk_norm_rope_rows

            position = state.position
            if position is None:  # an eager CPU state (the kernels' interpreter tests)
                position = torch.tensor([state.length], device=h.device)
            q = qk_norm_rope_rows(
                qkv, hq, hkv, gated, w.q_norm, w.k_norm, cfg.rms_norm_eps,
                cfg.zero_centred_norm, self._rope_cos, self._rope_sin, position,
                cache.k, cache.v,
            )  # fmt: skip
            # fixed-split decode kernel; verify rows are decode rows of lengths L+1..L+T
            o = verify_as_decode_rows(q[None], cache.k[None], cache.v[None], position, scale)
            o = obs(i, "attention", o[0].reshape(t_len, hq * d))
            if gated:
                gate = qkv[:, :q_width].view(t_len, hq, 2 * d)[..., d:]
                o = sigmoid_gate_rows(o.view(t_len, hq, d), gate).view(t_len, hq * d)
            return obs(i, "o_proj", self._linear(o, w.o, mode))
        q, k, v = qkv.split([q_width, hkv * d, hkv * d], dim=-1)
        gate = None
        if gated:
            q, gate = q.view(t_len, hq, 2 * d).chunk(2, dim=-1)
            gate = gate.reshape(t_len, hq * d)
        q = self._norm(q.reshape(t_len, hq, d), w.q_norm, exact, False)
        k = self._norm(k.reshape(t_len, hkv, d), w.k_norm, exact, False)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        v = v.view(t_len, hkv, d)
        if isinstance(pos, slice):
            cache.k[:, pos] = k.transpose(0, 1)
            cache.v[:, pos] = v.transpose(0, 1)
            start = pos.start
        else:
            cache.k.index_copy_(1, pos, k.transpose(0, 1))
            cache.v.index_copy_(1, pos, v.transpose(0, 1))
            start = state.length
        if mode == "exact":
            o = ops.attention_decode_rows(q, cache.k, cache.v, start, scale)
        else:
            o = ops.attention_batched(q, cache.k, cache.v, start, scale)
        o = obs(i, "attention", o.reshape(t_len, hq * d))
        if gate is not None:
            o = o * ops.sigmoid(gate)
        return obs(i, "o_proj", self._linear(o, w.o, mode))

    def _gdn(
        self, i: int, w: GdnWeights, h: Tensor, state: SeqState, mode: Mode, obs: Observer
    ) -> Tensor:
        cfg, t_len, exact = self.cfg, h.shape[0], mode == "exact"
        nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        rows = self.triton_rows and mode != "prefill"
        proj = obs(i, "in_proj", self._linear(h, w.proj, mode))
        qkv, z, b, a = proj.split([cfg.gdn_conv_dim, cfg.gdn_value_dim, nv, nv], dim=-1)
        st = state.gdn[i]
        if rows:
            from specdash.kernels.elementwise import causal_conv_silu_rows

            mixed, conv_seq = causal_conv_silu_rows(st.conv, qkv, w.conv)
        else:
            conv_seq = torch.cat((st.conv, qkv), dim=0)
            mixed = ops.causal_conv_silu(st.conv, qkv, w.conv)
        mixed = obs(i, "conv", mixed)
        q, k, v = mixed.split([cfg.gdn_key_dim, cfg.gdn_key_dim, cfg.gdn_value_dim], dim=-1)
        q, k, v = q.view(t_len, nk, dk), k.view(t_len, nk, dk), v.view(t_len, nv, dv)
        z = z.view(t_len, nv, dv)
        if rows:
            # one Triton recurrent-step kernel for decode and verify, then the gated norm
            from specdash.kernels.gdn import gdn_verify_steps
            from specdash.kernels.rmsnorm import gated_rms_norm_rows

            o, steps = gdn_verify_steps(
                q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, st.ssm[None]
            )
            state.pending[i] = GdnSteps(conv_seq, steps[0])
            o = obs(i, "recurrent", o[0])
            o = gated_rms_norm_rows(o, z, w.norm, cfg.rms_norm_eps)
        else:
            if mode == "prefill" and self.triton_rows:
                # FLA's chunked kernel when fla-core imports, else the same torch chunked form
                from specdash.kernels.gdn import gdn_prefill

                o, final = gdn_prefill(
                    q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, st.ssm[None]
                )
                o = o[0]
                state.store_gdn(i, conv_seq[t_len:], final[0])
            else:
                q = ops.l2norm(q, exact) * dk**-0.5
                k = ops.l2norm(k, exact)
                if nv != nk:
                    q, k = (x.repeat_interleave(nv // nk, dim=1) for x in (q, k))
                decay, beta = ops.gdn_gates(a, b, w.a_log, w.dt_bias)
                if mode == "prefill":
                    o, ssm = ops.gdn_chunked(q, k, v.float(), decay, beta, st.ssm)
                    state.store_gdn(i, conv_seq[t_len:], ssm)
                else:
                    o, steps = ops.gdn_recurrent_steps(q, k, v.float(), decay, beta, st.ssm)
                    state.pending[i] = GdnSteps(conv_seq, steps)
            o = obs(i, "recurrent", o).to(h.dtype)
            o = ops.gated_rms_norm(o, z, w.norm, cfg.rms_norm_eps, exact)
        o = obs(i, "gated_norm", o.reshape(t_len, nv * dv))
        return obs(i, "out_proj", self._linear(o, w.out, mode))


def _triton_rows_supported(cfg: ModelConfig) -> bool:
    """Shapes specdash.kernels' attention and GDN kernels take; others warn once and run the
    per-row torch path, which is exact too (same op, same shape per row), only slower."""
    pow2 = cfg.head_dim >= 16 and cfg.head_dim & (cfg.head_dim - 1) == 0
    dk = cfg.linear_key_head_dim
    gdn = not cfg.has_gdn or (dk & (dk - 1) == 0 and cfg.linear_value_head_dim % 32 == 0)
    if not (pow2 and gdn):
        warnings.warn(
            f"head dims (attention {cfg.head_dim}, GDN {dk}/{cfg.linear_value_head_dim}) are "
            "outside the Triton row kernels; exact rows run per row in torch",
            RuntimeWarning,
            stacklevel=3,
        )
    return pow2 and gdn


def _identity(layer: int, name: str, x: Tensor) -> Tensor:
    return x


def _gdn_in_proj(cfg: ModelConfig, t: dict[str, Tensor], la: str) -> list[Tensor]:
    """[W_qkv, W_z, W_b, W_a] in the Qwen3.5 layout, converting Qwen3-Next's per-head interleave."""
    if cfg.family != "qwen3_next":
        return [t[f"{la}in_proj_{n}.weight"] for n in ("qkv", "z", "b", "a")]
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    qkvz = t[f"{la}in_proj_qkvz.weight"].view(nk, 2 * dk + 2 * r * dv, -1)
    q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
    ba = t[f"{la}in_proj_ba.weight"].view(nk, 2 * r, -1)
    b, a = ba.split([r, r], dim=1)
    hidden = qkvz.shape[-1]
    qkv = torch.cat([x.reshape(-1, hidden) for x in (q, k, v)])
    return [qkv, z.reshape(-1, hidden), b.reshape(-1, hidden), a.reshape(-1, hidden)]
