"""How a forward computes its rows: one implementation per mode, picked once per model.

`Model` holds a `Rows` for each mode (`row_implementations`), as mini-sglang holds an attention
backend, and its forward is one straight line through it:

* `TorchRows` (exact, CPU): each row with decode's shapes, norms by a fixed-order sum.
* `TritonRows` (exact, CUDA): specdash.kernels' fused row kernels; positions read on the device.
* `BatchedRows` (fast, every device): one batched verify pass the usual way: torch's fused
  norms, one SDPA call over the k+1 rows, the GDN recurrence with batched norms.
* `PrefillRows` (prefill, CPU; `TritonPrefillRows` on CUDA, with the row kernels for its
  row-wise ops): batched, with the chunked GDN form.

Every implementation has the same small interface over n rows; what makes each exact, and the
test that proves it: docs/exactness.md.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch

from specdash.engine import ops
from specdash.engine.config import ModelConfig
from specdash.engine.state import GdnSteps, KVCache, PooledSteps, SeqState
from specdash.engine.weights import AttentionWeights, GdnWeights

Tensor = torch.Tensor
Mode = Literal["prefill", "exact", "fast"]
"""How a forward computes its rows; `row_implementations` gives one `Rows` per mode."""


@dataclass(frozen=True, slots=True)
class Rope:
    """cos/sin for every position the model supports. Built once and never rebound: captured
    CUDA graphs hold these tables' addresses."""

    cos: Tensor
    sin: Tensor
    arange: Tensor

    @classmethod
    def build(cls, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> Rope:
        n_pos, r = cfg.max_position_embeddings, cfg.rotary_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1).to(device)
        return cls(emb.cos().to(dtype), emb.sin().to(dtype), torch.arange(n_pos, device=device))

    def positions(self, state: SeqState, n: int) -> slice | Tensor:
        """Positions of the n new rows: a slice on an eager CPU state, a device tensor read at
        run time on CUDA (from `state.position`), so a captured graph is valid at every length."""
        if state.position is None:
            return slice(state.length, state.length + n)
        return state.position + self.arange[:n]


@dataclass(slots=True)
class Run:
    """Consecutive sequences of one forward with `rows` rows each. `pooled` when they are slots
    of one pool and the implementation steps slots together: then each op is one launch for
    the whole run, at the slots `pooled.slots` and lengths `starts`."""

    states: list[SeqState]
    rows: int
    pooled: PooledSteps | None = None
    starts: Tensor | None = None

    @property
    def size(self) -> int:
        """Rows of the whole run."""
        return len(self.states) * self.rows


def attention_gate(qkv: Tensor, cfg: ModelConfig) -> Tensor:
    """Gated attention's output gate [T, Hq, D]: a view of the q projection, whose head rows
    interleave each head's q and gate."""
    t_len, d, hq = qkv.shape[0], cfg.head_dim, cfg.num_attention_heads
    return qkv[:, : 2 * hq * d].view(t_len, hq, 2 * d)[..., d:]


def cat_rows(parts: list[Tensor]) -> Tensor:
    """The row blocks of several sequences (or runs) as one tensor; one block is returned as is."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class Rows(ABC):
    """The row-computing sub-ops of one mode: the model's GEMMs and observers stay outside."""

    graphable: bool = False
    """Reads every position on the device, so a CUDA graph of it is valid at every length."""
    steps_slots_together: bool = False
    """`run` steps slots of one pool in one launch per op, slots and positions read on the
    device, so a CUDA graph of a batch serves any slots of the pool (`graphs.CapturedBatch`)."""

    def __init__(self, cfg: ModelConfig, rope: Rope) -> None:
        self.cfg, self.rope = cfg, rope

    def run(self, states: list[SeqState], rows: int) -> Run:
        """The run of `states`, `rows` rows each; here stepped sequence by sequence."""
        return Run(states, rows)

    def attention_run(self, qkv: Tensor, w: AttentionWeights, i: int, run: Run) -> Tensor:
        """`attention` of layer i for every sequence of the run, over its own cache."""
        parts = qkv.split(run.rows)
        outs = [self.attention(p, w, st.kv[i], st) for p, st in zip(parts, run.states, strict=True)]
        return cat_rows(outs)

    def conv_run(
        self, qkv: Tensor, w: Tensor, i: int, run: Run
    ) -> tuple[Tensor, Tensor | list[Tensor]]:
        """`conv` of layer i for every sequence of the run: (outputs, each one's conv sequence)."""
        parts = qkv.split(run.rows)
        outs, seqs = [], []
        for p, st in zip(parts, run.states, strict=True):
            o, cs = self.conv(st.gdn[i].conv, p, w)
            outs.append(o)
            seqs.append(cs)
        return cat_rows(outs), seqs

    def gdn_run(
        self,
        i: int,
        qkvab: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
        w: GdnWeights,
        run: Run,
        conv_seqs: Tensor | list[Tensor],
    ) -> Tensor:
        """`gdn` of layer i for every sequence of the run, on its own state."""
        parts = zip(*(x.split(run.rows) for x in qkvab), strict=True)
        outs = [
            self.gdn(i, *p, w, st, cs)
            for p, st, cs in zip(parts, run.states, conv_seqs, strict=True)
        ]
        return cat_rows(outs)

    def conv_in_gdn(self, run: Run) -> bool:
        """Whether `conv_gdn_run` computes this run's conv inside its GDN launch (one launch
        fewer per GDN layer; the model then has no conv output to observe)."""
        return False

    def conv_gdn_run(
        self, i: int, qkv: Tensor, a: Tensor, b: Tensor, w: GdnWeights, run: Run
    ) -> Tensor:
        """`conv_run` then `gdn_run` of layer i in one launch, from the raw in_proj rows: for
        runs whose `conv_in_gdn` is True."""
        raise NotImplementedError(f"{type(self).__name__} runs the conv and GDN apart")

    @abstractmethod
    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        """RMSNorm of every row of x."""

    @abstractmethod
    def residual_norm(self, x: Tensor, a: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """(x + a, its RMSNorm)."""

    @abstractmethod
    def swiglu(self, gate_up: Tensor) -> Tensor:
        """silu(gate) * up of the fused [gate | up] projection."""

    @abstractmethod
    def attention(
        self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState
    ) -> Tensor:
        """q/k norm, RoPE, the K/V cache write and attention of each row over its prefix:
        [T, Hq*D], before the output gate."""

    @abstractmethod
    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        """`o * sigmoid(gate)` with the gate from the q projection (gated attention)."""

    @abstractmethod
    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """(causal conv + SiLU of the new rows, the window followed by the new inputs)."""

    @abstractmethod
    def gdn(
        self,
        i: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        b: Tensor,
        w: GdnWeights,
        state: SeqState,
        conv_seq: Tensor,
    ) -> Tensor:
        """The gated delta rule over the rows of layer i: the output, with the state after each
        row left pending for `state.commit` (prefill stores the final state instead)."""

    @abstractmethod
    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        """`w * rmsnorm(o) * silu(z)`, in z's dtype."""


class _TorchOps(Rows):
    """The torch implementations, exact (decode's shapes, fixed-order sums) or batched."""

    exact: bool

    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        cfg = self.cfg
        return ops.rms_norm(x, w, cfg.rms_norm_eps, cfg.zero_centred_norm, self.exact)

    def residual_norm(self, x: Tensor, a: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        s = x + a
        return s, self.norm(s, w)

    def swiglu(self, gate_up: Tensor) -> Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return ops.silu(gate) * up

    def attention(
        self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState
    ) -> Tensor:
        cfg, t_len = self.cfg, qkv.shape[0]
        d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q_width = hq * d * (2 if cfg.gated_attention else 1)
        q, k, v = qkv.split([q_width, hkv * d, hkv * d], dim=-1)
        if cfg.gated_attention:
            q = q.view(t_len, hq, 2 * d)[..., :d]
        pos = self.rope.positions(state, t_len)
        cos, sin = self.rope.cos[pos], self.rope.sin[pos]
        q = ops.apply_rope(self.norm(q.reshape(t_len, hq, d), w.q_norm), cos, sin)
        k = ops.apply_rope(self.norm(k.reshape(t_len, hkv, d), w.k_norm), cos, sin)
        v = v.view(t_len, hkv, d)
        if isinstance(pos, slice):
            cache.k[:, pos] = k.transpose(0, 1)
            cache.v[:, pos] = v.transpose(0, 1)
        else:
            cache.k.index_copy_(1, pos, k.transpose(0, 1))
            cache.v.index_copy_(1, pos, v.transpose(0, 1))
        return self._attend(q, cache, state, pos).reshape(t_len, hq * d)

    @abstractmethod
    def _attend(self, q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor) -> Tensor:
        """Rows q [T, Hq, D] at `pos` over the cache (already holding their own K/V)."""

    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        if not self.cfg.gated_attention:
            return o
        return o * ops.sigmoid(attention_gate(qkv, self.cfg).reshape(o.shape))

    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return ops.causal_conv_silu(window, qkv, w), torch.cat((window, qkv), dim=0)

    def _qk_gates(
        self, q: Tensor, k: Tensor, a: Tensor, b: Tensor, w: GdnWeights
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """l2-normed q (scaled) and k repeated to the v-heads, decay and beta (docs §3)."""
        q = ops.l2norm(q, self.exact) * self.cfg.linear_key_head_dim**-0.5
        k = ops.l2norm(k, self.exact)
        rep = self.cfg.linear_num_value_heads // self.cfg.linear_num_key_heads
        if rep != 1:
            q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
        return q, k, *ops.gdn_gates(a, b, w.a_log, w.dt_bias)

    def gdn(
        self,
        i: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        b: Tensor,
        w: GdnWeights,
        state: SeqState,
        conv_seq: Tensor,
    ) -> Tensor:
        q, k, decay, beta = self._qk_gates(q, k, a, b, w)
        o, steps = ops.gdn_recurrent_steps(q, k, v.float(), decay, beta, state.gdn[i].ssm)
        state.pending[i] = GdnSteps(conv_seq, steps)
        return o

    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        return ops.gated_rms_norm(o.to(z.dtype), z, w, self.cfg.rms_norm_eps, self.exact)


class TorchRows(_TorchOps):
    """Exact rows in torch: attention one row at a time over its own prefix, fixed-order sums.
    The CPU's exact path, and CUDA's for shapes outside the Triton kernels (not graphable: it
    slices the cache by the host-side length)."""

    exact = True

    def _attend(self, q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor) -> Tensor:
        scale = self.cfg.head_dim**-0.5
        return ops.attention_decode_rows(q, cache.k, cache.v, state.length, scale)


class BatchedRows(_TorchOps):
    """Fast verify on every device: one batched pass the usual way (torch's fused norms, one
    SDPA call over the k+1 rows), not exact, for comparison.

    With `device_positions` (CUDA) attention masks the whole cache by the positions on the
    device instead of slicing it by the host-side length, so fast verify is graphed like exact.
    """

    exact = False

    def __init__(self, cfg: ModelConfig, rope: Rope, device_positions: bool) -> None:
        super().__init__(cfg, rope)
        self.graphable = device_positions

    def _attend(self, q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor) -> Tensor:
        scale = self.cfg.head_dim**-0.5
        if not self.graphable:
            return ops.attention_batched(q, cache.k, cache.v, state.length, scale)
        assert isinstance(pos, Tensor), "device positions need a state with `position`"
        return ops.attention_masked(q, cache.k, cache.v, pos, scale)


class PrefillRows(BatchedRows):
    """Prefill, shared by the speculative run and its shadow, so it need not match decode:
    batched, and GDN in the chunked form, storing the final state. With `gdn_kernel` (CUDA, the
    kernels' shapes) GDN goes through `ops.gdn_prefill` (FLA's chunked kernel when
    fla-core imports, else the same torch chunked form)."""

    def __init__(self, cfg: ModelConfig, rope: Rope, gdn_kernel: bool) -> None:
        super().__init__(cfg, rope, device_positions=False)
        self.gdn_kernel = gdn_kernel

    def gdn(
        self,
        i: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        b: Tensor,
        w: GdnWeights,
        state: SeqState,
        conv_seq: Tensor,
    ) -> Tensor:
        ssm, t_len = state.gdn[i].ssm, q.shape[0]
        if self.gdn_kernel:
            o, final = ops.gdn_prefill(
                q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, ssm[None]
            )
            o, ssm = o[0], final[0]
        else:
            q, k, decay, beta = self._qk_gates(q, k, a, b, w)
            o, ssm = ops.gdn_chunked(q, k, v.float(), decay, beta, ssm)
        state.store_gdn(i, conv_seq[t_len:], ssm)
        return o


class _TritonElementwise(Rows):
    """The row-wise kernels of specdash.kernels: norms, SwiGLU, the output gate, the causal conv
    and the gated norm, one program per row (or row block) for any number of rows."""

    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        from specdash.kernels.rmsnorm import rms_norm_rows

        return rms_norm_rows(x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm)

    def residual_norm(self, x: Tensor, a: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        from specdash.kernels.rmsnorm import add_rms_norm_rows

        return add_rms_norm_rows(a, x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm)

    def swiglu(self, gate_up: Tensor) -> Tensor:
        from specdash.kernels.elementwise import swiglu_rows

        return swiglu_rows(gate_up)

    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        if not self.cfg.gated_attention:
            return o
        from specdash.kernels.elementwise import sigmoid_gate_rows

        gate = attention_gate(qkv, self.cfg)
        return sigmoid_gate_rows(o.view(gate.shape), gate).view(o.shape)

    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        from specdash.kernels.elementwise import causal_conv_silu_rows

        return causal_conv_silu_rows(window, qkv, w)

    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        from specdash.kernels.rmsnorm import gated_rms_norm_rows

        return gated_rms_norm_rows(o, z, w, self.cfg.rms_norm_eps)


class TritonPrefillRows(_TritonElementwise, PrefillRows):
    """Prefill on CUDA: chunked GDN, the fused row kernels for everything row-wise, where torch
    would make several full passes over 16k-row activations per op (5.8 s of a 128k prefill's
    kernels, docs/PERF.md). Attention: with `attention_kernel` (the default on Hopper) the
    causal attention of `kernels.prefill_attention` (bf16/fp16), 1.74x / 1.89x torch's flash
    attention on a first / last 16k chunk of a 128k prompt at the 27B shape (H100, docs/PERF.md);
    else torch's SDPA, whose flash kernel is the one left for older GPUs."""

    def __init__(self, cfg: ModelConfig, rope: Rope, attention_kernel: bool = False) -> None:
        super().__init__(cfg, rope, gdn_kernel=True)
        self.attention_kernel = attention_kernel

    def _attend(self, q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor) -> Tensor:
        if not self.attention_kernel or q.dtype == torch.float32:
            return super()._attend(q, cache, state, pos)
        from specdash.kernels.prefill_attention import causal_prefill_attention

        scale = self.cfg.head_dim**-0.5
        return causal_prefill_attention(q, cache.k, cache.v, state.length, scale)


class TritonRows(_TritonElementwise):
    """Exact rows through specdash.kernels (CUDA; the CPU runs them under TRITON_INTERPRET):
    one program per row whose arithmetic cannot depend on the row count, positions read on the
    device, so decode and verify forwards are graphable."""

    graphable = True
    steps_slots_together = True

    def attention(
        self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState
    ) -> Tensor:
        """Norms, RoPE and the cache write in one kernel; then the fixed-split decode kernel,
        verify rows issued as decode rows of lengths L+1..L+T."""
        from specdash.kernels.decode_attention import verify_as_decode_rows
        from specdash.kernels.rope import qk_norm_rope_rows

        cfg, t_len = self.cfg, qkv.shape[0]
        hq, d = cfg.num_attention_heads, cfg.head_dim
        position = state.position
        if position is None:  # an eager CPU state (the kernels' interpreter tests)
            position = torch.tensor([state.length], device=qkv.device)
        q = qk_norm_rope_rows(
            qkv, hq, cfg.num_key_value_heads, cfg.gated_attention, w.q_norm, w.k_norm,
            cfg.rms_norm_eps, cfg.zero_centred_norm, self.rope.cos, self.rope.sin, position,
            cache.k, cache.v,
        )  # fmt: skip
        o = verify_as_decode_rows(q[None], cache.k[None], cache.v[None], position, d**-0.5)
        return o[0].reshape(t_len, hq * d)

    def run(self, states: list[SeqState], rows: int) -> Run:
        """Several slots of one pool step together: one launch per op for all of them."""
        pool = states[0].pool
        if len(states) == 1 or pool is None or any(st.pool is not pool for st in states):
            return Run(states, rows)
        starts = torch.tensor([st.length for st in states], device=pool.device)
        return Run(states, rows, pool.step_together(states), starts)

    def attention_run(self, qkv: Tensor, w: AttentionWeights, i: int, run: Run) -> Tensor:
        if run.pooled is None:
            return super().attention_run(qkv, w, i, run)
        from specdash.kernels.decode_attention import verify_as_decode_rows
        from specdash.kernels.rope import qk_norm_rope_rows

        cfg, n, slots = self.cfg, len(run.states), run.pooled.slots
        hq, d = cfg.num_attention_heads, cfg.head_dim
        cache = run.pooled.pool.kv[i]
        q = qk_norm_rope_rows(
            qkv, hq, cfg.num_key_value_heads, cfg.gated_attention, w.q_norm, w.k_norm,
            cfg.rms_norm_eps, cfg.zero_centred_norm, self.rope.cos, self.rope.sin, run.starts,
            cache.k, cache.v, slots=slots,
        )  # fmt: skip
        q = q.view(n, run.rows, hq, d)
        o = verify_as_decode_rows(q, cache.k, cache.v, run.starts, d**-0.5, slots=slots)
        return o.reshape(n * run.rows, hq * d)

    @staticmethod
    def _decodes_in_place(run: Run) -> bool:
        """Decode rows (one per sequence, always kept) on states that keep their buffers (engine
        slots) move their conv windows and GDN states on inside the forward: no per-step
        buffers, and nothing left for the commit but the position (97 fewer kernels per step
        on the 27B shape). Other states' GDN updates stay pending until `commit`."""
        return run.rows == 1 and all(st.in_place for st in run.states)

    def conv_in_gdn(self, run: Run) -> bool:
        return self._decodes_in_place(run)

    def conv_gdn_run(
        self, i: int, qkv: Tensor, a: Tensor, b: Tensor, w: GdnWeights, run: Run
    ) -> Tensor:
        """Decode rows in place: the conv window and GDN state move on in one kernel, bit for
        bit what `conv_run` then `gdn_run` leave (kernels.gdn.conv_gdn_steps_in_place)."""
        from specdash.kernels.gdn import conv_gdn_steps_in_place

        weights = (w.conv, w.a_log, w.dt_bias)
        if run.pooled is not None:
            pool = run.pooled.pool.gdn[i]
            return conv_gdn_steps_in_place(
                qkv, a, b, *weights, pool.conv, pool.ssm, slots=run.pooled.slots
            )
        rows = zip(qkv.split(1), a.split(1), b.split(1), run.states, strict=True)
        return cat_rows(
            [
                conv_gdn_steps_in_place(*r, *weights, st.gdn[i].conv[None], st.gdn[i].ssm[None])
                for *r, st in rows
            ]
        )

    def conv_run(
        self, qkv: Tensor, w: Tensor, i: int, run: Run
    ) -> tuple[Tensor, Tensor | list[Tensor]]:
        from specdash.kernels.elementwise import causal_conv_silu_in_place, causal_conv_silu_rows

        pool_window = None if run.pooled is None else run.pooled.pool.gdn[i].conv
        if self._decodes_in_place(run):
            if pool_window is not None:
                return causal_conv_silu_in_place(pool_window, qkv, w, run.pooled.slots), []
            parts = zip(qkv.split(1), run.states, strict=True)
            outs = [causal_conv_silu_in_place(st.gdn[i].conv, p, w) for p, st in parts]
            return cat_rows(outs), []  # no conv sequence to keep
        if pool_window is None:
            return super().conv_run(qkv, w, i, run)
        return causal_conv_silu_rows(pool_window, qkv, w, slots=run.pooled.slots)

    def gdn_run(
        self,
        i: int,
        qkvab: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
        w: GdnWeights,
        run: Run,
        conv_seqs: Tensor | list[Tensor],
    ) -> Tensor:
        from specdash.kernels.gdn import gdn_steps_in_place, gdn_verify_steps

        n, t = len(run.states), run.rows
        if self._decodes_in_place(run):
            q, k, v, a, b = (x[:, None] for x in qkvab)  # [B, 1, ...]: a row per sequence
            if run.pooled is not None:
                ssm, slots = run.pooled.pool.gdn[i].ssm, run.pooled.slots
                o = gdn_steps_in_place(q, k, v, a, b, w.a_log, w.dt_bias, ssm, slots=slots)
            else:  # slots of no pool: one launch per sequence
                rows = [tuple(x[j : j + 1] for x in (q, k, v, a, b)) for j in range(n)]
                o = cat_rows(
                    [
                        gdn_steps_in_place(*r, w.a_log, w.dt_bias, st.gdn[i].ssm[None])
                        for r, st in zip(rows, run.states, strict=True)
                    ]
                )
            return o.reshape(n, *o.shape[2:])
        if run.pooled is None:
            return super().gdn_run(i, qkvab, w, run, conv_seqs)
        q, k, v, a, b = (x.view(n, t, *x.shape[1:]) for x in qkvab)
        ssm, slots = run.pooled.pool.gdn[i].ssm, run.pooled.slots
        o, steps = gdn_verify_steps(q, k, v, a, b, w.a_log, w.dt_bias, ssm, slots=slots)
        assert isinstance(conv_seqs, Tensor)
        run.pooled.steps[i] = GdnSteps(conv_seqs, steps)  # for `commit_batch` (one per state
        # would cost B x layers host-side views per forward)
        return o.reshape(n * t, *o.shape[2:])

    def gdn(
        self,
        i: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        b: Tensor,
        w: GdnWeights,
        state: SeqState,
        conv_seq: Tensor,
    ) -> Tensor:
        """One recurrent-step kernel for decode and verify, gates in-kernel in fp32."""
        from specdash.kernels.gdn import gdn_verify_steps

        ssm = state.gdn[i].ssm
        o, steps = gdn_verify_steps(
            q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, ssm[None]
        )
        state.pending[i] = GdnSteps(conv_seq, steps[0])
        return o[0]


def row_implementations(cfg: ModelConfig, rope: Rope, device: torch.device) -> dict[Mode, Rows]:
    """The implementation of each mode on `device`, chosen here only: exact rows are the Triton
    kernels on CUDA (the torch rows outside their shapes or on the CPU); fast verify is the
    batched pass on every device, so it diverges the usual way on a GPU too."""
    cuda = device.type == "cuda"
    kernels = cuda and _triton_rows_supported(cfg)
    # (the CPU tests take the CUDA route through the interpreter, with no CUDA to ask)
    hopper = cuda and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 9
    return {
        "prefill": TritonPrefillRows(cfg, rope, attention_kernel=hopper)
        if kernels
        else PrefillRows(cfg, rope, False),
        "exact": TritonRows(cfg, rope) if kernels else TorchRows(cfg, rope),
        "fast": BatchedRows(cfg, rope, device_positions=cuda),
    }


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
            stacklevel=4,
        )
    return pow2 and gdn
