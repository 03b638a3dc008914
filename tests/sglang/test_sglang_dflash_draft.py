"""The DFlash draft `benchmarks/sglang_checkpoint.py --dflash-draft` builds, against the real
SGLang 0.5.17 and 0.5.23 wheels: SGLang's own `DFlashDraftModel`, built from the draft's
config, loads every tensor of the checkpoint through its `load_weights` (no parameter left
unfilled, no checkpoint tensor dropped, the fused q/k/v and gate/up in SGLang's order), also at
the 27B shape; the loaded attention, run through SGLang's own q/k norms and RoPE, attends one
position back (what makes the draft propose the bigram of the last token); and specdash's
DFLASH preflight takes the draft with its target in the multimodal form Qwen3.5's checkpoints
have (on 0.5.17 with the `dflash-logprobs` patch, the default; refused without it, and refused
for 0.5.17's text-only class, which captures no hidden states) and refuses it with another one."""

from __future__ import annotations

import json

BUILD = """
import os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from sglang_checkpoint import SHAPES, _tokenizer, build_dflash_draft, dflash_weights, target_config
root = Path(os.environ["WORKDIR"])
_, vocab = _tokenizer()
"""

LOAD = (
    BUILD
    + """
import json
import torch
from safetensors.torch import load_file
from transformers import AutoConfig
import sglang.srt.layers.rotary_embedding.base as rope_base
from sglang.srt.runtime_context import _CONTEXT, get_parallel
from sglang.srt.server_args import ServerArgs

rope_base._is_cpu = True  # RoPE's CUDA-less fallback imports vllm; the native path is the same

def sglang_model(directory):
    from sglang.srt.models.dflash import DFlashDraftModel
    _CONTEXT.set_server_args(ServerArgs(model_path=str(directory), device="cpu"))
    with get_parallel().override(tp_size=1, tp_rank=0):
        return DFlashDraftModel(AutoConfig.from_pretrained(directory))

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

def sources(name):
    # the checkpoint tensors one SGLang parameter holds, in its fused order
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, part) for part in parts]
    return [name]

def check(directory):
    model = sglang_model(directory)
    tensors = load_file(str(directory / "model.safetensors"))
    params = dict(model.named_parameters())
    for p in params.values():
        p.data.fill_(float("nan"))
    model.load_weights(iter(tensors.items()))
    covered = {s for n in params for s in sources(n)}
    return {
        "unfilled": sorted(n for n, p in params.items() if p.isnan().any()),
        "dropped": sorted(set(tensors) - covered),
        "differ": sorted(
            n for n, p in params.items()
            if not torch.equal(p.data.to(torch.bfloat16),
                               torch.cat([tensors[s] for s in sources(n)]))
        ),
        "model": model,
    }

small = target_config(vocab, 8)
draft = build_dflash_draft(root / "small", small, layers=2, block_size=8)
r = check(draft)
model = r.pop("model")

# Layer 0's attention score against a key at each distance, through SGLang's norms and RoPE.
attn = model.layers[0].self_attn
bias = attn.qkv_proj.bias.data.float()
d = attn.head_dim
q = attn.q_norm.forward_native(bias[:d].view(1, d))
k = attn.k_norm.forward_native(bias[attn.q_size : attn.q_size + d].view(1, d))
distances = torch.arange(-8, 8100)
n = distances.numel()
query_at = torch.full((n,), 8100)
qr, _ = attn.rotary_emb.forward_native(query_at, q.expand(n, d).clone(), k.expand(n, d).clone())
_, kr = attn.rotary_emb.forward_native(
    query_at - distances, q.expand(n, d).clone(), k.expand(n, d).clone()
)
score = (qr * kr).sum(-1) * attn.scaling
r["peak_distance"] = int(distances[score.argmax()])
r["margin"] = score[distances == 1].item() - score[distances != 1].max().item()

cfg27 = json.loads((build_dflash_draft(root / "27b", target_config(vocab, 64, SHAPES["27b"]),
                                      config_only=True) / "config.json").read_text())
model27 = sglang_model(root / "27b")
shapes = {n: list(p.shape) for n, p in model27.named_parameters()}
built = dflash_weights(cfg27)
built_fused = {n: list(torch.cat([built[s] for s in sources(n)]).shape) for n in shapes}
r27 = {"same_shapes": shapes == built_fused, "fc": shapes["fc.weight"],
       "qkv": shapes["layers.0.self_attn.qkv_proj.weight"]}
print("RESULT " + json.dumps({"small": r, "27b": r27}))
"""
)


def result(proc) -> dict:
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])


def test_sglang_dflash_draft_model_loads_the_built_draft(run_each_sglang, tmp_path) -> None:
    r = result(run_each_sglang(LOAD, env={"WORKDIR": str(tmp_path)}, timeout=600))
    small = r["small"]
    assert small["unfilled"] == [] and small["dropped"] == [] and small["differ"] == []
    assert small["peak_distance"] == 1 and small["margin"] > 50, small
    assert r["27b"] == {"same_shapes": True, "fc": [5120, 3 * 5120], "qkv": [3 * 5120, 5120]}


PREFLIGHT = (
    BUILD
    + """
import contextlib, io, json
sys.path.insert(0, "benchmarks")
from sglang_checkpoint import build
from specdash.cli import main

target, _ = build(root / "pair", layers=8, config_only=True, dflash_draft=root / "dflash")
# the targets as Qwen3.5's own checkpoints are: the multimodal class, sizes in text_config
own, _ = build(root / "own", layers=8, config_only=True, multimodal=True)
wide, _ = build(root / "wide", layers=8, shape="27b", config_only=True, multimodal=True)
shallow, _ = build(root / "shallow", layers=4, config_only=True, multimodal=True)

def run(model, *flags):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--headless", "--engine", "sglang", "--model", str(model),
                     "--draft", str(root / "dflash"), "--speculative-algorithm", "DFLASH", *flags])
    return [code, err.getvalue().strip().splitlines()]

print("RESULT " + json.dumps({
    "own": run(own), "wide": run(wide), "shallow": run(shallow),
    "own_text": run(target), "own_unpatched": run(own, "--sglang-unpatch", "dflash-logprobs"),
}))
"""
)

NO_GPU = "the SGLang engine needs a CUDA GPU"  # past the algorithm check: nothing refused it


def test_dflash_preflight_takes_the_built_draft_for_its_target_only(
    run_each_sglang, tmp_path
) -> None:
    r = result(run_each_sglang(PREFLIGHT, env={"WORKDIR": str(tmp_path)}))
    for case, (_, lines) in r.items():
        assert len(lines) == 1 and lines[0].startswith("specdash: error: "), (case, lines)
    code, (line,) = r["own"]
    assert code == 4 and NO_GPU in line
    if run_each_sglang.version == "0.5.17":
        code, (line,) = r["own_unpatched"]
        assert code == 2 and "SGLang 0.5.17's DFLASH returns no logprobs" in line
        code, (line,) = r["own_text"]  # its text-only class captures nothing for DFLASH
        assert code == 2 and "0.5.17's Qwen3_5ForCausalLM cannot capture them" in line
    else:
        for case in ("own_unpatched", "own_text"):
            code, (line,) = r[case]
            assert code == 4 and NO_GPU in line
    assert r["wide"][0] == 2 and "its hidden_size is 2048, the target's 5120" in r["wide"][1][0]
    assert r["shallow"][0] == 2
    assert "reads target layers [1, 3, 5], and the target has 4" in r["shallow"][1][0]
