"""The decoder's weights, per layer, in the layout the forward wants.

q/k/v, the GDN input projections and gate/up are each fused into one GEMM's weight
(`Model.from_tensors` builds them from Hugging Face tensor names); the model's forward and every
`rows.Rows` part read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


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
