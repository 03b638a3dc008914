"""Attention of a forward's rows: q/k norm, RoPE, the K/V cache write and attention of each row
over its prefix ([T, Hq*D], before the output gate), on each sequence's own cache."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from specdash.engine import ops
from specdash.engine.config import ModelConfig
from specdash.engine.rows.rope import Rope
from specdash.engine.rows.rowwise import Rowwise
from specdash.engine.rows.run import Run, cat_rows
from specdash.engine.state import KVCache, SeqState
from specdash.engine.weights import AttentionWeights

Tensor = torch.Tensor
Attend = Callable[[Tensor, KVCache, SeqState, slice | Tensor, float], Tensor]
"""`attend(q, cache, state, pos, scale)`: rows q [T, Hq, D] at `pos` over the cache, which
already holds their own K/V."""


class Attention(ABC):
    graphable: bool = False
    """Reads every position on the device, so a CUDA graph of it is valid at every length."""
    steps_slots_together: ClassVar[bool] = False
    """`run` takes a pooled run in one launch per op (`Run.pooled`)."""

    def run(self, qkv: Tensor, w: AttentionWeights, i: int, run: Run) -> Tensor:
        """Attention of layer i for every sequence of the run, over its own cache."""
        parts = qkv.split(run.rows)
        outs = [self.sequence(p, w, st.kv[i], st) for p, st in zip(parts, run.states, strict=True)]
        return cat_rows(outs)

    @abstractmethod
    def sequence(self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState) -> Tensor:
        """Attention of one sequence's rows over `cache`."""


def attend_per_row(
    q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor, scale: float
) -> Tensor:
    """Exact: each row alone over its own prefix, with decode's shapes (slices the cache by the
    host-side length)."""
    return ops.attention_decode_rows(q, cache.k, cache.v, state.length, scale)


def attend_batched(
    q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor, scale: float
) -> Tensor:
    """One SDPA call over the rows, the usual way (slices the cache by the host-side length)."""
    return ops.attention_batched(q, cache.k, cache.v, state.length, scale)


def attend_masked(
    q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor, scale: float
) -> Tensor:
    """One SDPA call over the whole cache, masked by the positions on the device."""
    assert isinstance(pos, Tensor), "device positions need a state with `position`"
    return ops.attention_masked(q, cache.k, cache.v, pos, scale)


def attend_causal_kernel(
    q: Tensor, cache: KVCache, state: SeqState, pos: slice | Tensor, scale: float
) -> Tensor:
    """Prefill's causal attention through `kernels.prefill_attention` (bf16/fp16), 1.74x /
    1.89x torch's flash attention on a first / last 16k chunk of a 128k prompt at the 27B shape
    (H100, docs/PERF.md); fp32 takes SDPA."""
    if q.dtype == torch.float32:
        return attend_batched(q, cache, state, pos, scale)
    from specdash.kernels.triton.prefill_attention import causal_prefill_attention

    return causal_prefill_attention(q, cache.k, cache.v, state.length, scale)


@dataclass(eq=False)
class TorchAttention(Attention):
    """q/k norms by `rowwise`, RoPE and the cache write in torch, then `attend`."""

    cfg: ModelConfig
    rope: Rope
    rowwise: Rowwise
    attend: Attend

    def __post_init__(self) -> None:
        self.graphable = self.attend is attend_masked  # the others slice by host-side length

    def sequence(self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState) -> Tensor:
        cfg, t_len = self.cfg, qkv.shape[0]
        d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q_width = hq * d * (2 if cfg.gated_attention else 1)
        q, k, v = qkv.split([q_width, hkv * d, hkv * d], dim=-1)
        if cfg.gated_attention:
            q = q.view(t_len, hq, 2 * d)[..., :d]
        pos = self.rope.positions(state, t_len)
        cos, sin = self.rope.cos[pos], self.rope.sin[pos]
        norm = self.rowwise.norm
        q = ops.apply_rope(norm(q.reshape(t_len, hq, d), w.q_norm), cos, sin)
        k = ops.apply_rope(norm(k.reshape(t_len, hkv, d), w.k_norm), cos, sin)
        v = v.view(t_len, hkv, d)
        if isinstance(pos, slice):
            cache.k[:, pos] = k.transpose(0, 1)
            cache.v[:, pos] = v.transpose(0, 1)
        else:
            cache.k.index_copy_(1, pos, k.transpose(0, 1))
            cache.v.index_copy_(1, pos, v.transpose(0, 1))
        return self.attend(q, cache, state, pos, d**-0.5).reshape(t_len, hq * d)


@dataclass(eq=False)
class TritonAttention(Attention):
    """specdash.kernels' attention: norms, RoPE and the cache write in one kernel, then the
    fixed-split decode kernel, verify rows issued as decode rows of lengths L+1..L+T, whose
    arithmetic cannot depend on the row count; positions read on the device."""

    cfg: ModelConfig
    rope: Rope
    graphable = True
    steps_slots_together = True

    def sequence(self, qkv: Tensor, w: AttentionWeights, cache: KVCache, state: SeqState) -> Tensor:
        from specdash.kernels.triton.decode_attention import verify_as_decode_rows
        from specdash.kernels.triton.rope import qk_norm_rope_rows

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

    def run(self, qkv: Tensor, w: AttentionWeights, i: int, run: Run) -> Tensor:
        if run.pooled is None:
            return super().run(qkv, w, i, run)
        from specdash.kernels.triton.decode_attention import verify_as_decode_rows
        from specdash.kernels.triton.rope import qk_norm_rope_rows

        cfg, n, slots, starts = self.cfg, len(run.states), run.pooled.slots, run.starts
        assert starts is not None  # a pooled run carries its lengths (Rows.run)
        hq, d = cfg.num_attention_heads, cfg.head_dim
        cache = run.pooled.pool.kv[i]
        q = qk_norm_rope_rows(
            qkv, hq, cfg.num_key_value_heads, cfg.gated_attention, w.q_norm, w.k_norm,
            cfg.rms_norm_eps, cfg.zero_centred_norm, self.rope.cos, self.rope.sin, starts,
            cache.k, cache.v, slots=slots,
        )  # fmt: skip
        q = q.view(n, run.rows, hq, d)
        o = verify_as_decode_rows(q, cache.k, cache.v, starts, d**-0.5, slots=slots)
        return o.reshape(n * run.rows, hq * d)
