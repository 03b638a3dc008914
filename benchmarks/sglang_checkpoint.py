"""A Qwen3.5-shaped target and a dense Qwen3 draft that SGLang loads, with real acceptance.

Why this pair: SGLang's exactness problem needs the real Qwen3.5 head dims (attention head 256,
partial RoPE 0.25, output gate; GDN key/value heads of 128), and a draft-model algorithm needs a
draft whose proposals the target often accepts, so that verify commits several rows. Random
weights accept nothing. Here the residual stream is dominated by the token embedding (std 1) and
every layer writes into it through small output projections (std 0.02 * LAYER_SCALE), so the
target's greedy token is usually the "bigram" token lm_head(norm(embed(t))) but not always; the
layers still move the low bits of every logit. The draft is a one-layer dense Qwen3 (STANDALONE
refuses a Qwen3.5 draft: it becomes an MTP model) with the target's embedding and lm_head and
zero output projections: exactly that bigram. Both use the embedded pair's tokenizer.

Usage: python benchmarks/sglang_checkpoint.py OUT_DIR [--device cuda] [--layers 8]
Writes OUT_DIR/target and OUT_DIR/draft (HF format: config.json, model.safetensors,
tokenizer.json), the same bytes for the same arguments and torch version.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import save_file

LAYER_SCALE = 0.15
SEED = 1234
HIDDEN, INTERMEDIATE, HEAD_DIM, HEADS, KV_HEADS = 2048, 6144, 256, 8, 2
GDN_HEADS, GDN_HEAD_DIM, CONV = 16, 128, 4


def _tokenizer() -> tuple[Path, int]:
    data = resources.files("specdash") / "data" / "target"
    path = Path(str(data / "tokenizer.json"))
    vocab = json.loads((Path(str(data)) / "config.json").read_text())["vocab_size"]
    return path, vocab


def target_config(vocab: int, layers: int) -> dict:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
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
        "linear_num_key_heads": GDN_HEADS,
        "linear_num_value_heads": GDN_HEADS,
        "linear_key_head_dim": GDN_HEAD_DIM,
        "linear_value_head_dim": GDN_HEAD_DIM,
        "linear_conv_kernel_dim": CONV,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def draft_config(vocab: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
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
    v, h, f = cfg["vocab_size"], HIDDEN, INTERMEDIATE
    out_std = 0.02 * LAYER_SCALE
    zeros = lambda *s: torch.zeros(s, dtype=torch.bfloat16)  # noqa: E731  (Qwen3.5 norms: 1 + w)
    w = {"model.embed_tokens.weight": init.normal(v, h, std=1.0)}
    key_dim = GDN_HEADS * GDN_HEAD_DIM
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        if kind == "linear_attention":
            a = p + "linear_attn."
            w[a + "in_proj_qkv.weight"] = init.normal(2 * key_dim + key_dim, h, std=0.02)
            w[a + "in_proj_z.weight"] = init.normal(key_dim, h, std=0.02)
            w[a + "in_proj_b.weight"] = init.normal(GDN_HEADS, h, std=0.02)
            w[a + "in_proj_a.weight"] = init.normal(GDN_HEADS, h, std=0.02)
            w[a + "conv1d.weight"] = init.normal(3 * key_dim, 1, CONV, std=0.3)
            w[a + "dt_bias"] = torch.ones(GDN_HEADS, dtype=torch.bfloat16)
            decay = torch.linspace(1.0, 16.0, GDN_HEADS).log()
            w[a + "A_log"] = decay.to(torch.bfloat16)
            w[a + "norm.weight"] = torch.ones(GDN_HEAD_DIM, dtype=torch.bfloat16)
            w[a + "out_proj.weight"] = init.normal(h, key_dim, std=out_std)
        else:
            a = p + "self_attn."
            w[a + "q_proj.weight"] = init.normal(2 * HEADS * HEAD_DIM, h, std=0.02)
            w[a + "k_proj.weight"] = init.normal(KV_HEADS * HEAD_DIM, h, std=0.02)
            w[a + "v_proj.weight"] = init.normal(KV_HEADS * HEAD_DIM, h, std=0.02)
            w[a + "o_proj.weight"] = init.normal(h, HEADS * HEAD_DIM, std=out_std)
            w[a + "q_norm.weight"] = zeros(HEAD_DIM)
            w[a + "k_norm.weight"] = zeros(HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = init.normal(f, h, std=0.02)
        w[p + "mlp.up_proj.weight"] = init.normal(f, h, std=0.02)
        w[p + "mlp.down_proj.weight"] = init.normal(h, f, std=out_std)
        w[p + "input_layernorm.weight"] = zeros(h)
        w[p + "post_attention_layernorm.weight"] = zeros(h)
    w["model.norm.weight"] = zeros(h)
    w["lm_head.weight"] = init.normal(v, h, std=1.0 / math.sqrt(h))
    return w


def draft_weights(cfg: dict, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer whose output projections are zero: logits = lm_head(norm(embed(token)))."""
    h, heads, kv, d, f = HIDDEN, cfg["num_attention_heads"], cfg["num_key_value_heads"], 128, 1024
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


def _write(directory: Path, config: dict, weights: dict[str, torch.Tensor], tok: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(gen))
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


def build(out: Path, device: str = "cpu", layers: int = 8) -> tuple[Path, Path]:
    tok, vocab = _tokenizer()
    tcfg = target_config(vocab, layers)
    target = target_weights(tcfg, _Init(device))
    dcfg = draft_config(vocab)
    _write(out / "target", tcfg, target, tok)
    _write(out / "draft", dcfg, draft_weights(dcfg, target), tok)
    return out / "target", out / "draft"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    target, draft = build(args.out, args.device, args.layers)
    print(f"target {target} draft {draft} (device {args.device})")


if __name__ == "__main__":
    main()
