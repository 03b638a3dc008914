"""A Qwen3.5-shaped target (with an MTP head) and a dense Qwen3 draft that SGLang loads, with
real acceptance.

Why this pair: SGLang's exactness problem needs the real Qwen3.5 head dims (attention head 256,
partial RoPE 0.25, output gate; GDN key/value heads of 128), and a draft-model algorithm needs a
draft whose proposals the target often accepts, so that verify commits several rows. Random
weights accept nothing. Here the residual stream is dominated by the token embedding (std 1) and
every layer writes into it through small output projections (std 0.02 * LAYER_SCALE), so the
target's greedy token is usually the "bigram" token lm_head(norm(embed(t))) but not always; the
layers still move the low bits of every logit. The draft is a one-layer dense Qwen3 (STANDALONE
refuses a Qwen3.5 draft: it becomes an MTP model) with the target's embedding and lm_head and
zero output projections: exactly that bigram. The target also carries the MTP head real
Qwen3.5 checkpoints carry (`mtp.fc`, `mtp.pre_fc_norm_*`, `mtp.layers.0.*`, `mtp.norm`; SGLang's
NEXTN drafts with it): `fc` passes the next token's normed embedding and drops the hidden state,
the layer's output projections are zero, so it proposes bigram(next token), which the target
usually accepts. Both use the embedded pair's tokenizer.

`--shape 27b` gives the real Qwen3.5-27B dimensions (hidden 5120, 24 query / 4 KV heads of 256,
GDN 16 key / 48 value heads of 128, MLP 17408) with `--layers` layers: real-dim weights for
acceptance at the real shape; `--config-only` writes the config and tokenizer alone, for
SGLang's `load_format=dummy` (all 64 layers fit no disk budget of a test).

`--dflash-draft DIR` also writes a DFlash draft of that target (SGLang's `DFlashDraftModel`:
`DFLASH` speculates with it). DFlash drafts a block of `block_size` tokens in one pass: the
block is [last token, mask, mask, ...], each position attends (non-causally) to the block and to
the committed context, whose keys and values come from target hidden states (`target_layer_ids`,
through `fc` and `hidden_norm`); the target's embedding and lm_head turn inputs and outputs into
tokens. Here the draft's attention looks only one position back: its query and key are
constant biases (the projection weights are zero), so the score depends on the relative RoPE
position alone, and the biases put its peak at distance 1 by a wide margin. The value carries
the attended token's normed embedding, scaled to swamp the mask token's own embedding in the
residual, so block position 1 proposes bigram(last token), which the target usually accepts;
the later positions only see masks and rarely match. Context features reach the cache (`fc`
zero: the draft ignores them). `--dflash-layers` (default 1; extra layers add nothing) and
`--dflash-block-size` (default 16) shape it; with `--config-only` it is a config alone.

`--multimodal` writes the same target (the same tensors, bit for bit) in the form Qwen3.5's own
checkpoints have: `Qwen3_5ForConditionalGeneration`, the language model's config as
`text_config` beside a `vision_config`, its tensors under `model.language_model.` (`lm_head`
and the MTP head's `mtp.*` keep their names). SGLang 0.5.17 serves the text-only architecture
with a class that captures no hidden states, so DFLASH needs this form there. The vision tower
is the smallest SGLang builds (one block, no deepstack) and has no tensors in the checkpoint:
SGLang's loader leaves what a checkpoint lacks as allocated, and text prompts never run it.

`--fp8-block` writes the target block-quantized to FP8 the way Qwen ships its `*-FP8` checkpoints
(`quantization_config` {"quant_method": "fp8", "weight_block_size": [128, 128],
"activation_scheme": "dynamic", "fmt": "e4m3", "modules_to_not_convert": [...]}): every
projection a layer (and the MTP layer) runs as a GEMM becomes a float8_e4m3fn `weight` with a
float32 `weight_scale_inv` of [ceil(N/128), ceil(K/128)], one dequantization multiplier per
128x128 block (amax / 448; an all-zero block 1). Left in bf16 and listed: the embedding, lm_head,
GDN's in_proj_a/in_proj_b (48 rows: SGLang's block loader needs each fused shard divisible by
128), conv1d and the MTP fc; norms, A_log and dt_bias are parameters, never quantized. With
`--config-only` the config alone (SGLang's dummy load fills FP8 tensors of the same shapes).

Usage: python benchmarks/sglang_checkpoint.py OUT_DIR [--device cuda] [--layers 8]
    [--shape small|27b] [--config-only] [--multimodal] [--fp8-block] [--dflash-draft DIR
    [--dflash-layers 1] [--dflash-block-size 16]]
Writes OUT_DIR/target and OUT_DIR/draft (HF format: config.json, model.safetensors,
tokenizer.json), the same bytes for the same arguments and torch version.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdash.kernels.fp8 import BLOCK as FP8_BLOCK
from specdash.kernels.fp8 import quantize_blocks

LAYER_SCALE = 0.15
SEED = 1234
CONV = 4
DFLASH_HEAD_DIM = 128
DFLASH_ROPE_THETA = 10000.0
DFLASH_POSITION_PAIRS = 8
"""RoPE pairs (the fastest-turning ones) the draft's query and key use: their cosines agree
only at distance 1 (mean cosine at most 0.88 anywhere else within 9000 positions)."""
DFLASH_NORM_GAIN = 8.0
"""q_norm/k_norm weight: scales the attention score (peak 11.3 * gain^2, margin >= 90)."""
FP8_QUANTIZED = (
    "q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj",
    "gate_proj", "up_proj", "down_proj",
)  # fmt: skip
"""The projections an FP8 checkpoint stores as float8 with block scales (module names)."""
FP8_KEPT = ("in_proj_a", "in_proj_b", "conv1d")
"""GDN modules a layer keeps in bf16 (listed per layer in `modules_to_not_convert`)."""
DFLASH_VALUE_GAIN = 32.0
"""Value = gain * the attended token's normed embedding: the mask token's embedding (std 1)
stays a 1/32 perturbation of the proposal."""


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    gdn_key_heads: int
    gdn_value_heads: int
    head_dim: int = 256
    gdn_head_dim: int = 128


SHAPES = {
    "small": Shape(
        hidden=2048, intermediate=6144, heads=8, kv_heads=2, gdn_key_heads=16, gdn_value_heads=16
    ),
    "27b": Shape(
        hidden=5120, intermediate=17408, heads=24, kv_heads=4, gdn_key_heads=16, gdn_value_heads=48
    ),
}


def _tokenizer() -> tuple[Path, int]:
    data = resources.files("specdash") / "data" / "target"
    path = Path(str(data / "tokenizer.json"))
    vocab = json.loads((Path(str(data)) / "config.json").read_text())["vocab_size"]
    return path, vocab


def target_config(vocab: int, layers: int, shape: Shape = SHAPES["small"]) -> dict:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
        "layer_types": [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ],
        "full_attention_interval": 4,
        "linear_num_key_heads": shape.gdn_key_heads,
        "linear_num_value_heads": shape.gdn_value_heads,
        "linear_key_head_dim": shape.gdn_head_dim,
        "linear_value_head_dim": shape.gdn_head_dim,
        "linear_conv_kernel_dim": CONV,
        "mtp_num_hidden_layers": 1,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def vision_config(text: dict) -> dict:
    """The smallest vision tower SGLang's Qwen3-VL vision model builds (one block of width 64,
    a 4 x 4 position grid, no deepstack layers), feeding the language model's width."""
    return {
        "model_type": "qwen3_5",
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_heads": 1,
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [],
        "out_hidden_size": text["hidden_size"],
    }


def multimodal_config(text: dict) -> dict:
    """`text` as Qwen3.5's own multimodal config holds it. The image and video token ids lie
    past the vocabulary: no text token is one."""
    vocab = text["vocab_size"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {k: v for k, v in text.items() if k != "architectures"},
        "vision_config": vision_config(text),
        "image_token_id": vocab,
        "video_token_id": vocab + 1,
        "vision_start_token_id": vocab + 2,
        "vision_end_token_id": vocab + 3,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "torch_dtype": text["torch_dtype"],
    }


def multimodal_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The language model's tensors under the multimodal checkpoint's `model.language_model.`;
    `lm_head` and `mtp.*` as they are."""
    return {
        ("model.language_model." + n[len("model.") :] if n.startswith("model.") else n): t
        for n, t in weights.items()
    }


def fp8_block_config(cfg: dict, layer_types: list[str]) -> dict:
    """`cfg` (the text config or the multimodal one around it) with the `quantization_config`
    of a block-FP8 checkpoint of a target with these layers."""
    kept = ["embed_tokens", "lm_head", "mtp.fc"]
    for i, kind in enumerate(layer_types):
        if kind == "linear_attention":
            kept += [f"layers.{i}.linear_attn.{m}" for m in FP8_KEPT]
    quant = {
        "quant_method": "fp8",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": kept,
    }
    return cfg | {"quantization_config": quant}


def fp8_block_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The target's tensors with every FP8_QUANTIZED projection block-quantized."""
    out: dict[str, torch.Tensor] = {}
    for name, t in weights.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in FP8_QUANTIZED:
            out[name], out[module + ".weight_scale_inv"] = quantize_blocks(t)
        else:
            out[name] = t
    return out


def draft_config(vocab: int, shape: Shape = SHAPES["small"]) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": 1024,
        "num_hidden_layers": 1,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "rope_theta": 10000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


class _Init:
    """Seeded normal tensors, generated on `device`, stored as contiguous CPU bf16."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(SEED)

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        x = torch.randn(shape, generator=self.gen, device=self.device) * std
        return x.to(torch.bfloat16).cpu().contiguous()


def target_weights(cfg: dict, init: _Init) -> dict[str, torch.Tensor]:
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    zeros = lambda *s: torch.zeros(s, dtype=torch.bfloat16)  # noqa: E731  (Qwen3.5 norms: 1 + w)
    w = {"model.embed_tokens.weight": init.normal(v, h, std=1.0)}
    for i, kind in enumerate(cfg["layer_types"]):
        w |= _layer_weights(f"model.layers.{i}.", kind, cfg, init)
    w["model.norm.weight"] = zeros(h)
    w["lm_head.weight"] = init.normal(v, h, std=1.0 / math.sqrt(h))
    return w | _mtp_weights(cfg, init)


def _layer_weights(
    p: str, kind: str, cfg: dict, init: _Init, zero_out: bool = False
) -> dict[str, torch.Tensor]:
    """One decoder layer; `zero_out`: output projections zero (the layer adds nothing).

    Every shape writes as much into the residual stream, per element, as the small one, so the
    bigram stays as dominant at every width: input projections scale with 1/sqrt(hidden), which
    keeps the activations' size, and output projections with 1/sqrt(their input width), each
    against the small shape's width of that projection."""
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    zeros = lambda *s: torch.zeros(s, dtype=torch.bfloat16)  # noqa: E731
    small = SHAPES["small"]
    in_std = 0.02 * math.sqrt(small.hidden / h)

    def out(rows: int, width: int, small_width: int) -> torch.Tensor:
        if zero_out:
            return zeros(rows, width)
        return init.normal(rows, width, std=0.02 * LAYER_SCALE * math.sqrt(small_width / width))

    w: dict[str, torch.Tensor] = {}
    if kind == "linear_attention":
        heads, vheads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        key_dim = heads * cfg["linear_key_head_dim"]
        value_dim = vheads * cfg["linear_value_head_dim"]
        a = p + "linear_attn."
        w[a + "in_proj_qkv.weight"] = init.normal(2 * key_dim + value_dim, h, std=in_std)
        w[a + "in_proj_z.weight"] = init.normal(value_dim, h, std=in_std)
        w[a + "in_proj_b.weight"] = init.normal(vheads, h, std=in_std)
        w[a + "in_proj_a.weight"] = init.normal(vheads, h, std=in_std)
        w[a + "conv1d.weight"] = init.normal(2 * key_dim + value_dim, 1, CONV, std=0.3)
        w[a + "dt_bias"] = torch.ones(vheads, dtype=torch.bfloat16)
        w[a + "A_log"] = torch.linspace(1.0, 16.0, vheads).log().to(torch.bfloat16)
        w[a + "norm.weight"] = torch.ones(cfg["linear_value_head_dim"], dtype=torch.bfloat16)
        w[a + "out_proj.weight"] = out(h, value_dim, small.gdn_value_heads * small.gdn_head_dim)
    else:
        heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        a = p + "self_attn."
        w[a + "q_proj.weight"] = init.normal(2 * heads * d, h, std=in_std)
        w[a + "k_proj.weight"] = init.normal(kv * d, h, std=in_std)
        w[a + "v_proj.weight"] = init.normal(kv * d, h, std=in_std)
        w[a + "o_proj.weight"] = out(h, heads * d, small.heads * small.head_dim)
        w[a + "q_norm.weight"] = zeros(d)
        w[a + "k_norm.weight"] = zeros(d)
    w[p + "mlp.gate_proj.weight"] = init.normal(f, h, std=in_std)
    w[p + "mlp.up_proj.weight"] = init.normal(f, h, std=in_std)
    w[p + "mlp.down_proj.weight"] = out(h, f, small.intermediate)
    w[p + "input_layernorm.weight"] = zeros(h)
    w[p + "post_attention_layernorm.weight"] = zeros(h)
    return w


def _mtp_weights(cfg: dict, init: _Init) -> dict[str, torch.Tensor]:
    """The MTP head: fc([norm(embed(next)), norm(hidden)]) keeps the embedding half only, and its
    full-attention layer adds nothing, so it proposes bigram(next token)."""
    h = cfg["hidden_size"]
    fc = torch.zeros(h, 2 * h, dtype=torch.bfloat16)
    fc[:, :h] = torch.eye(h, dtype=torch.bfloat16)
    zeros = lambda *s: torch.zeros(s, dtype=torch.bfloat16)  # noqa: E731
    return {
        "mtp.fc.weight": fc,
        "mtp.pre_fc_norm_embedding.weight": zeros(h),
        "mtp.pre_fc_norm_hidden.weight": zeros(h),
        **_layer_weights("mtp.layers.0.", "full_attention", cfg, init, zero_out=True),
        "mtp.norm.weight": zeros(h),
    }


def draft_weights(cfg: dict, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer whose output projections are zero: logits = lm_head(norm(embed(token)))."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, f = 128, 1024
    bf16 = torch.bfloat16
    a, p = "model.layers.0.self_attn.", "model.layers.0."
    return {
        "model.embed_tokens.weight": target["model.embed_tokens.weight"],
        a + "q_proj.weight": torch.zeros(heads * d, h, dtype=bf16),
        a + "k_proj.weight": torch.zeros(kv * d, h, dtype=bf16),
        a + "v_proj.weight": torch.zeros(kv * d, h, dtype=bf16),
        a + "o_proj.weight": torch.zeros(h, heads * d, dtype=bf16),
        a + "q_norm.weight": torch.ones(d, dtype=bf16),
        a + "k_norm.weight": torch.ones(d, dtype=bf16),
        p + "mlp.gate_proj.weight": torch.zeros(f, h, dtype=bf16),
        p + "mlp.up_proj.weight": torch.zeros(f, h, dtype=bf16),
        p + "mlp.down_proj.weight": torch.zeros(h, f, dtype=bf16),
        p + "input_layernorm.weight": torch.ones(h, dtype=bf16),
        p + "post_attention_layernorm.weight": torch.ones(h, dtype=bf16),
        "model.norm.weight": torch.ones(h, dtype=bf16),  # Qwen3: w; the target's 1 + 0
        "lm_head.weight": target["lm_head.weight"],
    }


def dflash_target_layer_ids(target_layers: int) -> list[int]:
    """The target layers whose hidden states the draft reads: three spread over the target as
    SGLang's own default spreads them (`build_target_layer_ids`: from 1 to layers - 3), one
    middle layer on a target under 4 layers."""
    if target_layers < 4:
        return [target_layers // 2]
    start, end, n = 1, target_layers - 3, 3
    return sorted({round(start + i * (end - start) / (n - 1)) for i in range(n)})


def dflash_config(
    target: dict, layers: int = 1, block_size: int = 16, mask_token_id: int | None = None
) -> dict:
    """A DFlash draft of `target` as SGLang 0.5.17 and 0.5.23 read it: `DFlashDraftModel`,
    Qwen3 fields for its layers, `dflash_config` with the target layers it reads (and their
    count, which 0.5.17 needs to check them), the block size and the mask token."""
    h = target["hidden_size"]
    heads = h // DFLASH_HEAD_DIM  # heads * head_dim = hidden: the value can carry a whole row
    n_target = target["num_hidden_layers"]
    vocab = target["vocab_size"]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": h,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": DFLASH_HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": target["max_position_embeddings"],
        "rope_theta": DFLASH_ROPE_THETA,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": n_target,
        "dflash_config": {
            "target_layer_ids": dflash_target_layer_ids(n_target),
            "num_target_layers": n_target,
            "block_size": block_size,
            "mask_token": "<|MASK|>",
            "mask_token_id": vocab - 1 if mask_token_id is None else mask_token_id,
        },
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def dflash_position_biases(cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(query bias, key bias) of one head: unit pairs on the fastest RoPE pairs (NeoX layout:
    dims i and i + head_dim/2), the key's turned by one position's angle, so that
    q . R(-d) k = sum cos(theta_i (1 - d)) peaks at distance d = 1."""
    d = cfg["head_dim"]
    i = torch.arange(DFLASH_POSITION_PAIRS, dtype=torch.float64)
    theta = cfg["rope_theta"] ** (-2 * i / d)
    q = torch.zeros(d, dtype=torch.float64)
    k = torch.zeros(d, dtype=torch.float64)
    pairs = torch.arange(DFLASH_POSITION_PAIRS)
    q[pairs] = 1.0
    k[pairs], k[pairs + d // 2] = torch.cos(theta), torch.sin(theta)
    return q.to(torch.bfloat16), k.to(torch.bfloat16)


def dflash_weights(cfg: dict) -> dict[str, torch.Tensor]:
    """Layer 0 copies the previous position's normed input (x32) into the residual; further
    layers add nothing; `fc` is zero. No embedding or lm_head: DFlash uses the target's."""
    h, heads, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    f = cfg["intermediate_size"]
    n_features = len(cfg["dflash_config"]["target_layer_ids"])
    bf16 = torch.bfloat16
    zeros = lambda *s: torch.zeros(s, dtype=bf16)  # noqa: E731
    ones = lambda *s: torch.ones(s, dtype=bf16)  # noqa: E731
    q_bias, k_bias = dflash_position_biases(cfg)
    w = {
        "fc.weight": zeros(h, n_features * h),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
    }
    for layer in range(cfg["num_hidden_layers"]):
        copies = layer == 0
        a, p = f"layers.{layer}.self_attn.", f"layers.{layer}."
        w |= {
            a + "q_proj.weight": zeros(heads * d, h),
            a + "q_proj.bias": q_bias.repeat(heads) if copies else zeros(heads * d),
            a + "k_proj.weight": zeros(heads * d, h),
            a + "k_proj.bias": k_bias.repeat(heads) if copies else zeros(heads * d),
            a + "v_proj.weight": torch.eye(h, dtype=bf16) * DFLASH_VALUE_GAIN
            if copies
            else zeros(heads * d, h),
            a + "v_proj.bias": zeros(heads * d),
            a + "o_proj.weight": torch.eye(h, dtype=bf16) if copies else zeros(h, heads * d),
            a + "o_proj.bias": zeros(h),
            a + "q_norm.weight": torch.full((d,), DFLASH_NORM_GAIN, dtype=bf16),
            a + "k_norm.weight": torch.full((d,), DFLASH_NORM_GAIN, dtype=bf16),
            p + "mlp.gate_proj.weight": zeros(f, h),
            p + "mlp.up_proj.weight": zeros(f, h),
            p + "mlp.down_proj.weight": zeros(h, f),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
    return w


def build_dflash_draft(
    out: Path,
    target: dict,
    layers: int = 1,
    block_size: int = 16,
    config_only: bool = False,
) -> Path:
    """OUT: a DFlash draft of the target whose config is `target`."""
    tok, _ = _tokenizer()
    cfg = dflash_config(target, layers, block_size)
    _write(out, cfg, None if config_only else dflash_weights(cfg), tok)
    return out


def _write(
    directory: Path, config: dict, weights: dict[str, torch.Tensor] | None, tok: Path
) -> None:
    """An HF directory; `weights` None: config and tokenizer only (SGLang's dummy load)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(gen))
    if weights is not None:
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(tok, directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 8192,
            }
        )
    )


def build(
    out: Path,
    device: str = "cpu",
    layers: int = 8,
    shape: str = "small",
    config_only: bool = False,
    dflash_draft: Path | None = None,
    dflash_layers: int = 1,
    dflash_block_size: int = 16,
    multimodal: bool = False,
    fp8_block: bool = False,
) -> tuple[Path, Path]:
    """OUT/target and OUT/draft; also a DFlash draft of the target at `dflash_draft`;
    `multimodal`: the target in Qwen3.5's multimodal checkpoint form; `fp8_block`: the target
    block-quantized to FP8 (the draft stays bf16)."""
    tok, vocab = _tokenizer()
    tcfg = target_config(vocab, layers, SHAPES[shape])
    dcfg = draft_config(vocab, SHAPES[shape])
    written = multimodal_config(tcfg) if multimodal else tcfg
    if fp8_block:
        written = fp8_block_config(written, tcfg["layer_types"])
    if dflash_draft is not None:
        build_dflash_draft(dflash_draft, tcfg, dflash_layers, dflash_block_size, config_only)
    if config_only:
        _write(out / "target", written, None, tok)
        _write(out / "draft", dcfg, None, tok)
        return out / "target", out / "draft"
    target = target_weights(tcfg, _Init(device))
    stored = fp8_block_weights(target) if fp8_block else target
    _write(out / "target", written, multimodal_names(stored) if multimodal else stored, tok)
    _write(out / "draft", dcfg, draft_weights(dcfg, target), tok)
    return out / "target", out / "draft"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--config-only", action="store_true")
    parser.add_argument(
        "--multimodal", action="store_true", help="the target as Qwen3_5ForConditionalGeneration"
    )
    parser.add_argument(
        "--fp8-block", action="store_true", help="the target block-quantized to FP8 [128, 128]"
    )
    parser.add_argument("--dflash-draft", type=Path, help="also write a DFlash draft here")
    parser.add_argument("--dflash-layers", type=int, default=1)
    parser.add_argument("--dflash-block-size", type=int, default=16)
    args = parser.parse_args()
    target, draft = build(
        args.out,
        args.device,
        args.layers,
        args.shape,
        args.config_only,
        args.dflash_draft,
        args.dflash_layers,
        args.dflash_block_size,
        args.multimodal,
        args.fp8_block,
    )
    dflash = f" dflash {args.dflash_draft}" if args.dflash_draft else ""
    print(f"target {target} draft {draft}{dflash} (device {args.device})")


if __name__ == "__main__":
    main()
