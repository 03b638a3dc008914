"""`benchmarks/sglang_checkpoint.py --multimodal`, the target in the form Qwen3.5's own
checkpoints have (`Qwen3_5ForConditionalGeneration`), against the real SGLang 0.5.17 and 0.5.23
wheels: SGLang's own class, built on CPU from the checkpoint's config through SGLang's config
loader, fills every language-model parameter from it through its `load_weights`, bit-equal to
the text-form build's tensors (q/k/v, gate/up and the GDN projections fused in SGLang's order);
SGLang's NEXTN draft class for it (`Qwen3_5ForCausalLMMTP`) fills its own from `mtp.*`; no
checkpoint tensor is left unread; the class flags the layers DFLASH asks it to capture; and
specdash's DFLASH preflight takes the multimodal target with its DFlash draft on both
releases (0.5.17 refuses its text-only class for DFLASH)."""

from __future__ import annotations

import json

LOAD = """
import contextlib, json, os, socket, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
import sglang.srt.layers.rotary_embedding.base as rope_base
from sglang.srt.distributed import parallel_state
from sglang.srt import runtime_context
from sglang.srt.runtime_context import _CONTEXT, get_parallel
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_config
sys.path.insert(0, "benchmarks")
from sglang_checkpoint import build, dflash_target_layer_ids

rope_base._is_cpu = True  # RoPE's CUDA-less fallback imports vllm; the native path is the same
root = Path(os.environ["WORKDIR"])
text, _ = build(root / "text", layers=4)
target, _ = build(root / "multimodal", layers=4, multimodal=True)

# One CPU rank's process groups (gloo), as SGLang's model runner sets them up on a GPU; no
# radix cache: its Mamba state buffer wants a GPU kernel library.
_CONTEXT.set_server_args(ServerArgs(model_path=str(target), device="cpu", disable_radix_cache=True))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
parallel_state.init_distributed_environment(
    world_size=1, rank=0, local_rank=0, backend="gloo",
    distributed_init_method=f"tcp://127.0.0.1:{port}")
parallel_state.initialize_model_parallel(backend="gloo")  # all widths 1
from sglang.srt.models.qwen3_5 import Qwen3_5ForConditionalGeneration
from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

config = get_config(str(target), trust_remote_code=False)
with contextlib.ExitStack() as stack:
    stack.enter_context(get_parallel().override(
        **{f"{group}_{what}": 0 if what == "rank" else 1
           for group in ("tp", "attn_tp", "attn_dp", "pp", "attn_cp", "moe_ep", "moe_tp", "moe_dp")
           for what in ("size", "rank")}))
    if hasattr(runtime_context, "get_exec") and "boundary_reduction" in dir(
        runtime_context.get_exec().comm):  # 0.5.23 resolves it before building a model
        stack.enter_context(runtime_context.get_exec().comm.override(boundary_reduction="ar"))
    model = Qwen3_5ForConditionalGeneration(config)
    mtp = Qwen3_5ForCausalLMMTP(config)

FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
    "in_proj_ba": ("in_proj_b", "in_proj_a"),
}
ATTENTION = {"qkv_proj", "o_proj", "q_norm", "k_norm"}  # SGLang drops their `self_attn.`

def sources(param, prefix):
    # the text-form tensors one SGLang parameter holds, in its fused order; `prefix`: the
    # checkpoint's name for SGLang's `model.` ("model." for the target, "mtp." for its head)
    if param == "model.embed_tokens.weight":
        return [param]  # the target's (0.5.23's NEXTN head reads it from the checkpoint)
    name = prefix + param[len("model."):] if param.startswith("model.") else param
    if prefix == "mtp." and not param.startswith(("model.", "lm_head")):
        name = "mtp." + param  # fc, pre_fc_norm_*
    parts = name.split(".")
    if "layers" in parts and parts[parts.index("layers") + 2] in ATTENTION:
        parts.insert(parts.index("layers") + 2, "self_attn")
        name = ".".join(parts)
    for fused, unfused in FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, part) for part in unfused]
    return [name]

text_tensors = load_file(str(text / "model.safetensors"))
checkpoint = load_file(str(target / "model.safetensors"))

def check(module, prefix):
    params = dict(module.named_parameters())
    language = {n: p for n, p in params.items() if not n.startswith("visual.")}
    for p in language.values():
        p.data.fill_(float("nan"))
    module.load_weights(iter(checkpoint.items()))
    unfilled = sorted(n for n, p in language.items() if p.isnan().any())
    filled = {n: p for n, p in language.items() if n not in unfilled}
    return {
        "unfilled": unfilled,
        "differ": sorted(
            n for n, p in filled.items()
            if not torch.equal(p.data.to(torch.bfloat16),
                               torch.cat([text_tensors[s] for s in sources(n, prefix)]))
        ),
        "read": sorted({s for n in filled for s in sources(n, prefix)}),
        "vision": sorted({n.split(".")[1] for n in params if n.startswith("visual.")}),
    }

r = {"target": check(model, "model."), "mtp": check(mtp, "mtp.")}
read = set(r["target"].pop("read")) | set(r["mtp"].pop("read"))
renamed = {n.replace("model.language_model.", "model.", 1) for n in checkpoint}
r["unread"] = sorted(renamed - read)
r["renamed_as_text"] = renamed == set(text_tensors) and len(checkpoint) == len(text_tensors)
r["text_config"] = json.loads((target / "config.json").read_text())["text_config"] == {
    k: v for k, v in json.loads((text / "config.json").read_text()).items()
    if k != "architectures"}
ids = dflash_target_layer_ids(4)
model.set_dflash_layers_to_capture(ids)
r["capturing"] = model.capture_aux_hidden_states
r["captures"] = [i for i, layer in enumerate(model.model.layers)
                 if getattr(layer, "_is_layer_to_capture", False)]
r["capture_ids"] = ids
print("RESULT " + json.dumps(r))
"""


def result(proc) -> dict:
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])


def test_sglang_loads_the_multimodal_target_bit_equal(run_each_sglang, tmp_path) -> None:
    r = result(run_each_sglang(LOAD, env={"WORKDIR": str(tmp_path)}, timeout=600))
    assert r["target"]["unfilled"] == [] and r["target"]["differ"] == [], r["target"]
    # the MTP head's lm_head (0.5.17: and embedding) is the target's, shared at start
    shared = ["lm_head.weight"] + (
        ["model.embed_tokens.weight"] * (run_each_sglang.version == "0.5.17")
    )
    assert r["mtp"]["unfilled"] == shared, r["mtp"]
    assert r["mtp"]["differ"] == []
    assert r["unread"] == [] and r["renamed_as_text"] and r["text_config"]
    assert r["target"]["vision"] == ["blocks", "merger", "patch_embed", "pos_embed"]
    # the output of each layer DFLASH reads, taken where the next layer starts
    assert r["capturing"] and r["captures"] == [i + 1 for i in r["capture_ids"]] != []


PREFLIGHT = """
import contextlib, io, json, os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from sglang_checkpoint import build
from specdash.cli import main

root = Path(os.environ["WORKDIR"])
target, _ = build(root / "pair", layers=8, config_only=True, multimodal=True,
                  dflash_draft=root / "dflash")
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["run", "--headless", "--engine", "sglang", "--model", str(target),
                 "--draft", str(root / "dflash"), "--speculative-algorithm", "DFLASH"])
config = json.loads((target / "config.json").read_text())
print("RESULT " + json.dumps({"run": [code, err.getvalue().strip().splitlines()],
                              "architectures": config["architectures"]}))
"""


def test_dflash_preflight_takes_the_multimodal_target(run_each_sglang, tmp_path) -> None:
    r = result(run_each_sglang(PREFLIGHT, env={"WORKDIR": str(tmp_path)}))
    assert r["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    code, lines = r["run"]
    # past the algorithm checks: nothing refused it
    assert code == 4 and len(lines) == 1 and lines[0].startswith("specdash: error: "), r["run"]
    assert "the SGLang engine needs a CUDA GPU" in lines[0]
