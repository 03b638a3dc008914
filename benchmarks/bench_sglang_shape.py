"""SGLang at the Qwen3.5-27B shape: exact decode speed by GEMM route, stock beside it, the
kernel profile of a decode step, speculative exactness, and the native engine on the same card.

The target is `sglang_checkpoint.py --shape 27b --config-only` (64 layers, the real dims, the
shipped tokenizer's vocabulary; `--fp8-block`: as a block-FP8 [128, 128] checkpoint) loaded with
`load_format=dummy`: SGLang's seeded random weights, the same in every engine, so a shadow engine
started later decodes the same model. One engine at a time (54 GB of bf16: two fit only on an
H200). `--target` (with `--draft`, `--dflash-draft`) runs a checkpoint with real weights instead,
e.g. the small pair `sglang_checkpoint.py` writes.

Phases (comma-separated `--phases`, in this order):
- plain:  patched plain decode, CUDA graphs on, batch 1: for each `--routes` GEMM route
          (switched live: `sglang-triton` = SGLang's persistent kernel for every GEMM, what the
          patched engine ran before the split; `auto` = prefill on it, decode/verify rows on
          specdash's tile), warm-up prompt, then the prompts one at a time; tok/s and a kernel
          profile of `--profile-steps` decode steps (SGLang's torch profiler).
- stock:  the same with no patch (SGLang's own GEMM), one route.
- spec:   the patched plain engine (the batch-1 shadow), then for each `--algorithms` (NGRAM,
          NEXTN, DFLASH with a DFlash draft of the target, `sglang_checkpoint.py --dflash-draft`,
          dummy weights too, k + 1 block rows; k = `--k`) the patched speculative engine: ids
          and fp32 logprob bits per prompt against the shadow, tok/s of both, accepted length;
          then `--batches` requests sent together, each against the same batch-1 shadow. With
          `--stock-spec`, stock beside it (the first algorithm).
- native: `specdash run --headless --device cuda --preset qwen3.5-27b-shape --no-spec` on the
          same prompts (its own tok/s: decode only).
tok/s here: generated tokens / wall time of the generate calls, prompt by prompt (prefill
included, ~0.1 s of a 48-token prompt), after one warm-up prompt per engine and route.

Usage (GPU box, SGLang importable): python benchmarks/bench_sglang_shape.py --json OUT.json
    [--phases plain,stock,spec,native] [--routes sglang-triton,auto] [--batches 8,32]
    [--stock-spec] [--prompts 12] [--max-new 48] [--budget-s 560] [--fp8-block]
    [--target DIR [--draft DIR] [--dflash-draft DIR]]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sglang import (  # noqa: E402
    ALL_OFF,
    algorithm_draft,
    compare,
    record,
    started,
)
from sglang_checkpoint import build  # noqa: E402

from specdash.events import PromptDone  # noqa: E402
from specdash.prompts import load_prompts  # noqa: E402
from specdash.runs.sglang.args import SGLangOptions, parse_engine_arg  # noqa: E402
from specdash.runs.sglang.backend import switch_gemm  # noqa: E402
from specdash.runs.sglang.patches import patch_set  # noqa: E402
from specdash.settings import SessionSettings  # noqa: E402
from specdash.trace.jsonl import read_trace  # noqa: E402

T0 = time.monotonic()
KERNEL_GROUPS = (  # first match wins; names as the profiler records them
    ("gemm (SGLang persistent)", ("matmul_kernel_persistent",)),
    ("gemm (specdash tile)", ("_gemm_kernel",)),
    ("gemm (cuBLAS/other)", ("gemm", "gemv", "cutlass", "xmma", "splitK")),
    ("gdn", ("recurrent", "gated_delta", "conv1d", "causal_conv", "chunk_", "fused_sigmoid")),
    ("attention", ("attn", "_fwd_kernel", "decode_att", "stage1", "stage2", "flash")),
    ("norm", ("norm",)),
    ("rope / kv store", ("rope", "rotary", "store_kv", "set_kv")),
    ("sampling / logprob", ("softmax", "argmax", "sample", "topk", "log_")),
)


class Results:
    def __init__(self, path: Path, budget_s: float) -> None:
        self.path, self.budget_s, self.data = path, budget_s, {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - T0)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=1))
        print(f"[{time.monotonic() - T0:6.1f}s] {key}: {json.dumps(value)[:600]}", flush=True)


@contextlib.contextmanager
def engine(
    args: argparse.Namespace, *, algorithm: str | None, off: tuple[str, ...] = ()
) -> Iterator[Any]:
    graphs = {"cuda_graph_bs_decode": args.graph_bs} if algorithm and args.batches else {}
    options = SGLangOptions(
        speculative_algorithm=algorithm or "NGRAM",
        unpatch=off,
        engine_args={
            **args.load_args,
            "mem_fraction_static": args.mem,
            "max_running_requests": max(args.batches, default=1),
            "context_length": 8192,
            **graphs,
            **args.sglang_args,
        },
    )
    settings = SessionSettings(
        engine="sglang",
        model=args.target,
        draft=algorithm_draft(args, algorithm),
        k=args.k,
        speculation=algorithm is not None,
        max_new_tokens=args.max_new,
    )
    with started(settings, options, f"{algorithm or 'plain'} off={off}") as e:
        yield e


def run_prompts(e: Any, texts: list[str], max_new: int, decode_rate: bool = False) -> dict:
    """One prompt at a time (batch 1), after one warm-up prompt: per prompt ids, logprob bits,
    seconds; total tok/s; accepted length where the engine speculated. `decode_rate`: each
    prompt is also run for one token (its prefill), and `decode_tok_s` is
    (tokens - 1) / (seconds - prefill seconds), the rate specdash's native engine reports."""
    sp = {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}
    e.generate(prompt=texts[0], sampling_params=sp)
    outs, seconds, prefill = [], [], []
    for text in texts:
        if decode_rate:
            t = time.monotonic()
            e.generate(prompt=text, sampling_params={**sp, "max_new_tokens": 1})
            prefill.append(time.monotonic() - t)
        t = time.monotonic()
        o = e.generate(prompt=text, sampling_params=sp, return_logprob=True)
        seconds.append(time.monotonic() - t)
        outs.append(record(o))
    tokens = sum(len(o["ids"]) for o in outs)
    verify = sum(o["verify_ct"] or 0 for o in outs)
    result = {
        "outputs": outs,
        "tokens": tokens,
        "seconds": sum(seconds),
        "tok_s": tokens / sum(seconds),
        "median_prompt_tok_s": statistics.median(
            len(o["ids"]) / s for o, s in zip(outs, seconds, strict=True)
        ),
        "accepted_length": tokens / verify if verify else None,
    }
    if decode_rate:
        result["decode_tok_s"] = (tokens - len(outs)) / (sum(seconds) - sum(prefill))
        result["prefill_s"] = sum(prefill)
    return result


def profile(e: Any, text: str, steps: int, out_dir: Path) -> dict[str, Any]:
    """Kernel time per decode step of `steps` decode steps (SGLang's profiler by stage: the
    prefill's kernels are in another file), by KERNEL_GROUPS, and the costliest kernels by name
    and grid (a GEMM's grid tells its weight), in ms per step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    e.start_profile(
        output_dir=str(out_dir), num_steps=steps, activities=["GPU"], profile_by_stage=True
    )
    sp = {"temperature": 0.0, "max_new_tokens": steps + 8, "ignore_eos": True}
    e.generate(prompt=text, sampling_params=sp)
    deadline = time.monotonic() + 90
    files: list[str] = []
    while time.monotonic() < deadline and not files:
        time.sleep(1)
        files = glob.glob(str(out_dir / "*DECODE.trace.json.gz"))
    if not files:
        return {"error": "no decode trace written"}
    time.sleep(2)  # the export may still be writing
    with gzip.open(files[0], "rt") as f:
        trace = json.load(f)
    kernels = [ev for ev in trace.get("traceEvents", []) if ev.get("cat") == "kernel"]
    by_key: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, float] = defaultdict(float)
    for ev in kernels:
        ms = ev.get("dur", 0.0) / 1000.0
        by_key[f"{ev['name'][:60]} grid={ev.get('args', {}).get('grid')}"].append(ms)
        groups[_group(ev["name"])] += ms
    for f in glob.glob(str(out_dir / "*.trace.json.gz")):
        os.unlink(f)
    top = sorted(by_key.items(), key=lambda kv: -sum(kv[1]))[:30]
    return {
        "steps": steps,
        "kernels_per_step": len(kernels) / steps,
        "ms_per_step": sum(groups.values()) / steps,
        "groups_ms_per_step": {
            k: round(v / steps, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])
        },
        "top_ms_per_step": [[k, len(d) / steps, round(sum(d) / steps, 4)] for k, d in top],
    }


def _group(name: str) -> str:
    low = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k.lower() in low for k in keys):
            return group
    return "other"


def phase_plain(args, res, texts) -> None:
    with engine(args, algorithm=None) as e:
        for route in args.routes:
            if res.left() < 60:
                return
            switch_gemm(e, route)
            run = run_prompts(e, texts, args.max_new, decode_rate=True)
            res.put(f"plain/{route}", {k: v for k, v in run.items() if k != "outputs"})
            res.put(f"plain/{route}/ids", [o["ids"][:8] for o in run["outputs"]][:3])
            res.put(
                f"profile/plain/{route}",
                profile(e, texts[1], args.profile_steps, args.prof_dir / route),
            )


def phase_stock(args, res, texts) -> None:
    with engine(args, algorithm=None, off=ALL_OFF) as e:
        run = run_prompts(e, texts, args.max_new, decode_rate=True)
        res.put("stock/plain", {k: v for k, v in run.items() if k != "outputs"})
        res.put(
            "profile/stock/plain", profile(e, texts[1], args.profile_steps, args.prof_dir / "stock")
        )


def run_batched(e: Any, texts: list[str], n: int, max_new: int) -> dict[str, Any]:
    """`texts` in groups of `n` requests sent together (one generate call each): outputs in
    prompt order and the aggregate tok/s (all tokens / wall time of the calls)."""
    sp = {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}
    outs, seconds = [], 0.0
    for i in range(0, len(texts), n):
        t = time.monotonic()
        group = e.generate(prompt=texts[i : i + n], sampling_params=sp, return_logprob=True)
        seconds += time.monotonic() - t
        outs += [record(o) for o in group]
    tokens = sum(len(o["ids"]) for o in outs)
    return {"outputs": outs, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def phase_spec(args, res, texts) -> None:
    """Speculative engines against the batch-1 plain shadow (one engine at a time): for every
    algorithm batch 1, then `--batches` concurrent requests (prompt i of a batch compared with
    the shadow's prompt i mod len(texts))."""
    texts = args.spec_texts
    variants = [((), "patched")] + ([(ALL_OFF, "stock")] if args.stock_spec else [])
    strip = lambda run: {k: v for k, v in run.items() if k != "outputs"}  # noqa: E731
    for off, label in variants:
        plain = None
        if not args.no_shadow:
            with engine(args, algorithm=None, off=off) as e:
                plain = run_prompts(e, texts, args.max_new, decode_rate=True)
            res.put(f"shadow/{label}", strip(plain))
        algorithms = args.algorithms if label == "patched" else args.algorithms[:1]
        for algorithm in algorithms:
            if res.left() < 60:
                return
            with engine(args, algorithm=algorithm, off=off) as e:
                spec = run_prompts(e, texts, args.max_new, decode_rate=True)
                res.put(f"spec/{label}/{algorithm}", strip(spec))
                if plain is None:
                    continue
                res.put(f"exact/{label}/{algorithm}", compare(spec["outputs"], plain["outputs"]))
                for n in args.batches:
                    many = [texts[j % len(texts)] for j in range(max(n, len(texts)))]
                    run = run_batched(e, many, n, args.max_new)
                    shadow = [plain["outputs"][j % len(texts)] for j in range(len(many))]
                    res.put(f"batch/{label}/{algorithm}/{n}", strip(run))
                    res.put(f"exact/{label}/{algorithm}/batch{n}", compare(run["outputs"], shadow))


def phase_native(args, res, texts) -> None:
    """The native engine's plain exact decode, as the CLI runs it; the first prompt a warm-up
    (CUDA graph capture, Triton compiles), the rate from the others' PromptDone events."""
    prompts = args.out_dir / "shape_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in [texts[0], *texts]))
    trace = Path("/tmp/native_shape.jsonl")
    trace.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-c",
        "import sys; from specdash.cli import main; sys.exit(main())",
        "run",
        "--headless",
        "--device",
        "cuda",
        "--preset",
        "qwen3.5-27b-shape",
        "--no-spec",
        "--no-shadow",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        str(args.max_new),
        "--json",
        "--trace",
        str(trace),
    ]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60, res.left() - 10))
    if proc.returncode != 0:
        res.put("native/plain", {"stderr": proc.stderr[-800:]})
        return
    _, events, _ = read_trace(trace)
    timed = [e for e in events if isinstance(e, PromptDone) and e.prompt_index > 0]
    res.put(
        "native/plain",
        {
            "decode_tok_s": sum(d.new_tokens for d in timed) / sum(d.seconds for d in timed),
            "with_warmup_tok_s": json.loads(proc.stdout)["tokens_per_s"],
            "prompts_timed": len(timed),
            "wall_s": time.monotonic() - t,
        },
    )


PHASES = {"plain": phase_plain, "stock": phase_stock, "spec": phase_spec, "native": phase_native}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--phases", default="plain,stock,native")
    p.add_argument("--routes", default="auto")
    p.add_argument("--algorithms", default="NGRAM,NEXTN")
    p.add_argument("--stock-spec", action="store_true")
    p.add_argument("--no-shadow", action="store_true", help="spec phase: speculative engines only")
    p.add_argument("--batches", default="", help="concurrent requests, e.g. 8,32 (spec phase)")
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--spec-prompts", type=int, default=24)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument("--mem", type=float, default=0.85)
    p.add_argument("--budget-s", type=float, default=560)
    p.add_argument("--sglang-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--fp8-block", action="store_true", help="the 27B config as block-FP8")
    p.add_argument("--target", type=Path, help="a checkpoint with weights, not the dummy 27B")
    p.add_argument("--draft", type=Path, help="with --target: STANDALONE's draft")
    p.add_argument("--dflash-draft", type=Path, help="with --target: DFLASH's draft")
    args = p.parse_args()
    args.sglang_args = dict(parse_engine_arg(a) for a in args.sglang_arg)
    args.routes = args.routes.split(",")
    args.algorithms = args.algorithms.split(",")
    args.batches = [int(n) for n in args.batches.split(",") if n]
    args.graph_bs = sorted({1, 2, 4, 8, 16, 24, 32, *args.batches})
    args.out_dir = args.json.parent
    args.prof_dir = Path("/tmp/sglang-profiles")
    if args.target is not None:
        args.load_args = {}
    else:  # NEXTN's MTP head and DFLASH's draft load as dummy weights too
        args.load_args = {"load_format": "dummy", "speculative_draft_load_format": "dummy"}
        out = Path("/tmp/sglang_27b_shape" + ("_fp8_block" if args.fp8_block else ""))
        args.draft, args.dflash_draft = None, out / "dflash"
        args.target, _ = build(
            out,
            layers=args.layers,
            shape="27b",
            config_only=True,
            dflash_draft=args.dflash_draft,
            fp8_block=args.fp8_block,
        )
    shipped = [pr.text for pr in load_prompts(None)]
    texts = shipped[: args.prompts]
    args.spec_texts = shipped[: args.spec_prompts]
    res = Results(args.json, args.budget_s)
    res.put(
        "setup",
        {
            "target": str(args.target),
            "layers": args.layers,
            "prompts": len(texts),
            "max_new": args.max_new,
            "k": args.k,
            "patches": [q.name for q in patch_set.all_patches()],
        },
    )
    for name in args.phases.split(","):
        if res.left() < 60:
            print(f"== skip {name}: {res.left():.0f}s left")
            continue
        print(f"== {name} ({res.left():.0f}s left)", flush=True)
        try:
            PHASES[name](args, res, texts)
        except Exception as e:  # keep the other phases' numbers
            res.put(f"error/{name}", f"{type(e).__name__}: {e}"[:800])
    return 0


if __name__ == "__main__":
    sys.exit(main())
