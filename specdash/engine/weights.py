"""The decoder's weights, per layer, in the layout the forward wants.

q/k/v, the GDN input projections and gate/up are each fused into one GEMM's weight
(`Model.from_tensors` builds them from Hugging Face tensor names); the model's forward and every
`rows.Rows` part read them. A linear weight is a tensor, or an `Fp8Weight` where a block-FP8
checkpoint's weights run on the FP8 tile (CUDA); elsewhere they are dequantized on loading
(`dequantize_fp8`), so the CPU's exact GEMMs see plain fp32 weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdash.errors import CheckpointError
from specdash.kernels.fp8 import Fp8Weight, dequantize

Tensor = torch.Tensor
Linear = Tensor | Fp8Weight
SCALE_SUFFIX = "_scale_inv"
"""`<module>.weight` + this: a block-FP8 checkpoint's float32 scales of that weight's blocks."""


@dataclass(slots=True)
class AttentionWeights:
    qkv: Linear
    o: Linear
    q_norm: Tensor
    k_norm: Tensor


@dataclass(slots=True)
class GdnWeights:
    proj: Linear  # [qkv | z | b | a] rows
    conv: Tensor  # [C, W]
    a_log: Tensor
    dt_bias: Tensor
    norm: Tensor
    out: Linear


@dataclass(slots=True)
class LayerWeights:
    input_norm: Tensor
    post_norm: Tensor
    mixer: AttentionWeights | GdnWeights
    gate_up: Linear
    down: Linear


def linear_weight(t: dict[str, Tensor], name: str) -> Linear:
    """Tensor `name`, as an Fp8Weight where its block scales are beside it."""
    scale = t.get(name + SCALE_SUFFIX)
    return t[name] if scale is None else Fp8Weight(t[name], scale)


def fuse(parts: list[Linear]) -> Linear:
    """One GEMM's weight of the parts' rows: FP8 parts first, then any unquantized ones (the
    GDN b|a rows of a Qwen3.5 FP8 checkpoint) as its `rest`."""
    fp8 = [p for p in parts if isinstance(p, Fp8Weight)]
    plain = [p for p in parts if not isinstance(p, Fp8Weight)]
    if not fp8:
        return torch.cat(plain)
    if not all(isinstance(p, Fp8Weight) for p in parts[: len(fp8)]):
        raise CheckpointError(
            "an FP8 projection follows an unquantized one in a fused GEMM (modules_to_not_convert "
            "may only name the trailing parts, such as in_proj_b / in_proj_a)"
        )
    weight = fp8[0] if len(fp8) == 1 else Fp8Weight.cat(fp8)
    return weight.with_rest(torch.cat(plain)) if plain else weight


def plain(w: Linear) -> Tensor:
    """`w` where only an unquantized weight can be: a CPU model's (dequantized on loading) or a
    fused backend's GEMM operand (a model with FP8 weights runs only on a backend with FP8 GEMMs,
    and that one fuses nothing)."""
    assert isinstance(w, Tensor), "an FP8 weight reached a GEMM that runs none"
    return w


def weight_bytes(w: Linear) -> int:
    return w.nbytes if isinstance(w, Fp8Weight) else w.numel() * w.element_size()


def dequantize_fp8(t: dict[str, Tensor], dtype: torch.dtype) -> None:
    """Every FP8 weight in `t` replaced, in place, by `q * scale` (fp32, rounded once, then to
    `dtype`) and its scales dropped: the weights of a device without the FP8 tile."""
    for scale_name in [n for n in t if n.endswith(SCALE_SUFFIX)]:
        name = scale_name.removesuffix(SCALE_SUFFIX)
        t[name] = dequantize(t[name], t.pop(scale_name)).to(dtype)
