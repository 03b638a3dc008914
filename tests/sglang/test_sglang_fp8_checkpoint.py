"""`benchmarks/sglang_checkpoint.py --fp8-block` against SGLang's own FP8 code in the real 0.5.17
and 0.5.23 wheels: `Fp8Config.from_config` reads its `quantization_config` as a serialized
block-FP8 checkpoint; `is_layer_skipped`, with the model's `packed_modules_mapping`, keeps
exactly GDN's `in_proj_ba` in bf16 (and the block-quant shape validation shows why: its shards
are not multiples of 128), quantizes every other fused linear of the layers and the MTP layer;
every quantized shard is float8_e4m3fn with a float32 `weight_scale_inv` of
[ceil(N/128), ceil(K/128)], every kept one bf16 without scales; and each dequantized weight is
the bf16 one within e4m3's rounding."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from sglang_checkpoint import FP8_BLOCK, _Init, build, target_config, target_weights  # noqa: E402

LAYERS = 4  # three GDN layers and one attention layer

SCRIPT = """
import inspect, json, os
from types import SimpleNamespace
from safetensors import safe_open
from sglang.srt.layers.quantization import fp8
from sglang.srt.layers.quantization.utils import is_layer_skipped
from sglang.srt.models.qwen3_5 import Qwen3_5ForCausalLM

d = os.environ["CHECKPOINT"]
config = json.load(open(f"{d}/config.json"))
cfg = fp8.Fp8Config.from_config(config["quantization_config"])
packed = Qwen3_5ForCausalLM.packed_modules_mapping
validate = fp8.Fp8LinearMethod.validate_block_quant_shapes
fp8.get_parallel = lambda: SimpleNamespace(tp_size=1)  # the shape validation asks the TP size
with safe_open(f"{d}/model.safetensors", "pt") as st:
    tensors = {n: (st.get_slice(n).get_dtype(), st.get_slice(n).get_shape()) for n in st.keys()}
FUSED = {"linear_attention": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba",
                              "linear_attn.out_proj", "mlp.gate_up_proj", "mlp.down_proj"),
         "full_attention": ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                            "mlp.down_proj")}
modules = [(f"model.layers.{i}.", kind) for i, kind in enumerate(config["layer_types"])]
modules.append(("mtp.layers.0.", "full_attention"))
out = {"serialized": cfg.is_checkpoint_fp8_serialized, "block": cfg.weight_block_size,
       "scheme": cfg.activation_scheme, "modules": {}}
for prefix, kind in modules:
    for fused in FUSED[kind]:
        name = prefix + fused
        leaf = fused.rsplit(".", 1)[-1]
        shards = [name.replace(leaf, s) for s in packed.get(leaf, [leaf])]
        sizes = [tensors[s + ".weight"][1][0] for s in shards]
        k = tensors[shards[0] + ".weight"][1][1]
        try:
            n = sum(sizes)
            shapes = (cfg, k, k, n, n, sizes)
            if "layer" in inspect.signature(validate).parameters:  # 0.5.23: the layer's TP group
                shapes = (SimpleNamespace(tp_group=None), *shapes)
            validate(*shapes)
            valid = True
        except ValueError:
            valid = False
        out["modules"][name] = {
            "skipped": is_layer_skipped(name, cfg.ignored_layers, packed),
            "valid_block_shapes": valid,
            "shards": {s: [tensors[s + ".weight"], tensors.get(s + ".weight_scale_inv")]
                       for s in shards},
        }
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fp8ck")
    target, _ = build(out, layers=LAYERS, fp8_block=True)
    return target


def test_block_fp8_checkpoint_is_what_sglang_loads(run_each_sglang, fp8_checkpoint) -> None:
    proc = run_each_sglang(SCRIPT, env={"CHECKPOINT": str(fp8_checkpoint)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["serialized"] and r["block"] == [FP8_BLOCK, FP8_BLOCK] and r["scheme"] == "dynamic"
    assert len(r["modules"]) == 3 * 5 + 1 * 4 + 4  # three GDN layers, one attention, MTP
    for name, m in r["modules"].items():
        kept = name.endswith("in_proj_ba")
        assert m["skipped"] is kept, name
        assert m["valid_block_shapes"] is not kept, name  # why in_proj_ba must stay bf16
        for shard, ((dtype, shape), scale) in m["shards"].items():
            if kept:
                assert dtype == "BF16" and scale is None, shard
            else:
                want = [math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)]
                assert dtype == "F8_E4M3" and scale == ["F32", want], shard


def test_dequantized_weights_are_the_bf16_ones_within_e4m3_rounding(fp8_checkpoint) -> None:
    cfg = json.loads((fp8_checkpoint / "config.json").read_text())
    reference = target_weights(target_config(cfg["vocab_size"], LAYERS), _Init("cpu"))
    checked = 0
    with safe_open(str(fp8_checkpoint / "model.safetensors"), "pt") as st:
        for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
            t = st.get_tensor(name)
            if t.dtype != torch.float8_e4m3fn:
                if not name.endswith("weight_scale_inv"):
                    assert torch.equal(t, reference[name]), name  # kept tensors: the same bits
                continue
            scale = st.get_tensor(name + "_scale_inv")
            per_element = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
            per_element = per_element[: t.shape[0], : t.shape[1]]
            w = reference[name].float()
            err = (t.float() * per_element - w).abs()
            # e4m3: 3 mantissa bits (half an ulp is |w|/16), subnormal step 2^-9 of the scale
            assert bool((err <= w.abs() / 16 + per_element / 1024 + 1e-12).all()), name
            checked += 1
    assert checked == 3 * 6 + 7 + 7  # GDN layers 3 + MLP 3 each, attention and MTP 4 + 3


def test_config_only_27b_block_fp8_target_lists_every_gdn_layer_kept(tmp_path) -> None:
    """For SGLang's dummy load at the real shape: the config alone, its quantization config
    naming each of the 48 GDN layers' bf16 modules."""
    target, _ = build(tmp_path, layers=64, shape="27b", config_only=True, fp8_block=True)
    quant = json.loads((target / "config.json").read_text())["quantization_config"]
    assert quant["weight_block_size"] == [FP8_BLOCK, FP8_BLOCK] and quant["fmt"] == "e4m3"
    kept = quant["modules_to_not_convert"]
    assert len(kept) == 3 + 48 * 3 and "layers.62.linear_attn.in_proj_a" in kept
    assert "layers.63.linear_attn.in_proj_a" not in kept  # every 4th layer is attention
    assert not list(target.glob("*.safetensors"))
