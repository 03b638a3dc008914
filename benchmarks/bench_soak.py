"""Soak: the dashboard's resident memory over a long live session, which must not grow.

Runs the real dashboard (`specdash run ...` as the CLI builds it, `dashboard_app`) under
Textual's headless driver at 160x48 over a live native session, and samples the process RSS
every `--interval` seconds for `--duration` seconds. Writes JSON (every sample, plus the
growth after `--warmup`: max/min ratio and a least-squares slope in MB/min) and prints a
table. The session runs until the duration is up (a session that finishes earlier leaves the
dashboard open and idle; the JSON says when it finished).

  python benchmarks/bench_soak.py [--duration 1800] [--interval 30] [--warmup 300]
      [--out soak.json] [--tracemalloc] -- [specdash run flags, default --max-new-tokens 2000]

`--tracemalloc` (slows the engine) also diffs Python allocations by file:line between the
end of the warm-up and the end, to say what grows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

SIZE = (160, 48)


def rss_mb() -> float:
    """Resident set size of this process, MB (psutil if there, else /proc)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return float("nan")


def growth(samples: list[dict], warmup_s: float) -> dict:
    """RSS after the warm-up: first, last, min, max, max/min and the slope (MB/min)."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 2:
        return {}
    ts = [s["t_s"] / 60 for s in after]
    ys = [s["rss_mb"] for s in after]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sum(
        (t - mt) ** 2 for t in ts
    )
    lo, hi = min(ys), max(ys)
    return {
        "warmup_s": warmup_s,
        "rss_at_warmup_mb": ys[0],
        "rss_end_mb": ys[-1],
        "rss_min_mb": lo,
        "rss_max_mb": hi,
        "max_over_min": hi / lo,
        "slope_mb_per_min": slope,
        "flat_within_5pct": hi / lo <= 1.05,
    }


def probe(app) -> dict:
    """Sizes of the app's own containers (what could grow)."""
    m = app.model
    return {
        "events": m.revision,
        "tokens": m.session_tokens,
        "prompts_done": m.prompts_done,
        "finished": m.finished,
        "event_log": len(app.event_log),
        "stream": len(m.stream),
        "divergences": len(m.divergences),
        "errors": len(m.errors),
        # not len(gc.get_objects()): that hands out tuples the engine thread is still
        # building (`tuple(generator)`), whose next resize then raises SystemError there
        # (CPython gh-107137, fixed in 3.13) and stops the engine thread mid-session
        "allocated_blocks": sys.getallocatedblocks(),
    }


def top_diff(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int = 25) -> list:
    stats = after.compare_to(before, "lineno")
    return [
        {"where": str(s.traceback[0]), "size_diff_kb": s.size_diff / 1024, "count": s.count_diff}
        for s in stats[:n]
    ]


async def soak(app, args) -> dict:
    samples: list[dict] = []
    snaps: dict[str, tracemalloc.Snapshot] = {}
    finished_at = None
    t0 = time.monotonic()
    async with app.run_test(size=SIZE):
        next_at = 0.0
        while True:
            t = time.monotonic() - t0
            if t >= next_at:
                row = {"t_s": round(t, 1), "rss_mb": round(rss_mb(), 1), **probe(app)}
                if args.tracemalloc:
                    row["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
                samples.append(row)
                traced = f"  traced {row['traced_mb']}" if args.tracemalloc else ""
                print(
                    f"{row['t_s']:>7.0f} s  RSS {row['rss_mb']:>7.1f} MB  events "
                    f"{row['events']:>8}  tokens {row['tokens']:>7}  prompts "
                    f"{row['prompts_done']:>3}  log {row['event_log']:>6}  blocks "
                    f"{row['allocated_blocks']:>8}  errors {row['errors']}{traced}",
                    flush=True,
                )
                if args.tracemalloc and "warmup" not in snaps and t >= args.warmup:
                    snaps["warmup"] = tracemalloc.take_snapshot()
                next_at += args.interval
            if finished_at is None and app.model.finished:
                finished_at = round(t, 1)
            if t >= args.duration:
                break
            await asyncio.sleep(min(1.0, max(0.05, next_at - t)))
        if args.tracemalloc:
            snaps["end"] = tracemalloc.take_snapshot()
        app.exit(0)
    result = {
        "samples": samples,
        "session_finished_at_s": finished_at,
        # an engine thread that stops mid-session says why here
        "engine_errors": [(e.fatal, e.message) for e in app.model.errors],
        "growth_after_warmup": growth(samples, args.warmup),
    }
    if "warmup" in snaps and "end" in snaps:
        result["tracemalloc_growth_warmup_to_end"] = top_diff(snaps["warmup"], snaps["end"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds before flatness")
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("run_flags", nargs="*", help="specdash run flags (after --)")
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start(1)

    from specdash.cli import build_parser
    from specdash.cli.dashboard import dashboard_app

    flags = args.run_flags or ["--max-new-tokens", "2000"]
    app = dashboard_app(build_parser().parse_args(["run", *flags]))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load0 = os.getloadavg()
    result = asyncio.run(soak(app, args))
    result |= {
        "started": started,
        "command": f"python benchmarks/bench_soak.py --duration {args.duration:g} "
        f"--interval {args.interval:g} --warmup {args.warmup:g} -- {' '.join(flags)}",
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs {platform.platform()}",
        "load_avg_start": load0,
        "load_avg_end": os.getloadavg(),
        "size": SIZE,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    g = result["growth_after_warmup"]
    if g:
        print(
            f"after {g['warmup_s']:g} s warm-up: RSS {g['rss_at_warmup_mb']:.1f} -> "
            f"{g['rss_end_mb']:.1f} MB (min {g['rss_min_mb']:.1f}, max {g['rss_max_mb']:.1f}, "
            f"max/min {g['max_over_min']:.3f}), slope {g['slope_mb_per_min']:+.2f} MB/min, "
            f"{'flat' if g['flat_within_5pct'] else 'NOT flat'} within 5 %"
        )
    for row in result.get("tracemalloc_growth_warmup_to_end", []):
        print(f"{row['size_diff_kb']:>10.1f} kB {row['count']:>+8}  {row['where']}")
    for fatal, message in result["engine_errors"]:
        print(f"engine error ({'fatal' if fatal else 'not fatal'}): {message}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
