"""Parity with Hugging Face transformers' own Qwen3, Qwen3-Next and Qwen3.5 on tiny random configs.

Each config is saved to disk by specdash, loaded back by both implementations, and must
give close logits and the same 32 greedy tokens. transformers is used here only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdash.engine import ops
from specdash.engine.checkpoint import load_checkpoint, load_tensors, save_checkpoint
from specdash.engine.config import config_from_hf, preset
from specdash.engine.model import Model, random_tensors
from specdash.engine.state import SeqState

transformers = pytest.importorskip("transformers")

STEPS = 32


def _config(family: str):
    base = replace(preset("tiny-hybrid"), vocab_size=384, max_position_embeddings=256)
    if family == "qwen3":
        return replace(
            base, family="qwen3", layer_types=["full_attention"] * 4, partial_rotary_factor=1.0
        )
    return replace(base, family=family, layer_types=list(base.layer_types))


def _perturbed_tensors(cfg, seed: int) -> dict[str, torch.Tensor]:
    """Random weights with non-trivial norm weights, so (1 + w) vs w conventions matter."""
    gen = torch.Generator().manual_seed(seed + 100)
    out = random_tensors(cfg, seed)
    for name, t in out.items():
        if t.dim() == 1 and not name.endswith(("A_log", "dt_bias")):
            out[name] = t + 0.2 * torch.randn(t.shape, generator=gen)
    return out


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "qwen3_5"])
def test_logits_and_greedy_tokens_match_transformers(family: str, tmp_path: Path) -> None:
    cfg = _config(family)
    save_checkpoint(tmp_path, cfg, _perturbed_tensors(cfg, seed=3))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    hf.eval()
    loaded_cfg = config_from_hf(tmp_path)
    tensors = load_tensors(tmp_path, loaded_cfg, torch.float32, "cpu")
    ours = Model.from_tensors(loaded_cfg, tensors, consume=True)  # as `specdash run` loads

    prompt = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf_out = hf.generate(
            prompt[None],
            max_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    hf_tokens = hf_out.sequences[0, prompt.shape[0] :]
    hf_logprobs = torch.stack([torch.log_softmax(lg[0].float(), -1) for lg in hf_out.logits])

    state = SeqState.empty(
        loaded_cfg, prompt.shape[0] + STEPS + 1, torch.float32, torch.device("cpu")
    )
    with torch.inference_mode():
        lp = ours.forward(prompt, state, "prefill")
        tokens, logprobs = [], [lp[0]]
        for _ in range(STEPS - 1):
            tok, _ = ops.greedy(logprobs[-1][None])
            tokens.append(tok)
            logprobs.append(ours.forward(tok, state, "exact")[0])
            state.commit(1)
        tokens.append(ops.greedy(logprobs[-1][None])[0])
    assert torch.equal(torch.cat(tokens), hf_tokens)
    torch.testing.assert_close(torch.stack(logprobs), hf_logprobs, atol=2e-4, rtol=1e-4)


def test_sharded_checkpoint_loads_like_single_file(tmp_path: Path) -> None:
    from tiny_models import build_tokenizer

    cfg = replace(_config("qwen3_5"), vocab_size=320)
    tensors = random_tensors(cfg, seed=5)
    tok = build_tokenizer()
    save_checkpoint(tmp_path / "single", cfg, tensors, tok)
    save_checkpoint(tmp_path / "sharded", cfg, tensors, tok, max_shard_bytes=40_000)
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    _, a, _ = load_checkpoint(tmp_path / "single", torch.float32, "cpu")
    _, b, _ = load_checkpoint(tmp_path / "sharded", torch.float32, "cpu")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_consuming_the_tensors_frees_each_layers_and_builds_the_same_model() -> None:
    cfg = _config("qwen3_5")
    tensors = _perturbed_tensors(cfg, seed=4)
    kept = Model.from_tensors(cfg, dict(tensors))
    consumed = Model.from_tensors(cfg, tensors, consume=True)
    assert not [k for k in tensors if ".layers." in k] and tensors  # embed, final norm remain
    prompt = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(1))
    logits = [
        m.forward(prompt, SeqState.empty(cfg, 16, torch.float32, torch.device("cpu")), "prefill")
        for m in (kept, consumed)
    ]
    assert torch.equal(logits[0], logits[1])
