"""Real SGLang on a GPU: is speculative output its own plain decode, bit for bit? And how fast?

Phases (each engine started by specdash's own `engine_kwargs` + `start_engine`, so the patched
scheduler entry is the product's; 24 shipped prompts submitted together, greedy, ignore_eos):
- anchor:  stock SGLang (no patch), NGRAM and STANDALONE k=3 vs stock plain decode;
- matrix:  patched, `--algorithms` (NGRAM and STANDALONE; DFLASH with `--dflash-draft`, k + 1
           block rows), k in {1, 3, 5}, CUDA graphs off and on, each vs the patched plain decode
           with the same graph setting;
- unpatch: each exactness patch left off alone (gdn, attention, gemm): NGRAM k=3 vs plain;
- gemm:    a patched NGRAM engine and its plain shadow both alive; the GEMM backend switched
           live on both (SGLang persistent Triton, specdash Triton tile, cuBLAS, DeepGEMM) and
           the prompts run again after each switch;
- speed:   one prompt at a time (batch 1), CUDA graphs on: `--speed-cells` of stock and patched,
           spec and plain; generated tokens / wall time of the generate calls, after a warm-up
           prompt, with and without the prefill's share; `--profile-prompts N`: SGLang's
           profiler over N more prompts, kernel time by name and the GPU's busy share.
Every comparison: per prompt, token ids equal and fp32 logprob bits equal (struct-packed).

Usage (on the GPU box, SGLang importable): python benchmarks/bench_sglang.py --target DIR
    --draft DIR [--dflash-draft DIR] --json OUT.json [--phases anchor,matrix,...]
    [--algorithms NGRAM,STANDALONE,DFLASH] [--budget-s 540]
Results are written after every cell, so a cut-off run keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdash.prompts import load_prompts
from specdash.runs.sglang.args import (
    SGLangOptions,
    applied_patches,
    engine_kwargs,
    parse_engine_arg,
)
from specdash.runs.sglang.patches import dflash_logprobs, patch_set
from specdash.runs.sglang.process import session_environment, start_engine
from specdash.settings import SessionSettings

# Stock SGLang: every optional patch off but DFLASH's logprobs (0.5.17 aborts a DFLASH request
# that asks for them; they are SGLang's own log-softmax of the verify logits, not a fix).
ALL_OFF = tuple(p.flag for p in patch_set.optional_patches() if p is not dflash_logprobs.PATCH)
T0 = time.monotonic()


def bits(x: float | None) -> str | None:
    return None if x is None else struct.pack("<f", x).hex()


@contextlib.contextmanager
def engine(
    args: argparse.Namespace,
    *,
    algorithm: str | None,
    k: int = 3,
    graphs: bool = False,
    off: tuple[str, ...] = (),
    mem: float = 0.5,
) -> Iterator[Any]:
    """A started engine; patches = all but `off` (ALL_OFF: stock SGLang)."""
    options = SGLangOptions(
        speculative_algorithm=algorithm or "NGRAM",
        unpatch=off,
        engine_args={
            **args.sglang_args,
            "disable_cuda_graph": not graphs,
            "cuda_graph_max_bs_decode": 32,
            "mem_fraction_static": mem,
            "max_running_requests": 32,
        },
    )
    settings = SessionSettings(
        engine="sglang",
        model=args.target,
        draft=algorithm_draft(args, algorithm),
        k=k,
        speculation=algorithm is not None,
        max_new_tokens=args.max_new,
    )
    with started(settings, options, f"{algorithm or 'plain'} k={k} graphs={graphs} off={off}") as e:
        yield e


def algorithm_draft(args: argparse.Namespace, algorithm: str | None) -> Path | None:
    """The draft checkpoint an algorithm speculates with: STANDALONE's dense draft, DFLASH's
    DFlash draft (`sglang_checkpoint.py --dflash-draft`); None for the others."""
    return {"STANDALONE": args.draft, "DFLASH": args.dflash_draft}.get(algorithm or "")


@contextlib.contextmanager
def started(settings: SessionSettings, options: SGLangOptions, label: str) -> Iterator[Any]:
    """An engine as a session starts it (its arguments by `engine_kwargs`, the patches of
    `options` in its scheduler), shut down on exit; `label` names it in the start line."""
    speculative = settings.speculation
    kwargs = engine_kwargs(settings, options, speculative=speculative, split=False)
    with session_environment(applied_patches(options), None, None, pools_in_turn=False):
        t = time.monotonic()
        e = start_engine(kwargs)
        print(f"  engine {label} started in {time.monotonic() - t:.1f}s", flush=True)
        try:
            yield e
        finally:
            e.shutdown()


def record(o: dict[str, Any]) -> dict[str, Any]:
    """One request's output as compared and counted: ids, fp32 logprob bits, speculation."""
    meta = o["meta_info"]
    return {
        "ids": [int(x) for x in o["output_ids"]],
        "logprob_bits": [bits(t[0]) for t in meta.get("output_token_logprobs") or []],
        "verify_ct": meta.get("spec_verify_ct"),
        "accepted": meta.get("spec_num_correct_drafts"),
        "proposed": meta.get("spec_num_proposed_drafts"),
    }


def generate(e: Any, texts: list[str], max_new: int) -> list[dict[str, Any]]:
    outs = e.generate(
        prompt=texts,
        sampling_params={"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True},
        return_logprob=True,
    )
    return [record(o) for o in outs]


def compare(spec: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    ids_differ, bits_differ, first = [], [], {}
    for i, (a, b) in enumerate(zip(spec, plain, strict=True)):
        if a["ids"] != b["ids"]:
            ids_differ.append(i)
        if a["logprob_bits"] != b["logprob_bits"]:
            bits_differ.append(i)
            first[i] = next(
                j
                for j, (x, y) in enumerate(zip(a["logprob_bits"], b["logprob_bits"], strict=False))
                if x != y or a["ids"][j] != b["ids"][j]
            )
    accepted = sum(o["accepted"] or 0 for o in spec)
    proposed = sum(o["proposed"] or 0 for o in spec)
    steps = sum(o["verify_ct"] or 0 for o in spec)
    tokens = sum(len(o["ids"]) for o in spec)
    return {
        "prompts": len(spec),
        "ids_differ": ids_differ,
        "bits_differ": bits_differ,
        "first_divergence": first,
        "identical": len(spec) - len(bits_differ),
        "acceptance": accepted / proposed if proposed else None,
        "mean_accepted_length": tokens / steps if steps else None,
    }


class Results:
    def __init__(self, path: Path, budget_s: float) -> None:
        self.path, self.budget_s = path, budget_s
        self.data: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - T0)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=1))
        summary = (
            {k: v for k, v in value.items() if k != "first_divergence"}
            if isinstance(value, dict)
            else value
        )
        print(f"[{time.monotonic() - T0:6.0f}s] {key}: {json.dumps(summary)}", flush=True)


def plain_run(args, res, texts, *, graphs, off, tag) -> list[dict[str, Any]]:
    with engine(args, algorithm=None, graphs=graphs, off=off) as e:
        out = generate(e, texts, args.max_new)
    res.put(f"{tag}/plain", {"tokens": sum(len(o["ids"]) for o in out)})
    return out


def spec_cell(args, res, texts, plain, *, algorithm, k, graphs, off, tag) -> None:
    if res.left() < 60:
        res.put(f"{tag}/{algorithm}/k{k}", {"skipped": "device budget"})
        return
    if f"{tag}/{algorithm}/k{k}" in args.skip_cells:
        return
    if algorithm in args.no_graph_algorithms and graphs:
        res.put(f"{tag}/{algorithm}/k{k}", {"skipped": args.no_graph_reason})
        return
    try:
        with engine(args, algorithm=algorithm, k=k, graphs=graphs, off=off) as e:
            out = generate(e, texts, args.max_new)
        res.put(f"{tag}/{algorithm}/k{k}", compare(out, plain))
    except Exception as ex:  # one failing cell must not lose the others
        res.put(f"{tag}/{algorithm}/k{k}", {"error": f"{type(ex).__name__}: {ex}"[:600]})


def phase_anchor(args, res, texts) -> None:
    plain = plain_run(args, res, texts, graphs=False, off=ALL_OFF, tag="anchor")
    for algorithm in ("NGRAM", "STANDALONE"):
        spec_cell(
            args,
            res,
            texts,
            plain,
            algorithm=algorithm,
            k=3,
            graphs=False,
            off=ALL_OFF,
            tag="anchor",
        )


def phase_matrix(args, res, texts) -> None:
    for graphs in args.graphs:
        tag = f"matrix/graphs_{'on' if graphs else 'off'}"
        plain = plain_run(args, res, texts, graphs=graphs, off=(), tag=tag)
        for algorithm in args.algorithms:
            for k in args.ks:
                spec_cell(
                    args,
                    res,
                    texts,
                    plain,
                    algorithm=algorithm,
                    k=k,
                    graphs=graphs,
                    off=(),
                    tag=tag,
                )


def phase_unpatch(args, res, texts) -> None:
    for flag in ("gdn", "attention", "gemm"):
        tag = f"unpatch/{flag}"
        plain = plain_run(args, res, texts, graphs=False, off=(flag,), tag=tag)
        spec_cell(
            args, res, texts, plain, algorithm="NGRAM", k=3, graphs=False, off=(flag,), tag=tag
        )


def phase_gemm(args, res, texts) -> None:
    from specdash.runs.sglang.backend import switch_gemm

    with (
        engine(args, algorithm="NGRAM", k=3, graphs=True, mem=0.35) as spec,
        engine(args, algorithm=None, graphs=True, mem=0.35) as plain,
    ):
        for name in ("sglang-triton", "specdash-triton", "specdash-cublas", "deepgemm", "auto"):
            try:
                t = time.monotonic()
                switch_gemm(spec, name)
                switch_gemm(plain, name)
                switch_s = time.monotonic() - t
            except Exception as ex:
                res.put(f"gemm/{name}", {"unavailable": f"{type(ex).__name__}: {ex}"[:400]})
                continue
            cell = compare(
                generate(spec, texts, args.max_new), generate(plain, texts, args.max_new)
            )
            res.put(f"gemm/{name}", {**cell, "switch_s": round(switch_s, 2)})


def tokens_per_s(e: Any, texts: list[str], max_new: int) -> dict[str, float]:
    """Warm batch-1 rate, prefill inside, and without it: the same prompts once more with one
    new token each (prefill + the first token) give the prefill's share, so the decode rate is
    (tokens - prompts) / (seconds - prefill seconds)."""
    generate(e, texts[:1], max_new)  # warm-up (first Triton compiles, graph paths)
    t, tokens = time.monotonic(), 0
    for text in texts:
        tokens += len(generate(e, [text], max_new)[0]["ids"])
    seconds = time.monotonic() - t
    t = time.monotonic()
    for text in texts:
        generate(e, [text], 1)
    prefill_s = time.monotonic() - t
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": tokens / seconds,
        "prefill_seconds": round(prefill_s, 3),
        "decode_tokens_per_s": (tokens - len(texts)) / (seconds - prefill_s),
    }


def kernel_profile(
    e: Any, texts: list[str], max_new: int, out_dir: Path, *, host: bool
) -> dict[str, Any]:
    """Where a batch-1 request's time goes: SGLang's own torch profiler around `texts` decoded
    one at a time; kernel time summed by name (CUDA-graph replays included) and the GPU's busy
    share of the profiled span (the rest waits on the host). `host`: CPU activity too, and the
    launches and host ops by total time (what keeps the GPU waiting)."""
    import gzip

    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.trace.json.gz"))
    e.start_profile(
        output_dir=str(out_dir),
        activities=["CPU", "GPU"] if host else ["GPU"],
        with_stack=False,
        record_shapes=False,
    )
    for text in texts:
        generate(e, [text], max_new)
    e.stop_profile()
    (trace,) = set(out_dir.glob("*.trace.json.gz")) - before
    with gzip.open(trace) as f:
        events = [ev for ev in json.load(f)["traceEvents"] if ev.get("ph") == "X"]
    kernels = [ev for ev in events if ev.get("cat") == "kernel"]
    spans = sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in kernels)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:  # union of kernel intervals
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    result = {
        "requests": len(texts),
        "span_ms": round((spans[-1][1] - spans[0][0]) / 1e3, 2) if spans else 0.0,
        "gpu_busy_ms": round(busy / 1e3, 2),
        "kernels": len(kernels),
        "top_kernels_ms": top_by_name(kernels),
    }
    if host:
        calls = [ev for ev in events if ev.get("cat") in ("cuda_runtime", "cuda_driver")]
        result["launch_calls_ms"] = top_by_name(calls, count=True)
        result["top_host_ops_ms"] = top_by_name([ev for ev in events if ev.get("cat") == "cpu_op"])
    return result


def top_by_name(events: list[dict[str, Any]], count: bool = False) -> list[list[Any]]:
    """The 25 names with the most total duration: [name, ms] (count: [name, ms, calls])."""
    total: dict[str, float] = {}
    calls: dict[str, int] = {}
    for ev in events:
        name = ev["name"][:90]
        total[name] = total.get(name, 0.0) + ev["dur"]
        calls[name] = calls.get(name, 0) + 1
    top = sorted(total, key=lambda n: -total[n])[:25]
    return [[n, round(total[n] / 1e3, 3), *([calls[n]] if count else [])] for n in top]


PROFILE_DIR = Path(tempfile.gettempdir()) / "specdash-sglang-profiles"
"""Where SGLang writes the traces (summarised into the results, not kept)."""


def speed_cell(name: str) -> tuple[bool, tuple[str, ...]]:
    """A speed cell's (speculative, patches off): `stock_spec`, `patched_spec`, `stock_plain`,
    `patched_plain`, or `spec_without_<flag>` (every patch but one)."""
    if name.startswith("spec_without_"):
        return True, (name.removeprefix("spec_without_"),)
    patches, kind = name.split("_")
    return kind == "spec", ALL_OFF if patches == "stock" else ()


def phase_speed(args, res, texts) -> None:
    speed = {}
    for name in args.speed_cells:
        speculative, off = speed_cell(name)
        algorithm = args.speed_algorithm if speculative else None
        if res.left() < 60:
            break
        with engine(args, algorithm=algorithm, k=3, graphs=args.speed_graphs, off=off) as e:
            speed[name] = tokens_per_s(e, texts, args.max_new)
            res.put(f"speed/{name}", speed[name])
            if args.profile_prompts and res.left() > 60:
                profile = kernel_profile(
                    e,
                    texts[: args.profile_prompts],
                    args.max_new,
                    PROFILE_DIR,
                    host=args.profile_host,
                )
                res.put(f"speed/{name}/profile", profile)
    if "patched_spec" in speed and "stock_spec" in speed:
        ratio = speed["patched_spec"]["tokens_per_s"] / speed["stock_spec"]["tokens_per_s"]
        decode = (
            speed["patched_spec"]["decode_tokens_per_s"]
            / speed["stock_spec"]["decode_tokens_per_s"]
        )
        res.put(
            "speed/ratio",
            {
                "patched_over_stock_spec": ratio,
                "patched_over_stock_spec_decode": decode,
                "algorithm": args.speed_algorithm,
            },
        )


PHASES = {
    "anchor": phase_anchor,
    "matrix": phase_matrix,
    "unpatch": phase_unpatch,
    "gemm": phase_gemm,
    "speed": phase_speed,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--dflash-draft", type=Path, help="DFLASH's draft (sglang_checkpoint.py)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--phases", default="anchor,matrix")
    p.add_argument("--ks", default="1,3,5")
    p.add_argument("--graphs", default="off,on")
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--speed-algorithm", default="STANDALONE")
    p.add_argument("--speed-graphs", default="on", choices=["on", "off"])
    p.add_argument(
        "--speed-cells",
        default="stock_spec,patched_spec,stock_plain,patched_plain",
        help="speed cells, in order (also spec_without_<flag>: one patch off)",
    )
    p.add_argument("--profile-host", action="store_true", help="profile CPU activity too")
    p.add_argument(
        "--profile-prompts", type=int, default=0, help="speed: profile this many prompts per cell"
    )
    p.add_argument("--budget-s", type=float, default=540)
    p.add_argument("--sglang-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--algorithms", default="NGRAM,STANDALONE")
    p.add_argument("--no-graph-algorithms", default="", help="algorithms not run with graphs")
    p.add_argument("--no-graph-reason", default="")
    p.add_argument("--skip-cells", default="", help="cell keys measured in an earlier call")
    args = p.parse_args()
    args.sglang_args = dict(parse_engine_arg(a) for a in args.sglang_arg)
    args.ks = [int(k) for k in args.ks.split(",")]
    args.graphs = [g == "on" for g in args.graphs.split(",")]
    args.algorithms = args.algorithms.split(",")
    args.speed_graphs = args.speed_graphs == "on"
    args.skip_cells = args.skip_cells.split(",")
    args.speed_cells = args.speed_cells.split(",")
    args.no_graph_algorithms = args.no_graph_algorithms.split(",")
    texts = [pr.text for pr in load_prompts(None)][: args.prompts]
    res = Results(args.json, args.budget_s)
    import sglang
    import torch

    res.put(
        "env",
        {
            "sglang": sglang.__version__,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(),
            "argv": sys.argv[1:],
        },
    )
    for name in args.phases.split(","):
        if res.left() < 60:
            res.put(f"{name}", {"skipped": "device budget"})
            continue
        PHASES[name](args, res, texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
