"""`specdash compare` on the GPU, a quant against its reference: the same random weights saved as a
bf16 checkpoint and as a block-FP8 one (as Qwen ships them), each run through the real CLI on
CUDA (the FP8 one on the FP8 tile), then compared and re-scored teacher-forced on CUDA.

Skipped without a CUDA device with FP8 (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_fp8_checkpoint import CFG
from tiny_models import PROMPTS, build_tokenizer

from specdash.cli import main
from specdash.engine.checkpoint import save_checkpoint
from specdash.engine.model import random_tensors
from specdash.errors import EXIT_OK

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a CUDA GPU with FP8 (compute capability 8.9+)",
    ),
]
TOKENS = 24
DEVICE = "cuda"


def test_fp8_against_bf16_on_cuda_is_deterministic_and_rescored_to_its_bits(tmp_path: Path, capsys):
    tok = build_tokenizer()
    fp8 = replace(CFG, vocab_size=tok.get_vocab_size())
    weights = random_tensors(fp8, 0)
    save_checkpoint(tmp_path / "bf16", replace(fp8, quantization=None), weights, tok)
    save_checkpoint(tmp_path / "fp8", fp8, weights, tok)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:6]))
    traces = {}
    for name in ("bf16", "fp8"):
        traces[name] = str(tmp_path / f"{name}.jsonl")
        argv = ["run", "--headless", "--device", DEVICE, "--model", str(tmp_path / name),
                "--prompts", str(prompts), "--max-new-tokens", str(TOKENS),
                "--drafter", "ngram", "-k", "3", "--trace", traces[name]]  # fmt: skip
        assert main(argv) == EXIT_OK
    capsys.readouterr()
    assert main(["compare", traces["bf16"], traces["fp8"], "--json"]) == EXIT_OK
    r = json.loads(capsys.readouterr().out)
    det = r["determinism"]
    assert det["deterministic"] and det["exact"] == {"a": "6/6", "b": "6/6"}
    # every re-scored token of each path equals its recorded logprob bits (compare checks it
    # before it reports; here: it checked all of A's and B's up to its first flip)
    assert det["reproduced_tokens"]["a"] == 6 * TOKENS
    prompts_out = r["prompts"]
    assert det["reproduced_tokens"]["b"] == sum(
        min(p["agree"] + 1, p["tokens_b"]) for p in prompts_out
    )
    for p in prompts_out:
        tf = p["teacher_forced"]
        assert tf["positions"] == TOKENS
        assert tf["mean_abs_delta_logprob"] > 0  # FP8 weights are not bf16's
        assert 0 <= tf["argmax_agree"] <= TOKENS  # random weights: FP8 may flip every argmax
        assert p["verdict"]
    assert r["totals"]["prompts"] == 6
