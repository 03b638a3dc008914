"""Every quantization setting reaches SGLang only if it is proven exact; the rest is refused
before any engine starts, in one line on stderr with its exit code (the real CLI, the real
0.5.23 wheel, no GPU): AWQ/GPTQ/Marlin (batch-variant K split, atomicAdd) and untested settings
exit 2 naming what works instead; a block-FP8 checkpoint with another block size, a missing
scale or a scale of the wrong shape exits 3; FP8 on a card below sm_89 exits 4 naming the card.
w8a8_fp8, whose GEMMs are online FP8's, is refused until a GPU run shows it exact.
The exact ones (online FP8, FP8 KV cache, a block-FP8 checkpoint as
benchmarks/sglang_checkpoint.py writes it) pass the check and stop only at the missing GPU."""

from __future__ import annotations

import json

from specdash.runs.sglang import quantization

SCRIPT = """
import contextlib, io, json, os, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
sys.path.insert(0, "benchmarks")
from specdash.kernels.fp8 import quantize_blocks as block_fp8
from specdash.cli import main

root = Path(os.environ["WORKDIR"])
qwen35 = {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 256, "vocab_size": 512,
          "num_hidden_layers": 1}
FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}

def checkpoint(name, quant=None, tensors=None):
    d = root / name
    d.mkdir(exist_ok=True)
    config = {**qwen35, **({"quantization_config": quant} if quant else {})}
    (d / "config.json").write_text(json.dumps(config))
    tensors = tensors or {"model.embed_tokens.weight": torch.zeros(2, 2)}
    save_file(tensors, str(d / "model.safetensors"))
    return str(d)

q, s = block_fp8(torch.randn(300, 256))  # 300 rows: the last block is partial
proj = "model.layers.0.mlp.down_proj."
bf16 = checkpoint("bf16")
block = checkpoint("block", FP8, {proj + "weight": q, proj + "weight_scale_inv": s})
block64 = checkpoint("block64", {**FP8, "weight_block_size": [64, 64]})
no_scale = checkpoint("no-scale", FP8, {proj + "weight": q})
bad_scale = checkpoint("bad-scale", FP8, {proj + "weight": q, proj + "weight_scale_inv": s[:2]})
awq = checkpoint("awq", {"quant_method": "awq", "bits": 4})

def run(model, *args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--headless", "--engine", "sglang", "--model", model,
                     "--speculative-algorithm", "NGRAM", *args])
    return [code, err.getvalue().strip().splitlines()]

arg = lambda a: ["--sglang-arg", a]  # noqa: E731
out = {
    "awq_marlin": run(bf16, *arg("quantization=awq_marlin")),
    "gptq": run(bf16, *arg("quantization=gptq")),
    "bnb": run(bf16, *arg("quantization=bitsandbytes")),
    "kv_e5m2": run(bf16, *arg("kv_cache_dtype=fp8_e5m2")),
    "fp8_backend": run(bf16, *arg("quantization=fp8"), *arg("fp8_gemm_runner_backend=cutlass")),
    "torchao": run(bf16, *arg("torchao_config=int4wo-128")),
    "awq_checkpoint": run(awq),
    "block64": run(block64),
    "no_scale": run(no_scale),
    "bad_scale": run(bad_scale),
    "fp8": run(bf16, *arg("quantization=fp8")),
    "w8a8_fp8": run(bf16, *arg("quantization=w8a8_fp8")),
    "kv_fp8": run(bf16, *arg("kv_cache_dtype=fp8_e4m3")),
    "block_ok": run(block),
}
# a card without FP8 tensor cores (an A100), seen through torch as on a GPU machine
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a: (8, 0)
torch.cuda.get_device_name = lambda *a: "NVIDIA A100-SXM4-80GB"
out["a100_fp8"] = run(bf16, *arg("quantization=fp8"))
out["a100_block"] = run(block)
print("RESULT " + json.dumps(out))
"""

NO_GPU = "the SGLang engine needs a CUDA GPU"


def test_quantizations_are_exact_or_refused_before_any_engine_starts(run_sglang, tmp_path):
    proc = run_sglang(SCRIPT, env={"WORKDIR": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    for case, (_, lines) in r.items():
        assert len(lines) == 1 and lines[0].startswith("specdash: error: "), (case, lines)
    line = {case: lines[0] for case, (_, lines) in r.items()}
    code = {case: c for case, (c, _) in r.items()}
    for case in ("awq_marlin", "gptq", "awq_checkpoint"):
        assert code[case] == 2 and "atomicAdd" in line[case], line[case]
        assert "quantization=fp8" in line[case]  # what works instead
    for case in ("bnb", "kv_e5m2", "fp8_backend", "torchao", "w8a8_fp8"):
        assert code[case] == 2 and "untested" in line[case], line[case]
    assert "kv_cache_dtype=fp8_e5m2" in line["kv_e5m2"]
    assert code["block64"] == 3 and "weight_block_size [64, 64]" in line["block64"]
    assert (
        code["no_scale"] == 3
        and "has no model.layers.0.mlp.down_proj.weight_scale_inv" in (line["no_scale"])
    )
    assert code["bad_scale"] == 3 and "[2, 2], expected [3, 2]" in line["bad_scale"]
    assert "quantization=fp8" in line["w8a8_fp8"]  # the same GEMMs, measured
    for case in ("fp8", "kv_fp8", "block_ok"):  # exact: past the check
        assert code[case] == 4 and NO_GPU in line[case], line[case]
    for case in ("a100_fp8", "a100_block"):
        assert code[case] == 4 and "sm_80" in line[case] and "A100" in line[case], line[case]


def test_block_fp8_scales_of_the_builder_pass_the_shape_check(tmp_path) -> None:
    """The check's expected scale shape is the builder's: ceil(N/128) x ceil(K/128)."""
    import sys

    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, "benchmarks")
    from specdash.kernels.fp8 import quantize_blocks as block_fp8

    q, s = block_fp8(torch.randn(129, 300))
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        )
    )
    save_file({"a.weight": q, "a.weight_scale_inv": s}, str(tmp_path / "model.safetensors"))
    assert quantization.scale_problem(str(tmp_path)) is None


def test_the_header_names_the_engines_quantization(tmp_path) -> None:
    """`SessionStart.quantization` on SGLang: the checkpoint's own, else the argument's, with an
    FP8 KV cache beside it; None for plain weights."""
    described = quantization.described
    assert described({"model_path": str(tmp_path)}) is None
    assert described({"quantization": "fp8"}) == "fp8 online"
    assert described({"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8_e4m3"}) == (
        "w8a8_fp8 + kv_cache fp8_e4m3"
    )
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert described({"model_path": str(tmp_path)}) == "fp8 block [128, 128] checkpoint"
