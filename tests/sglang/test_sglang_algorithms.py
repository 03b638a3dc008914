"""Every `--speculative-algorithm` a checkpoint or the installed SGLang cannot run is refused
before any engine starts, in one line that says why and what to use instead (exit 2), with the
real 0.5.17 and 0.5.23 wheels: EAGLE3 on Qwen3.5 where SGLang's model class cannot capture
hidden states (0.5.17), DFLASH on 0.5.17's text-only Qwen3_5ForCausalLM (its multimodal class,
the one Qwen3.5's checkpoints name, captures them), DFLASH without a DFlash draft of this
target, DFLASH on 0.5.17 with its `dflash-logprobs` patch left off (stock 0.5.17 returns no
logprobs; the patch ports 0.5.23's, so with it DFLASH starts), NEXTN on a checkpoint without
the MTP head. The refusals run on a machine without a GPU: nothing reaches CUDA."""

from __future__ import annotations

import json

SCRIPT = """
import contextlib, io, json, os, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from specdash.cli import main

root = Path(os.environ["WORKDIR"])

def checkpoint(name, config, tensors=("model.embed_tokens.weight",)):
    d = root / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file({t: torch.zeros(2, 2) for t in tensors}, str(d / "model.safetensors"))
    return str(d)

qwen35 = {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64, "vocab_size": 512,
          "num_hidden_layers": 8}
target = checkpoint("target", qwen35)
# Qwen3.5's own checkpoints: the multimodal class, the language model's sizes in text_config
multimodal = checkpoint("multimodal", {"architectures": ["Qwen3_5ForConditionalGeneration"],
                                       "text_config": qwen35})
mtp = checkpoint("mtp", qwen35, ("model.embed_tokens.weight", "mtp.fc.weight"))
dense = checkpoint("dense", {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
                             "vocab_size": 512, "num_hidden_layers": 1})
dflash = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "vocab_size": 512,
          "num_hidden_layers": 1, "dflash_config": {"target_layer_ids": [1, 4, 7]}}
own_dflash = checkpoint("dflash", dflash)
other_dflash = checkpoint("dflash-other", {**dflash, "hidden_size": 128})
far_dflash = checkpoint("dflash-far", {**dflash, "dflash_config": {"target_layer_ids": [1, 30]}})

def run(*args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--headless", "--engine", "sglang", *args])
    return [code, err.getvalue().strip().splitlines()]

out = {
    "eagle3": run("--model", target, "--speculative-algorithm", "EAGLE3"),
    "dflash_none": run("--model", multimodal, "--speculative-algorithm", "DFLASH"),
    "dflash_dense": run("--model", multimodal, "--draft", dense,
                        "--speculative-algorithm", "DFLASH"),
    "dflash_other": run("--model", multimodal, "--draft", other_dflash,
                        "--speculative-algorithm", "DFLASH"),
    "dflash_far": run("--model", multimodal, "--draft", far_dflash,
                      "--speculative-algorithm", "DFLASH"),
    "dflash_own": run("--model", target, "--draft", own_dflash,
                      "--speculative-algorithm", "DFLASH"),
    "dflash_multimodal": run("--model", multimodal, "--draft", own_dflash,
                             "--speculative-algorithm", "DFLASH"),
    "dflash_own_unpatched": run("--model", multimodal, "--draft", own_dflash,
                                "--speculative-algorithm", "DFLASH",
                                "--sglang-unpatch", "dflash-logprobs"),
    "nextn_no_mtp": run("--model", target, "--speculative-algorithm", "NEXTN"),
    "nextn_mtp": run("--model", mtp, "--speculative-algorithm", "NEXTN"),
    "nextn_dummy": run("--model", target, "--speculative-algorithm", "NEXTN",
                       "--sglang-arg", "load_format=dummy"),
}
print("RESULT " + json.dumps(out))
"""

NO_GPU = "the SGLang engine needs a CUDA GPU"  # past the algorithm check: nothing refused it


def test_algorithms_a_checkpoint_or_sglang_cannot_run_are_refused_first(
    run_each_sglang, tmp_path
) -> None:
    proc = run_each_sglang(SCRIPT, env={"WORKDIR": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    for case, (_, lines) in r.items():
        assert len(lines) == 1 and lines[0].startswith("specdash: error: "), (case, lines)
        assert "Traceback" not in " ".join(lines)
    refused = {case for case, (code, lines) in r.items() if NO_GPU not in lines[0]}
    if run_each_sglang.version == "0.5.17":
        code, (line,) = r["eagle3"]
        assert code == 2 and "--speculative-algorithm: EAGLE3" in line
        assert "SGLang 0.5.17's Qwen3_5ForCausalLM cannot capture them" in line
        assert "use NEXTN (the checkpoint's MTP head), STANDALONE (a draft model) or NGRAM" in line
        # its text-only Qwen3_5ForCausalLM captures no hidden states for DFLASH either (the
        # GPU said so at start: "implements neither ... set_dflash_layers_to_capture")
        code, (line,) = r["dflash_own"]
        assert code == 2 and "SGLang 0.5.17's Qwen3_5ForCausalLM cannot capture them" in line
        assert "(it has no set_dflash_layers_to_capture)" in line
        code, (line,) = r["dflash_own_unpatched"]
        assert code == 2 and "SGLang 0.5.17's DFLASH returns no logprobs" in line
        assert "leave its patch on (no --sglang-unpatch dflash-logprobs)" in line
        starting = {"dflash_multimodal"}
    else:  # 0.5.23's Qwen3.5 captures EAGLE3's hidden states; its DFLASH returns logprobs
        assert NO_GPU in r["eagle3"][1][0] and r["eagle3"][0] == 4
        assert NO_GPU in r["dflash_own_unpatched"][1][0] and r["dflash_own_unpatched"][0] == 4
        starting = {"dflash_multimodal", "dflash_own"}
    # with the dflash-logprobs patch (the default) 0.5.17's multimodal class starts DFLASH too
    assert all(NO_GPU in r[case][1][0] and r[case][0] == 4 for case in starting)
    assert refused - {"eagle3", "dflash_own_unpatched", "dflash_own"} == {
        "dflash_none",
        "dflash_dense",
        "dflash_other",
        "dflash_far",
        "nextn_no_mtp",
    }
    assert all(r[case][0] == 2 for case in refused)
    assert "is a Qwen3ForCausalLM: use STANDALONE for it" in r["dflash_dense"][1][0]
    assert "its hidden_size is 128, the target's 64" in r["dflash_other"][1][0]
    assert "reads target layers [1, 30], and the target has 8" in r["dflash_far"][1][0]
    assert "has none: use NGRAM, or STANDALONE with a draft model" in r["nextn_no_mtp"][1][0]
