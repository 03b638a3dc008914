"""The native decoder: Qwen3 (dense) and Qwen3-Next / Qwen3.5 (Gated DeltaNet + gated attention).

Plain tensors, no nn.Module: weights are kept in the layout the forward wants (q/k/v,
GDN input and gate/up projections fused into one GEMM each), built from Hugging Face
tensor names by `Model.from_tensors`, which uses only differentiable ops so the
training script can reuse it.

`forward` has three modes, one per way rows are computed, each by a `rows.Rows`
implementation chosen once at construction (`rows.row_implementations`):
  * ``prefill``: all prompt rows batched (SDPA, chunked GDN). Shared by the speculative
    run and the shadow, so it need not match decode.
  * ``exact``: every row computed as decode computes that position (torch rows on the CPU,
    Triton row kernels on CUDA). Decode is `exact` with one row; an exact verify is `exact`
    with k+1 rows.
  * ``fast``: one batched verify pass the usual way (batched GEMMs, norms and SDPA), on
    every device.

Why each sub-op is exact on each path, and which test proves it: docs/exactness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from itertools import groupby
from operator import itemgetter

import torch

from specdash.engine import ops
from specdash.engine.config import ModelConfig
from specdash.engine.rows import (
    Mode,
    Rope,
    Rows,
    Run,
    attention_gate,
    cat_rows,
    row_implementations,
)
from specdash.engine.state import SeqState
from specdash.engine.weights import (
    SCALE_SUFFIX,
    AttentionWeights,
    GdnWeights,
    LayerWeights,
    Linear,
    dequantize_fp8,
    fuse,
    linear_weight,
    plain,
    weight_bytes,
)
from specdash.errors import UsageError
from specdash.kernels import gemm_backends
from specdash.kernels.fp8 import BLOCK, Fp8Weight, quantize_blocks

Tensor = torch.Tensor
PREFILL_CHUNK = 16384
"""Prompt tokens per prefill pass. Activations grow with the tokens in a pass (a 131072-token
pass of the 27B shape would hold ~9 GB in the gate/up projection alone, next to 51 GB of
weights); chunks keep them bounded, and the GEMMs stay compute-bound at this size."""
Observer = Callable[[int, str, Tensor], Tensor]
"""Called as `observer(layer, sub_op, rows)` after each sub-op; returns the rows to use.

Root-cause analysis records with it; fault-injection tests perturb with it. Layer -1 is
the embedding, `num_layers` the head (final norm, lm_head, log_softmax).
"""


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
    if cfg.quantization is not None:  # block FP8: a float32 scale per 128 x 128 weight block
        for name in [n for n in shapes if cfg.quantization.quantizes(n)]:
            n, k = shapes[name]
            shapes[name + SCALE_SUFFIX] = (-(-n // BLOCK), -(-k // BLOCK))
    return shapes


def random_tensors(
    cfg: ModelConfig, seed: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, Tensor]:
    """Random weights of `cfg` by HF name, scaled so activations stay O(1) over many layers;
    for a block-FP8 `cfg`, its linears quantized as such a checkpoint stores them (each as it
    is drawn: the 27B shape never holds its bf16 weights whole)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    quantized = cfg.quantization.quantizes if cfg.quantization is not None else lambda n: False
    for name, shape in hf_tensor_shapes(cfg).items():
        if name.endswith(SCALE_SUFFIX):
            continue  # made with its weight
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
        if quantized(name):
            out[name], out[name + SCALE_SUFFIX] = quantize_blocks(t)
        else:
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
        self.rope = Rope.build(cfg, embed.dtype, embed.device)
        self.rows: dict[Mode, Rows] = row_implementations(cfg, self.rope, embed.device)
        """How each mode computes its rows, chosen once (specdash.engine.rows)."""

    @classmethod
    def from_tensors(
        cls,
        cfg: ModelConfig,
        t: dict[str, Tensor],
        gemm: gemm_backends.GemmBackend | None = None,
        consume: bool = False,
    ) -> Model:
        """`consume`: drop each layer's tensors from `t` once its fused copies exist, so the
        unfused projections are freed layer by layer (the 27B shape's 51 GB of weights peak
        near 80 GB with every unfused copy alive: more than an H100 holds)."""
        p = cfg.weight_prefix
        layers = []
        for i, lt in enumerate(cfg.layer_types):
            lp = f"{p}layers.{i}."
            mixer: AttentionWeights | GdnWeights
            if lt == "full_attention":
                a = f"{lp}self_attn."
                qkv = fuse([linear_weight(t, f"{a}{n}_proj.weight") for n in "qkv"])
                o = linear_weight(t, f"{a}o_proj.weight")
                mixer = AttentionWeights(qkv, o, t[f"{a}q_norm.weight"], t[f"{a}k_norm.weight"])
            else:
                la = f"{lp}linear_attn."
                mixer = GdnWeights(
                    proj=fuse(_gdn_in_proj(cfg, t, la)),
                    conv=t[f"{la}conv1d.weight"][:, 0],
                    a_log=t[f"{la}A_log"],
                    dt_bias=t[f"{la}dt_bias"],
                    norm=t[f"{la}norm.weight"],
                    out=linear_weight(t, f"{la}out_proj.weight"),
                )
            mlp = f"{lp}mlp."
            layers.append(
                LayerWeights(
                    input_norm=t[f"{lp}input_layernorm.weight"],
                    post_norm=t[f"{lp}post_attention_layernorm.weight"],
                    mixer=mixer,
                    gate_up=fuse(
                        [linear_weight(t, f"{mlp}{n}_proj.weight") for n in ("gate", "up")]
                    ),
                    down=linear_weight(t, f"{mlp}down_proj.weight"),
                )
            )
            if consume:
                for key in [k for k in t if k.startswith(lp)]:
                    del t[key]
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
        """Random weights of `cfg` (a shape preset) built on `device`; for benchmarks. An FP8
        preset's weights are FP8 on CUDA and dequantized elsewhere, as a checkpoint's are."""
        tensors = random_tensors(cfg, seed, dtype, str(device))
        if device.type != "cuda":
            dequantize_fp8(tensors, dtype)
        model = cls.from_tensors(cfg, tensors, gemm, consume=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the unfused copies are gone
        return model

    @property
    def step_weight_bytes(self) -> int:
        """Bytes of GEMM weights a decode step reads (the embedding is gathered, not read):
        FP8 weights with their scales and unquantized rows."""
        mats: list[Linear] = [self.lm_head]
        for lw in self.layers:
            mats += [lw.gate_up, lw.down]
            mixer = [getattr(lw.mixer, f.name) for f in fields(lw.mixer) if f.name != "conv"]
            mats += [t for t in mixer if isinstance(t, Fp8Weight) or t.dim() == 2]
        return sum(weight_bytes(t) for t in mats)

    @property
    def has_fp8(self) -> bool:
        """Whether any linear weight is FP8: only a backend with FP8 GEMMs runs this model."""
        return any(
            isinstance(w, Fp8Weight)
            for lw in self.layers
            for w in (lw.gate_up, lw.down, *(getattr(lw.mixer, f.name) for f in fields(lw.mixer)))
        )

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
        t_len = tokens.shape[0]
        self.check_fits(state, t_len)
        if mode == "prefill" and t_len > PREFILL_CHUNK and observe is None:
            out = [
                self._forward_pass(tokens[c : c + PREFILL_CHUNK], state, mode, None, all_logits)
                for c in range(0, t_len, PREFILL_CHUNK)
            ]
            return torch.cat(out) if all_logits else out[-1]
        return self._forward_pass(tokens, state, mode, observe, all_logits)

    def check_fits(self, state: SeqState, t_len: int) -> None:
        """Refuse rows past the state's capacity or the model's positions: they would index the
        cache and the RoPE tables out of range."""
        end = state.length + t_len
        if end > min(state.capacity, self.cfg.max_position_embeddings):
            raise UsageError(
                f"sequence of {end} tokens exceeds the allocated context of "
                f"{state.capacity} or the model's {self.cfg.max_position_embeddings} positions"
            )

    def forward_batch(
        self,
        tokens: Tensor,
        states: list[SeqState],
        lens: list[int],
        mode: Mode,
        run: Run | None = None,
        observe: Observer | None = None,
    ) -> Tensor:
        """Decode or verify several sequences in one forward: `tokens` [sum(lens)] holds
        `lens[b]` rows of sequence b, at its own positions states[b].length.. . GEMMs, norms and
        elementwise ops take all rows at once (batch-invariant GEMMs and per-row reductions make
        every row's bits independent of its neighbours); attention and GDN run on each
        sequence's own state: consecutive slots of one pool with as many rows each in one launch
        per op (`Rows.run`), others one by one. Returns [sum(lens), V]; GDN steps stay pending
        per state (commit with `state.commit_batch`). `run`: every state as one prebuilt run (a
        captured batch's, whose slots and positions are device tensors). `observe`: as in
        `forward`, over every row of the batch."""
        assert mode != "prefill", "prefill runs per sequence"
        for state, n in zip(states, lens, strict=True):
            self.check_fits(state, n)
        return self._forward_pass(tokens, states, mode, observe, False, lens, run)

    def _forward_pass(
        self,
        tokens: Tensor,
        state: SeqState | list[SeqState],
        mode: Mode,
        observe: Observer | None = None,
        all_logits: bool = False,
        lens: list[int] | None = None,
        run: Run | None = None,
    ) -> Tensor:
        t_len, rows = tokens.shape[0], self.rows[mode]
        states = state if isinstance(state, list) else [state]
        runs = [run] if run is not None else self._runs(states, lens or [t_len], rows)
        obs = observe or _identity
        x = obs(-1, "embed", self.embed[tokens])
        head = len(self.layers)
        norms = [lw.input_norm for lw in self.layers[1:]] + [self.final_norm]
        h = obs(0, "input_norm", rows.rowwise.norm(x, self.layers[0].input_norm))
        for i, lw in enumerate(self.layers):
            if isinstance(lw.mixer, AttentionWeights):
                a = self._attention(i, lw.mixer, h, runs, mode, obs)
            else:
                a = self._gdn(i, lw.mixer, h, runs, mode, obs)
            at = ((i, "mixer_residual"), (i, "post_norm"))
            x, h = self._residual_norm(x, a, lw.post_norm, rows, obs, *at)
            m = obs(i, "down_proj", self._mlp(h, lw, rows, mode, obs, i))
            at = ((i, "output"), (i + 1, "input_norm") if i + 1 < head else (head, "final_norm"))
            x, h = self._residual_norm(x, m, norms[i], rows, obs, *at)
        if mode == "prefill":
            states[0].advance(t_len)
            if not all_logits:
                h = h[-1:]
        logits = obs(head, "lm_head", self._linear(h, self.lm_head, mode))
        return obs(head, "log_softmax", ops.log_softmax(logits, mode == "exact"))

    @staticmethod
    def _runs(states: list[SeqState], lens: list[int], rows: Rows) -> list[Run]:
        """Consecutive sequences with as many rows each step together (`Rows.run`)."""
        pairs = groupby(zip(states, lens, strict=True), key=itemgetter(1))
        return [rows.run([st for st, _ in group], n) for n, group in pairs]

    def _residual_norm(
        self,
        x: Tensor,
        a: Tensor,
        w: Tensor,
        rows: Rows,
        obs: Observer,
        sum_at: tuple[int, str],
        norm_at: tuple[int, str],
    ) -> tuple[Tensor, Tensor]:
        """x + a and the norm after it (one kernel on the Triton rows). Observed at `sum_at`
        and `norm_at`; a sum an observer replaced (fault injection) is normed again."""
        s, h = rows.rowwise.residual_norm(x, a, w)
        seen = obs(*sum_at, s)
        if seen is not s:
            s, h = seen, rows.rowwise.norm(seen, w)
        return s, obs(*norm_at, h)

    def _linear(self, x: Tensor, w: Linear, mode: Mode) -> Tensor:
        """Prefill is shared by both runs, so it takes the plain batched GEMM (cuBLAS on GPU;
        FP8 weights: the FP8 tile, which has no other); decode and verify take the session's
        backend, row by row unless batch-invariant."""
        if mode == "prefill" and not isinstance(w, Fp8Weight):
            return torch.nn.functional.linear(x, w)
        return self.gemm(x, w, mode == "exact")

    def _mlp(
        self, h: Tensor, lw: LayerWeights, rows: Rows, mode: Mode, obs: Observer, i: int
    ) -> Tensor:
        """down(swiglu(gate_up(h))): SwiGLU in the gate_up GEMM's epilogue where the backend
        has it and nothing observes gate_up, in down_proj's prologue for `triton-fused`, else
        the row kernel between them."""
        fused = self._fused(mode)
        swiglu_gemm = self.gemm.gate_up_swiglu if mode == "exact" else None
        gate_up = lw.gate_up  # FP8: the FP8 tile, which has no SwiGLU epilogue
        if fused is None and swiglu_gemm and isinstance(gate_up, Tensor) and obs is _identity:
            return self._linear(swiglu_gemm(h, gate_up), lw.down, mode)
        gu = obs(i, "gate_up_proj", self._linear(h, lw.gate_up, mode))
        if fused is not None:
            return fused.swiglu(gu, plain(lw.down))
        return self._linear(rows.rowwise.swiglu(gu), lw.down, mode)

    def _fused(self, mode: Mode) -> gemm_backends.FusedGemms | None:
        """The backend's GEMMs with the row op before them computed in their operand loads, for
        exact rows (decode and verify alike); prefill and fast verify keep the unfused ops."""
        return self.gemm.fused if mode == "exact" else None

    def _attention(
        self, i: int, w: AttentionWeights, h: Tensor, runs: list[Run], mode: Mode, obs: Observer
    ) -> Tensor:
        rows = self.rows[mode]
        qkv = obs(i, "qkv_proj", self._linear(h, w.qkv, mode))
        parts = qkv.split([r.size for r in runs])
        o = cat_rows([rows.attention.run(p, w, i, r) for p, r in zip(parts, runs, strict=True)])
        o = obs(i, "attention", o)
        fused = self._fused(mode)
        if fused is not None and self.cfg.gated_attention:
            return obs(
                i, "o_proj", fused.sigmoid_gate(o, attention_gate(qkv, self.cfg), plain(w.o))
            )
        return obs(i, "o_proj", self._linear(rows.rowwise.output_gate(o, qkv), w.o, mode))

    def _gdn(
        self, i: int, w: GdnWeights, h: Tensor, runs: list[Run], mode: Mode, obs: Observer
    ) -> Tensor:
        cfg, t_len, rows = self.cfg, h.shape[0], self.rows[mode]
        nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        proj = obs(i, "in_proj", self._linear(h, w.proj, mode))
        qkv, z, b, a = proj.split([cfg.gdn_conv_dim, cfg.gdn_value_dim, nv, nv], dim=-1)
        sizes = [r.size for r in runs]
        if obs is _identity and all(rows.gdn.conv_in_gdn(r) for r in runs):  # no conv to observe
            per_run = zip(qkv.split(sizes), a.split(sizes), b.split(sizes), runs, strict=True)
            o = cat_rows([rows.gdn.conv_gdn_run(i, q, a_, b_, w, r) for q, a_, b_, r in per_run])
        else:
            parts = zip(qkv.split(sizes), runs, strict=True)
            convs = [rows.gdn.conv_run(p, w.conv, i, r) for p, r in parts]
            mixed = obs(i, "conv", cat_rows([m for m, _ in convs]))
            q, k, v = mixed.split([cfg.gdn_key_dim, cfg.gdn_key_dim, cfg.gdn_value_dim], dim=-1)
            q, k, v = q.view(t_len, nk, dk), k.view(t_len, nk, dk), v.view(t_len, nv, dv)
            splits = (x.split(sizes) for x in (q, k, v, a, b))
            qkvabs = zip(*splits, strict=True)
            o = cat_rows(
                [
                    rows.gdn.run(i, qkvab, w, r, cs)
                    for qkvab, r, (_, cs) in zip(qkvabs, runs, convs, strict=True)
                ]
            )
        o, z = obs(i, "recurrent", o), z.view(t_len, nv, dv)
        fused = self._fused(mode)
        if fused is not None:
            o = o.reshape(t_len, nv * dv).to(z.dtype)
            return obs(
                i, "out_proj", fused.gated_norm(o, z, w.norm, cfg.rms_norm_eps, plain(w.out))
            )
        o = obs(i, "gated_norm", rows.rowwise.gated_norm(o, z, w.norm).reshape(t_len, nv * dv))
        return obs(i, "out_proj", self._linear(o, w.out, mode))


def _identity(layer: int, name: str, x: Tensor) -> Tensor:
    return x


def _gdn_in_proj(cfg: ModelConfig, t: dict[str, Tensor], la: str) -> list[Linear]:
    """[W_qkv, W_z, W_b, W_a] in the Qwen3.5 layout, converting Qwen3-Next's per-head interleave
    (never FP8: `config` refuses a quantized Qwen3-Next)."""
    if cfg.family != "qwen3_next":
        return [linear_weight(t, f"{la}in_proj_{n}.weight") for n in ("qkv", "z", "b", "a")]
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    qkvz = t[f"{la}in_proj_qkvz.weight"].view(nk, 2 * dk + 2 * r * dv, -1)
    q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
    ba = t[f"{la}in_proj_ba.weight"].view(nk, 2 * r, -1)
    b, a = ba.split([r, r], dim=1)
    hidden = qkvz.shape[-1]
    qkv = torch.cat([x.reshape(-1, hidden) for x in (q, k, v)])
    return [qkv, z.reshape(-1, hidden), b.reshape(-1, hidden), a.reshape(-1, hidden)]
