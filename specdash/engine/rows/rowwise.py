"""The row-wise ops of a forward: norms, SwiGLU, the output gate, the causal conv and the gated
norm. Each output row depends on its own input row only (the conv: on the rows before it too),
so any number of rows computes each row as one row would, given per-row reductions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdash.engine import ops
from specdash.engine.config import ModelConfig

Tensor = torch.Tensor


def attention_gate(qkv: Tensor, cfg: ModelConfig) -> Tensor:
    """Gated attention's output gate [T, Hq, D]: a view of the q projection, whose head rows
    interleave each head's q and gate."""
    t_len, d, hq = qkv.shape[0], cfg.head_dim, cfg.num_attention_heads
    return qkv[:, : 2 * hq * d].view(t_len, hq, 2 * d)[..., d:]


class Rowwise(Protocol):
    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        """RMSNorm of every row of x."""
        ...

    def residual_norm(self, x: Tensor, a: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """(x + a, its RMSNorm)."""
        ...

    def swiglu(self, gate_up: Tensor) -> Tensor:
        """silu(gate) * up of the fused [gate | up] projection."""
        ...

    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        """`o * sigmoid(gate)` with the gate from the q projection (gated attention)."""
        ...

    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """(causal conv + SiLU of the new rows, the window followed by the new inputs)."""
        ...

    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        """`w * rmsnorm(o) * silu(z)`, in z's dtype."""
        ...


@dataclass(eq=False)
class TorchRowwise:
    """torch's ops: `exact` norms sum in a fixed order (decode's bits at any row count), else
    torch's fused norms (the usual way, for fast verify and prefill)."""

    cfg: ModelConfig
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

    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        if not self.cfg.gated_attention:
            return o
        return o * ops.sigmoid(attention_gate(qkv, self.cfg).reshape(o.shape))

    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return ops.causal_conv_silu(window, qkv, w), torch.cat((window, qkv), dim=0)

    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        return ops.gated_rms_norm(o.to(z.dtype), z, w, self.cfg.rms_norm_eps, self.exact)


@dataclass(eq=False)
class TritonRowwise:
    """specdash.kernels' row kernels, one program per row (or row block) for any number of
    rows (CUDA; the CPU runs them under TRITON_INTERPRET)."""

    cfg: ModelConfig

    def norm(self, x: Tensor, w: Tensor) -> Tensor:
        from specdash.kernels.triton.rmsnorm import rms_norm_rows

        return rms_norm_rows(x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm)

    def residual_norm(self, x: Tensor, a: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        from specdash.kernels.triton.rmsnorm import add_rms_norm_rows

        return add_rms_norm_rows(a, x, w, self.cfg.rms_norm_eps, self.cfg.zero_centred_norm)

    def swiglu(self, gate_up: Tensor) -> Tensor:
        from specdash.kernels.triton.elementwise import swiglu_rows

        return swiglu_rows(gate_up)

    def output_gate(self, o: Tensor, qkv: Tensor) -> Tensor:
        if not self.cfg.gated_attention:
            return o
        from specdash.kernels.triton.elementwise import sigmoid_gate_rows

        gate = attention_gate(qkv, self.cfg)
        return sigmoid_gate_rows(o.view(gate.shape), gate).view(o.shape)

    def conv(self, window: Tensor, qkv: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        from specdash.kernels.triton.elementwise import causal_conv_silu_rows

        return causal_conv_silu_rows(window, qkv, w)

    def gated_norm(self, o: Tensor, z: Tensor, w: Tensor) -> Tensor:
        from specdash.kernels.triton.rmsnorm import gated_rms_norm_rows

        return gated_rms_norm_rows(o, z, w, self.cfg.rms_norm_eps)
