"""Where the time to the first verified token of an SGLang session goes, phase by phase.

Each run is the product's own command, `specdash run --headless --engine sglang ... --trace T
--json`, in a child process; the times come from its trace: `StartPhase` events per engine
(spawn, torch distributed, weights, KV pool, each CUDA graph capture), then the session's
first `PromptDone` that compared a prompt with the shadow, the first verified token, measured
from the moment the child was launched (CLOCK_MONOTONIC is shared by both processes). Runs go
in the order given, so the first of a fresh machine shows a cold Triton cache and the later
ones a warm one.

Usage (on the GPU box): python benchmarks/bench_sglang_start.py --target DIR --json OUT.json
    --run "label=ngram-new" --run "label=ngram-old:--sglang-arg disable_prefill_cuda_graph=false"
    [--prompts N] -- [args for every run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specdash.events import PromptDone, StartPhase
from specdash.trace.jsonl import read_trace


def phase_table(phases: list[StartPhase]) -> list[dict[str, Any]]:
    """(engine, phase, seconds) per phase of each engine: from the phase's first event to its
    engine's next phase (the two engines start at the same time, their events interleave)."""
    rows: list[dict[str, Any]] = []
    for engine in dict.fromkeys(p.engine for p in phases):
        own = [p for p in phases if p.engine == engine]
        firsts = [p for i, p in enumerate(own) if i == 0 or p.phase != own[i - 1].phase]
        for p, nxt in zip(firsts, firsts[1:], strict=False):
            rows.append({"engine": engine, "phase": p.phase, "seconds": (nxt.t_ns - p.t_ns) / 1e9})
    return rows


def one_run(args: argparse.Namespace, label: str, extra: list[str]) -> dict[str, Any]:
    trace = Path(tempfile.mkdtemp()) / f"{label}.jsonl"
    cmd = [sys.executable, "-m", "specdash.cli", "run", "--headless", "--engine", "sglang"]
    cmd += ["--model", str(args.target), "--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--json", "--trace", str(trace), *args.common, *extra]
    if args.prompts_file:
        cmd += ["--prompts", str(args.prompts_file)]
    t0 = time.monotonic_ns()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = (time.monotonic_ns() - t0) / 1e9
    result: dict[str, Any] = {
        "label": label,
        "args": extra,
        "exit": proc.returncode,
        "wall_s": wall,
    }
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-2000:]
        return result
    result.update(
        summary=json.loads(proc.stdout.strip().splitlines()[-1]),  # the --json object
        **trace_timings(trace, t0),
        sglang_log=str(trace) + ".sglang.log",
    )
    return result


def trace_timings(trace: Path, t0_ns: int) -> dict[str, Any]:
    """Seconds from `t0_ns` (CLOCK_MONOTONIC) to the first start phase, the session header and
    the first verified token (the first `PromptDone`), and the phase table, from a trace."""
    header, events, _ = read_trace(trace)
    phases = [e for e in events if isinstance(e, StartPhase)]
    first = next(e for e in events if isinstance(e, PromptDone))
    return {
        "first_verified_token_s": (first.t_ns - t0_ns) / 1e9,
        "to_first_phase_s": (phases[0].t_ns - t0_ns) / 1e9 if phases else None,
        "session_header_s": (header.t_ns - t0_ns) / 1e9,
        "phases": phase_table(phases),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--run", action="append", required=True, help="LABEL[:ARGS]")
    p.add_argument("--prompts", type=int, default=24, help="the first N shipped prompts")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("common", nargs="*", help="after --: arguments for every run")
    args = p.parse_args()
    args.prompts_file = None
    if args.prompts < 24:
        from specdash.prompts import default_prompts_path

        lines = default_prompts_path().read_text().splitlines()[: args.prompts]
        args.prompts_file = Path(tempfile.mkdtemp()) / "prompts.jsonl"
        args.prompts_file.write_text("\n".join(lines) + "\n")
    cache = os.environ.get("TRITON_CACHE_DIR")
    out: dict[str, Any] = {"argv": sys.argv[1:], "triton_cache": cache, "runs": []}
    for spec in args.run:
        label, _, rest = spec.partition(":")
        result = one_run(args, label, rest.split())
        out["runs"].append(result)
        args.json.write_text(json.dumps(out, indent=1))
        first = result.get("first_verified_token_s", float("nan"))
        print(f"== {label}: exit {result['exit']}, wall {result['wall_s']:.1f} s, ", end="")
        print(f"first verified token {first:.1f} s", flush=True)
        for row in result.get("phases", []):
            print(f"   {row['engine']:<7}{row['phase']:<44}{row['seconds']:7.1f} s")
        if "stderr" in result:
            print(result["stderr"][-600:])
        elif "summary" in result:
            s = result["summary"]
            print(f"   {s['exact_prompts']}/{s['prompts']} exact, {s['tokens_per_s']:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
