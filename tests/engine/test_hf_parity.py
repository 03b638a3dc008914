"""Parity with Hugging Face transformers' own Qwen3, Qwen3-Next and Qwen3.5 on tiny random configs.

Each config is saved to disk by specdash, loaded back by both implementations, and must
give close logits and the same 32 greedy tokens; so must each config.json field that changes
the math, changed alone (and shown to change transformers' output), and an activation the
engine does not run is refused. transformers is used here only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdash.engine import ops
from specdash.engine.checkpoint import load_checkpoint, load_tensors, save_checkpoint
from specdash.engine.config import config_from_hf, preset
from specdash.engine.model import Model, random_tensors
from specdash.engine.state import SeqState
from specdash.errors import CheckpointError

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


def _transformers_run(path: Path, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own greedy tokens and logprobs for the checkpoint at `path`."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    hf.eval()
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
    return hf_tokens, hf_logprobs


def _our_run(path: Path, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """specdash's greedy tokens and logprobs, the checkpoint loaded as `specdash run` does."""
    loaded_cfg = config_from_hf(path)
    tensors = load_tensors(path, loaded_cfg, torch.float32, "cpu")
    ours = Model.from_tensors(loaded_cfg, tensors, consume=True)
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
    return torch.cat(tokens), torch.stack(logprobs)


def _checkpoint(path: Path, cfg, edit: dict[str, object] | None = None) -> Path:
    """`cfg` saved with perturbed random weights; `edit` then written over its config.json
    (a key set to None is removed), as a checkpoint's author would spell a field."""
    save_checkpoint(path, cfg, _perturbed_tensors(cfg, seed=3))
    if edit:
        raw = json.loads((path / "config.json").read_text())
        raw |= edit
        raw = {k: v for k, v in raw.items() if v is not None}
        (path / "config.json").write_text(json.dumps(raw))
    return path


def _prompt(cfg) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(0))


def _assert_same(ours: tuple[torch.Tensor, torch.Tensor], hf: tuple[torch.Tensor, torch.Tensor]):
    assert torch.equal(ours[0], hf[0])
    torch.testing.assert_close(ours[1], hf[1], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "qwen3_5"])
def test_logits_and_greedy_tokens_match_transformers(family: str, tmp_path: Path) -> None:
    cfg = _config(family)
    path = _checkpoint(tmp_path, cfg)
    _assert_same(_our_run(path, _prompt(cfg)), _transformers_run(path, _prompt(cfg)))


FIELDS = [
    # (family, ModelConfig fields changed before saving, config.json keys written after,
    #  whether transformers computes another model with it)
    ("qwen3", {}, {"hidden_act": "swish"}, False),  # transformers' other name for SiLU
    ("qwen3_5", {}, {"hidden_act": "swish"}, False),
    ("qwen3", {"rms_norm_eps": 0.5}, {}, True),
    ("qwen3_5", {"rms_norm_eps": 0.5}, {}, True),
    ("qwen3", {"rope_theta": 10.0}, {}, True),
    ("qwen3_next", {"rope_theta": 10.0}, {}, True),
    ("qwen3", {"partial_rotary_factor": 0.5}, {}, False),  # Qwen3 rotates the whole head
    ("qwen3_next", {"partial_rotary_factor": 0.5}, {}, True),
    ("qwen3_5", {"head_dim": 12, "partial_rotary_factor": 0.25}, {}, True),  # rotary dim 3
    ("qwen3_next", {"head_dim": 24}, {}, True),  # not hidden_size / heads
    ("qwen3", {"tie_word_embeddings": True}, {}, True),
    ("qwen3_5", {"num_key_value_heads": 1}, {}, True),
    ("qwen3_next", {"linear_conv_kernel_dim": 3}, {}, True),
    ("qwen3_5", {"layer_types": ["full_attention", "linear_attention"] * 2}, {}, True),
    ("qwen3_next", {"layer_types": ["linear_attention", "full_attention"] * 2},
     {"layer_types": None, "full_attention_interval": 2}, True),
]  # fmt: skip
"""Every config.json field that changes the math, each changed alone, read by both."""


@pytest.mark.parametrize("family,change,edit,matters", FIELDS)
def test_each_field_that_changes_the_math_is_read_as_transformers_reads_it(
    family: str, change: dict, edit: dict, matters: bool, tmp_path: Path
) -> None:
    base = _config(family)
    cfg = replace(base, **change)
    changed = _checkpoint(tmp_path / "changed", cfg, edit)
    prompt = _prompt(cfg)
    hf = _transformers_run(changed, prompt)
    _assert_same(_our_run(changed, prompt), hf)
    # the change matters to transformers (or, where marked, does not): not a test that
    # would pass with the field ignored
    hf_base = _transformers_run(_checkpoint(tmp_path / "base", base), prompt)
    same = hf_base[1].shape == hf[1].shape and torch.allclose(hf_base[1], hf[1], atol=1e-3)
    assert same != matters


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "relu"])
def test_an_activation_the_engine_does_not_run_is_refused(
    family: str, act: str, tmp_path: Path
) -> None:
    """transformers runs it, and computes another model than SiLU's: refused, never run as
    SiLU."""
    cfg = _config(family)
    path = _checkpoint(tmp_path / "act", cfg, {"hidden_act": act})
    with pytest.raises(CheckpointError, match=f"hidden_act '{act}' is not supported"):
        config_from_hf(path)
    if family == "qwen3":
        prompt = _prompt(cfg)
        silu = _transformers_run(_checkpoint(tmp_path / "silu", cfg), prompt)
        assert not torch.allclose(_transformers_run(path, prompt)[1], silu[1], atol=1e-3)


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
