"""What recording a trace costs the engine, and how fast the trace tools read one back.

The engine calls its sink inline, so the writer's per-event cost is added to every step.
Same run, same events: a no-op sink, `TraceWriter` (encode + write + flush per event) and
pydantic's own `model_dump_json` (what a naive writer would do, loses NaN/inf), per event
and per verify step (one `Draft`, one `VerifyStep`, k + 1 `Token`s, half a telemetry sample).
Median of repeats after a warm-up. Then `read_trace`, Perfetto export and the HTML report
on the file just written.

    python benchmarks/bench_trace.py [--steps 5000] [--k 4] [--repeats 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import tempfile
import time
from pathlib import Path

from specdash.events import (
    Draft,
    Event,
    PromptStart,
    SessionStart,
    TelemetrySample,
    Token,
    VerifyStep,
)
from specdash.trace.export import perfetto_trace
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.trace.report import render_report


def session(steps: int, k: int) -> list[Event]:
    """A plausible stream with realistic field sizes, fixed timestamps 20 ms per step."""
    t0 = 1_000_000_000
    events: list[Event] = [
        SessionStart(t_ns=t0, config={"k": k, "engine": "native", "max_new_tokens": 64},
                     versions={"specdash": "0.1.0", "torch": "2.13.0"}, device="cpu",
                     gemm_backend="triton", git_revision="0123456789ab"),
        PromptStart(t_ns=t0, prompt_index=0, prompt_tokens=12, text="Once upon a time"),
    ]  # fmt: skip
    for step in range(steps):
        t = t0 + (step + 1) * 20_000_000
        accepted = step % (k + 1)
        drafts = [(step * 7 + i) % 151_000 for i in range(k)]
        emitted = drafts[:accepted] + [step % 151_000]
        events.append(Draft(t_ns=t, prompt_index=0, step=step, k=k, drafter="model",
                            tokens=drafts, seconds=0.004))  # fmt: skip
        events.append(
            VerifyStep(t_ns=t, prompt_index=0, step=step, k=k, accepted=accepted,
                       draft_tokens=drafts, emitted_tokens=emitted, verify_mode="exact",
                       gemm_backend="triton", draft_s=0.004, verify_s=0.011, shadow_s=0.009,
                       rollback_s=0.0002)
        )  # fmt: skip
        for i, tok in enumerate(emitted):
            events.append(
                Token(t_ns=t, prompt_index=0, position=step * (k + 1) + i, token_id=tok,
                      logprob=-0.123456789 * (i + 1), text=" word", step=step,
                      source="bonus" if i == len(emitted) - 1 else "draft")
            )  # fmt: skip
        if step % 2 == 0:
            events.append(
                TelemetrySample(t_ns=t, window_s=0.1, source="gpm", dram_bw_util_pct=61.5,
                                dram_gbps=2958.2, sm_util_pct=88.0, power_w=512.0,
                                mem_used_gb=71.3)
            )  # fmt: skip
    return events


def time_sink(make_sink, events: list[Event], repeats: int) -> float:
    """Median seconds to push every event through a fresh sink (first run is warm-up)."""
    times = []
    for r in range(repeats + 1):
        sink, close = make_sink()
        start = time.perf_counter()
        for e in events:
            sink(e)
        elapsed = time.perf_counter() - start
        close()
        if r:
            times.append(elapsed)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the trace is written")
    args = ap.parse_args()
    events = session(args.steps, args.k)
    path = Path(args.dir) / "bench_trace.jsonl"

    def noop():
        return (lambda e: None), (lambda: None)

    def writer():
        w = TraceWriter(path)
        return w, w.close

    def naive():
        f = open(path, "w")  # noqa: SIM115
        return (lambda e: (f.write(e.model_dump_json() + "\n"), f.flush())), f.close

    print(f"# {datetime.date.today()}  {platform.processor() or platform.machine()}  "
          f"python {platform.python_version()}  trace dir {args.dir}")  # fmt: skip
    print(f"{len(events)} events, {args.steps} verify steps, k={args.k}, "
          f"median of {args.repeats} after 1 warm-up")  # fmt: skip
    base = time_sink(noop, events, args.repeats)
    results = {
        "TraceWriter": time_sink(writer, events, args.repeats),
        "model_dump_json+flush": time_sink(naive, events, args.repeats),
    }
    print(f"{'sink (cost over no-op)':<24}{'us/event':>10}{'us/step':>10}")
    for name, seconds in results.items():
        extra = seconds - base
        print(f"{name:<24}{extra / len(events) * 1e6:>10.2f}{extra / args.steps * 1e6:>10.1f}")

    with TraceWriter(path) as w:
        for e in events:
            w(e)
    size = path.stat().st_size
    start = time.perf_counter()
    header, back, _ = read_trace(path)
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    perfetto_trace(header, back)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    render_report(header, back, [], title="bench")
    report_s = time.perf_counter() - start
    print(f"trace file {size / 1e6:.1f} MB ({size / args.steps:.0f} bytes/step)")
    print(f"read_trace {read_s:.2f} s ({len(events) / read_s / 1e3:.0f} k events/s), "
          f"perfetto {export_s:.2f} s, report {report_s:.2f} s")  # fmt: skip
    path.unlink()


if __name__ == "__main__":
    main()
