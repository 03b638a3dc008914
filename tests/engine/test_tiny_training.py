"""The embedded tiny pair: the training script end to end, and the shipped checkpoint."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdash.engine.checkpoint import load_checkpoint
from specdash.engine.loader import default_checkpoint
from specdash.engine.model import Model
from specdash.engine.state import SeqState

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "specdash" / "data"
TINY_RUN = [
    "--steps", "2", "--draft-steps", "2", "--max-files", "40", "--seq-len", "96",
    "--hidden", "64", "--layers", "4", "--vocab", "384", "--continuations", "2",
    "--continuation-len", "8", "--prompts", "0",
]  # fmt: skip


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _train(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "training.train_tiny", "--out", str(out), *TINY_RUN],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )


def _forward_last(path: Path) -> torch.Tensor:
    cfg, tensors, tok = load_checkpoint(path, torch.float32, "cpu")
    ids = torch.tensor(tok.encode("def f(x):\n    return x\n").ids)
    state = SeqState.empty(cfg, ids.shape[0], torch.float32, torch.device("cpu"))
    return Model.from_tensors(cfg, tensors).forward(ids, state, "prefill")


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    a, b = tmp_path_factory.mktemp("run_a"), tmp_path_factory.mktemp("run_b")
    _train(a)
    _train(b)
    return a, b


def test_training_writes_loadable_checkpoints(tiny_runs: tuple[Path, Path]) -> None:
    out, _ = tiny_runs
    for name in ("target", "draft"):
        lp = _forward_last(out / name)
        assert lp.shape == (1, 384) and torch.isfinite(lp).all()
    cfg_t, _, _ = load_checkpoint(out / "target", torch.float32, "cpu")
    cfg_d, _, _ = load_checkpoint(out / "draft", torch.float32, "cpu")
    assert cfg_t.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg_d.layer_types == ["linear_attention", "full_attention"]
    corpus = json.loads((out / "corpus_manifest.json").read_text())
    splits = {f["split"] for f in corpus["files"]}
    assert splits == {"train", "heldout"}


def test_training_is_deterministic(tiny_runs: tuple[Path, Path]) -> None:
    a, b = tiny_runs
    for rel in ("target/model.safetensors", "draft/model.safetensors", "target/tokenizer.json"):
        assert _sha256(a / rel) == _sha256(b / rel), rel


def test_shipped_files_match_manifest() -> None:
    files = json.loads((DATA / "MANIFEST.json").read_text())["files"]
    for rel in ("target/model.safetensors", "draft/model.safetensors", "prompts.jsonl"):
        assert rel in files
    for rel, digest in files.items():
        assert _sha256(DATA / rel) == digest, rel
    weights = sum((DATA / d / "model.safetensors").stat().st_size for d in ("target", "draft"))
    assert weights <= 20 * 2**20


def test_shipped_pair_loads_through_the_default_path() -> None:
    cfg_t, _, tok_t = load_checkpoint(default_checkpoint("target"), torch.float32, "cpu")
    cfg_d, _, tok_d = load_checkpoint(default_checkpoint("draft"), torch.float32, "cpu")
    assert tok_t.to_str() == tok_d.to_str()
    assert cfg_t.eos_token_ids == cfg_d.eos_token_ids == [tok_t.token_to_id("<|endoftext|>")]
    assert "full_attention" in cfg_t.layer_types and "linear_attention" in cfg_t.layer_types
    assert cfg_d.num_hidden_layers <= 2 < cfg_t.num_hidden_layers
    assert torch.isfinite(_forward_last(default_checkpoint("draft"))).all()


def test_prompts_are_heldout_and_round_trip() -> None:
    cfg, _, tok = load_checkpoint(DATA / "target", torch.float32, "cpu")
    corpus = json.loads((DATA / "corpus_manifest.json").read_text())
    heldout = {f["path"] for f in corpus["files"] if f["split"] == "heldout"}
    rows = [json.loads(line) for line in (DATA / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    assert {(r["length"], r["kind"]) for r in rows} == {
        (length, kind) for length in ("short", "2k", "long") for kind in ("code", "prose")
    }
    bounds = {"short": (50, 200), "2k": (1500, 2600), "long": (4000, 6000)}
    for r in rows:
        ids = tok.encode(r["prompt"]).ids
        assert tok.decode(ids) == r["prompt"], r["name"]
        lo, hi = bounds[r["length"]]
        assert lo <= len(ids) <= hi, (r["name"], len(ids))
        assert len(ids) + 256 + 5 <= cfg.max_position_embeddings
        assert r["source"].rsplit(":", 1)[0] in heldout


def test_shipped_target_is_a_transformers_checkpoint() -> None:
    """Hugging Face transformers loads the shipped target as the same model (to fp32 noise)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(DATA / "target"), dtype=torch.float32
    )
    cfg, tensors, tok = load_checkpoint(DATA / "target", torch.float32, "cpu")
    prompt = json.loads((DATA / "prompts.jsonl").read_text().splitlines()[0])["prompt"]
    ids = torch.tensor(tok.encode(prompt).ids)
    with torch.no_grad():
        ref = torch.log_softmax(hf.eval()(ids[None]).logits[0].float(), -1)
        state = SeqState.empty(cfg, ids.shape[0], torch.float32, torch.device("cpu"))
        ours = Model.from_tensors(cfg, tensors).forward(ids, state, "prefill", all_logits=True)
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    assert torch.equal(ref.argmax(-1), ours.argmax(-1))
    assert (ref - ours).abs().max().item() < 1e-3
