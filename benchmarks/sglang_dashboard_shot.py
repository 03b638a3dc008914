"""The dashboard on real SGLang, driven headless by Textual's Pilot: what a user sees.

Starts the dashboard exactly as `specdash --engine sglang ...` does (`dashboard_app`), at
160x48, and once verify steps arrive presses `g` (live GEMM switch, applied between prompts)
every `--prompts-per-backend` finished prompts until it has cycled through every backend the
header offers and back. Waits for the session to finish, then saves an SVG screenshot and a JSON
of what the panels held: verify steps seen live, per finished prompt the GEMM backend, its spec
and shadow t/s and verdict, the dashboard's notes (a refused backend says so there), the
exactness verdict, the GPU panel's DRAM source (GPM or the labelled fallback), and whether the
recorded trace replays.

Usage (GPU box, SGLang importable): python benchmarks/sglang_dashboard_shot.py --target DIR
    --out DIR [--sglang-arg KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from specdash.cli import build_parser
from specdash.cli.dashboard import dashboard_app
from specdash.trace.export import perfetto_trace
from specdash.trace.jsonl import read_trace


async def drive(args: argparse.Namespace) -> dict:
    trace = args.out / "dashboard_trace.jsonl"
    cli = ["run", "-k", "3", "--max-new-tokens", "32", "--trace", str(trace), "--overwrite-trace"]
    if args.target is not None:  # else: the native engine on the embedded pair (a CPU check)
        cli += ["--engine", "sglang", "--model", str(args.target)]
        cli += ["--speculative-algorithm", "NGRAM"]
    for a in args.sglang_arg:
        cli += ["--sglang-arg", a]
    app = dashboard_app(build_parser().parse_args(cli))
    seen: dict = {"verify_steps_live": [], "per_prompt": [], "notes": []}
    t0 = time.monotonic()
    async with app.run_test(size=(160, 48)) as pilot:
        m = app.model
        presses, done, last_press = 0, 0, 0
        # the session stays open after its prompts (IDLE), so idle with prompts done is the end
        idle_after_set = lambda: m.idle and m.prompts_done > 0  # noqa: E731
        while (
            not (m.finished or m.errors or idle_after_set())
            and time.monotonic() - t0 < args.timeout_s
        ):
            await pilot.pause(0.5)
            seen["verify_steps_live"].append((round(time.monotonic() - t0, 1), m.verify_steps))
            seen["notes"] += [
                n.message for n in app._notifications if n.message not in seen["notes"]
            ]
            if m.prompts_done > done:
                done = m.prompts_done
                seen["per_prompt"].append(
                    {
                        "prompts_done": done,
                        "gemm": m.gemm_backend,
                        "spec_tps": m.last_request.spec_tps,
                        "shadow_tps": m.last_request.shadow_tps,
                        "exact_prompts": m.exact_prompts,
                    }
                )
            cycle = len(m.gemm_backends)
            due = presses == 0 or done - last_press >= args.prompts_per_backend
            if m.verify_steps > 0 and presses < cycle and due:
                await pilot.press("g")
                presses, last_press = presses + 1, done
        seen["gemm_backends"] = m.gemm_backends
        seen["presses"] = presses
        await pilot.pause(1.0)
        seen["finished"] = app.model.finished or idle_after_set()
        seen["exactness"] = app.model.exactness
        seen["gemm"] = app.model.gemm_backend
        seen["gpu"] = repr(app.model.telemetry)[:400]
        seen["errors"] = [e.message[:300] for e in app.model.errors]
        app.save_screenshot(str(args.out / "dashboard_sglang.svg"))
        await pilot.press("q")
    if seen["errors"]:  # the engine never started: nothing was recorded to replay
        return seen
    header, events, problems = read_trace(trace)
    seen["trace_events"] = len(events)
    seen["trace_problems"] = problems
    seen["perfetto_events"] = len(perfetto_trace(header, events)["traceEvents"])
    seen["seconds"] = round(time.monotonic() - t0, 1)
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, help="SGLang checkpoint; none: native, embedded pair")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sglang-arg", action="append", default=[])
    p.add_argument("--timeout-s", type=float, default=240)
    p.add_argument("--prompts-per-backend", type=int, default=4)
    args = p.parse_args()
    result = asyncio.run(drive(args))
    (args.out / "dashboard_sglang.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result)[:2000])


if __name__ == "__main__":
    main()
