"""Tiny random-weight checkpoints on disk, built the way a user's checkpoint would be.

The draft is the target plus noise, so greedy acceptance lands between 0 and k and every
rollback length gets exercised.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specdash.engine import ops
from specdash.engine.checkpoint import save_checkpoint
from specdash.engine.config import ModelConfig, preset
from specdash.engine.model import Model, random_tensors
from specdash.engine.state import SeqState

CORPUS = [
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n",
    "Speculative decoding drafts tokens cheaply and verifies them with the target model.\n",
]

PROMPTS = [
    "def add(a, b):",
    "The lazy dog",
    "class Queue:\n    def __init__(self):",
    "Speculative decoding " * 6,
    "for i in range(10):\n    print(i)\n" * 4,
    "x",
    "import os\nimport sys\n\ndef main():\n    return 0\n" * 8,
    "fox dog fox dog fox dog " * 12,
]


def build_tokenizer(vocab_size: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def tiny_config(vocab_size: int, family: str = "qwen3_5") -> ModelConfig:
    cfg = replace(preset("tiny-hybrid"), vocab_size=vocab_size, eos_token_ids=[])
    if family == "qwen3":
        cfg = replace(
            cfg, family="qwen3", layer_types=["full_attention"] * 4, partial_rotary_factor=1.0
        )
    return cfg


def kernel_sized(name: str) -> ModelConfig:
    """Preset `name` small, but inside the GPU kernels' shapes: pow2 head dims, Dv a multiple of
    32, every GEMM's K a multiple of 128 (the FP8 tile's K step)."""
    return replace(
        preset(name),
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    )


def write_pair(root: Path, seed: int = 0, noise: float = 0.02) -> tuple[Path, Path, Path]:
    """target/, draft/ and prompts.jsonl under `root`."""
    tok = build_tokenizer()
    cfg = tiny_config(tok.get_vocab_size())
    target = random_tensors(cfg, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    draft = {
        n: t + noise * torch.randn(t.shape, generator=gen) * t.std().clamp(min=1e-3)
        if t.dim() == 2
        else t.clone()
        for n, t in target.items()
    }
    save_checkpoint(root / "target", cfg, target, tok)
    save_checkpoint(root / "draft", cfg, draft, tok)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root / "target", root / "draft", prompts


def plain_greedy(model: Model, prompt: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n greedy tokens and their fp32 logprobs, straight from `Model.forward`: the reference
    every exactness test compares against, independent of the engine and its shadow."""
    state = SeqState.empty(model.cfg, len(prompt) + n + 1, model.dtype, model.device)
    with torch.inference_mode():
        lp = model.forward(torch.tensor(prompt, device=model.device), state, "prefill")
        ids, lps = ops.greedy(lp)
        out_ids, out_lps = [ids], [lps]
        for _ in range(n - 1):
            ids, lps = ops.greedy(model.forward(out_ids[-1], state, "exact"))
            state.commit(1)
            out_ids.append(ids)
            out_lps.append(lps)
    return torch.cat(out_ids).cpu(), torch.cat(out_lps).cpu()
