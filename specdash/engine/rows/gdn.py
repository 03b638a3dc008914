"""Gated DeltaNet of a forward's rows: the causal conv over each sequence's window, then the
gated delta rule on its recurrent state. A decode or verify step leaves the state after each
row pending for the commit (`state.commit`, `commit_batch`); prefill stores the final state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from specdash.engine import ops
from specdash.engine.config import ModelConfig
from specdash.engine.rows.rowwise import Rowwise
from specdash.engine.rows.run import Run, cat_rows
from specdash.engine.state import GdnSteps, SeqState
from specdash.engine.weights import GdnWeights

Tensor = torch.Tensor
QKVAB = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


@dataclass(eq=False)
class Gdn(ABC):
    """The conv by `rowwise`, then `sequence` for each sequence of a run on its own state."""

    cfg: ModelConfig
    rowwise: Rowwise
    steps_slots_together: ClassVar[bool] = False
    """`conv_run` and `run` take a pooled run in one launch per op (`Run.pooled`)."""

    def conv_run(
        self, qkv: Tensor, w: Tensor, i: int, run: Run
    ) -> tuple[Tensor, Tensor | list[Tensor]]:
        """The conv of layer i for every sequence of the run: (outputs, each one's conv
        sequence)."""
        outs, seqs = [], []
        for p, st in zip(qkv.split(run.rows), run.states, strict=True):
            o, cs = self.rowwise.conv(st.gdn[i].conv, p, w)
            outs.append(o)
            seqs.append(cs)
        return cat_rows(outs), seqs

    def run(
        self, i: int, qkvab: QKVAB, w: GdnWeights, run: Run, conv_seqs: Tensor | list[Tensor]
    ) -> Tensor:
        """The delta rule of layer i for every sequence of the run, on its own state."""
        parts = zip(*(x.split(run.rows) for x in qkvab), strict=True)
        outs = [
            self.sequence(i, p, w, st, cs)
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
        """`conv_run` then `run` of layer i in one launch, from the raw in_proj rows: for runs
        whose `conv_in_gdn` is True."""
        raise NotImplementedError(f"{type(self).__name__} runs the conv and GDN apart")

    @abstractmethod
    def sequence(
        self, i: int, qkvab: QKVAB, w: GdnWeights, state: SeqState, conv_seq: Tensor
    ) -> Tensor:
        """The delta rule over one sequence's rows of layer i; returns the output."""


def qk_gates(
    cfg: ModelConfig, q: Tensor, k: Tensor, a: Tensor, b: Tensor, w: GdnWeights, exact: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """l2-normed q (scaled) and k repeated to the v-heads, decay and beta (docs §3)."""
    q = ops.l2norm(q, exact) * cfg.linear_key_head_dim**-0.5
    k = ops.l2norm(k, exact)
    rep = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    if rep != 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    return q, k, *ops.gdn_gates(a, b, w.a_log, w.dt_bias)


@dataclass(eq=False)
class RecurrentGdn(Gdn):
    """The recurrence one token at a time in torch, `exact` l2 norms summing in a fixed order."""

    exact: bool

    def sequence(
        self, i: int, qkvab: QKVAB, w: GdnWeights, state: SeqState, conv_seq: Tensor
    ) -> Tensor:
        q, k, v, a, b = qkvab
        q, k, decay, beta = qk_gates(self.cfg, q, k, a, b, w, self.exact)
        o, steps = ops.gdn_recurrent_steps(q, k, v.float(), decay, beta, state.gdn[i].ssm)
        state.pending[i] = GdnSteps(conv_seq, steps)
        return o


@dataclass(eq=False)
class ChunkedGdn(Gdn):
    """Prefill's chunked form, storing the final state. With `kernel` (CUDA, the kernels'
    shapes) through `ops.gdn_prefill` (FLA's chunked kernel when fla-core imports, else the same
    torch chunked form)."""

    kernel: bool

    def sequence(
        self, i: int, qkvab: QKVAB, w: GdnWeights, state: SeqState, conv_seq: Tensor
    ) -> Tensor:
        q, k, v, a, b = qkvab
        ssm, t_len = state.gdn[i].ssm, q.shape[0]
        if self.kernel:
            o, final = ops.gdn_prefill(
                q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, ssm[None]
            )
            o, ssm = o[0], final[0]
        else:
            q, k, decay, beta = qk_gates(self.cfg, q, k, a, b, w, exact=False)
            o, ssm = ops.gdn_chunked(q, k, v.float(), decay, beta, ssm)
        state.store_gdn(i, conv_seq[t_len:], ssm)
        return o


class TritonGdn(Gdn):
    """specdash.kernels' recurrent-step kernel for decode and verify (gates in-kernel in fp32),
    a pooled run in one launch per op; decode rows on slots move their state on in place."""

    steps_slots_together = True

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
        bit what `conv_run` then `run` leave (kernels.gdn.conv_gdn_steps_in_place)."""
        from specdash.kernels.triton.gdn import conv_gdn_steps_in_place

        weights = (w.conv, w.a_log, w.dt_bias)
        if run.pooled is not None:
            pool = run.pooled.pool.gdn[i]
            return conv_gdn_steps_in_place(
                qkv, a, b, *weights, pool.conv, pool.ssm, slots=run.pooled.slots
            )
        rows = zip(qkv.split(1), a.split(1), b.split(1), run.states, strict=True)
        return cat_rows(
            [
                conv_gdn_steps_in_place(
                    qkv_j, a_j, b_j, *weights, st.gdn[i].conv[None], st.gdn[i].ssm[None]
                )
                for qkv_j, a_j, b_j, st in rows
            ]
        )

    def conv_run(
        self, qkv: Tensor, w: Tensor, i: int, run: Run
    ) -> tuple[Tensor, Tensor | list[Tensor]]:
        from specdash.kernels.triton.elementwise import (
            causal_conv_silu_in_place,
            causal_conv_silu_rows,
        )

        pooled = run.pooled
        if self._decodes_in_place(run):
            if pooled is not None:
                window = pooled.pool.gdn[i].conv
                return causal_conv_silu_in_place(window, qkv, w, pooled.slots), []
            parts = zip(qkv.split(1), run.states, strict=True)
            outs = [causal_conv_silu_in_place(st.gdn[i].conv, p, w) for p, st in parts]
            return cat_rows(outs), []  # no conv sequence to keep
        if pooled is None:
            return super().conv_run(qkv, w, i, run)
        return causal_conv_silu_rows(pooled.pool.gdn[i].conv, qkv, w, slots=pooled.slots)

    def run(
        self, i: int, qkvab: QKVAB, w: GdnWeights, run: Run, conv_seqs: Tensor | list[Tensor]
    ) -> Tensor:
        from specdash.kernels.triton.gdn import gdn_steps_in_place, gdn_verify_steps

        n, t = len(run.states), run.rows
        if self._decodes_in_place(run):
            q, k, v, a, b = (x[:, None] for x in qkvab)  # [B, 1, ...]: a row per sequence
            if run.pooled is not None:
                ssm, slots = run.pooled.pool.gdn[i].ssm, run.pooled.slots
                o = gdn_steps_in_place(q, k, v, a, b, w.a_log, w.dt_bias, ssm, slots=slots)
            else:  # slots of no pool: one launch per sequence
                o = cat_rows(
                    [
                        gdn_steps_in_place(
                            q[j : j + 1],
                            k[j : j + 1],
                            v[j : j + 1],
                            a[j : j + 1],
                            b[j : j + 1],
                            w.a_log,
                            w.dt_bias,
                            st.gdn[i].ssm[None],
                        )
                        for j, st in enumerate(run.states)
                    ]
                )
            return o.reshape(n, *o.shape[2:])
        if run.pooled is None:
            return super().run(i, qkvab, w, run, conv_seqs)
        q, k, v, a, b = (x.view(n, t, *x.shape[1:]) for x in qkvab)
        ssm, slots = run.pooled.pool.gdn[i].ssm, run.pooled.slots
        o, steps = gdn_verify_steps(q, k, v, a, b, w.a_log, w.dt_bias, ssm, slots=slots)
        assert isinstance(conv_seqs, Tensor)
        run.pooled.steps[i] = GdnSteps(conv_seqs, steps)  # for `commit_batch` (one per state
        # would cost B x layers host-side views per forward)
        return o.reshape(n * t, *o.shape[2:])

    def sequence(
        self, i: int, qkvab: QKVAB, w: GdnWeights, state: SeqState, conv_seq: Tensor
    ) -> Tensor:
        from specdash.kernels.triton.gdn import gdn_verify_steps

        q, k, v, a, b = qkvab
        ssm = state.gdn[i].ssm
        o, steps = gdn_verify_steps(
            q[None], k[None], v[None], a[None], b[None], w.a_log, w.dt_bias, ssm[None]
        )
        state.pending[i] = GdnSteps(conv_seq, steps[0])
        return o[0]
