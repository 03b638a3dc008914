"""Engine throughput with the dashboard open vs headless, and where the engine should run.

One run, interleaved repeats, median after a warm-up:
  headless          engine on a thread, events into an EventBuffer nobody draws
  dashboard-thread  the same engine thread inside SpecdashApp (Textual headless driver,
                    160x48, at the app's refresh rates or each `--rates UI,PLOT` pair in Hz:
                    every widget is rendered, only the final terminal write is skipped)
  dashboard-process what `specdash` runs: `LiveSession`, the engine in a spawned child process
                    (`specdash.runs.engine_process`, events in 50 ms batches over a pipe), in
                    the same app at the app's refresh rates
Engine t/s = emitted tokens / engine time, from the first event's `t_ns` to the last token's (the
events' own clock, system-wide: the same in a child). UI CPU = the UI process's CPU time not
spent on the engine thread (all of it for dashboard-process), per second of wall time.

  python benchmarks/bench_dashboard.py [--repeats 3] [--max-new-tokens 32] [--prompts FILE]
      [--rates 10,2 1,0.5] [--no-process] [--only MODE ...]

While the app runs, the benchmark only sleeps (a `Pilot.pause` loop would message every
widget 20 times a second and bill that to the dashboard).

The engine is `specdash.runs.runner.run_engine` on the embedded default pair (CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from specdash.controls import Controls
from specdash.events import Event, Idle, Summary, Token
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings
from specdash.ui.app import PLOT_HZ, UI_HZ, SpecdashApp
from specdash.ui.sources import EventBuffer, LiveSession, Sink

SIZE = (160, 48)


class Measured:
    """Wraps a sink: counts tokens, keeps the first event's and the last token's time (`t_ns`:
    what comes after the last token differs, an `Idle` or the summary), and sets
    `done` at the session's summary or its `Idle` (the dashboard's session stays open)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.tokens = 0
        self.first = self.last = 0
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.first = self.first or event.t_ns
        if isinstance(event, Token):
            self.tokens += 1
            self.last = event.t_ns
        self.sink(event)
        if isinstance(event, Summary | Idle):
            self.done.set()

    @property
    def tps(self) -> float:
        return self.tokens / ((self.last - self.first) / 1e9)


class ThreadEngine:
    """EventSource: the engine on a thread of this process (the dashboard before the engine
    had a process of its own)."""

    def __init__(self, settings: SessionSettings) -> None:
        self.controls: Controls | None = Controls.from_settings(settings)
        self.settings = settings
        self.engine_cpu_s = 0.0

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        run_engine(self.settings, self.measured, self.controls, threading.Event())
        self.engine_cpu_s = time.thread_time() - cpu0

    def stop(self) -> None:
        self.thread.join(timeout=120)


class ProcessEngine(LiveSession):
    """EventSource: `LiveSession` as `specdash` runs it (no GPU sampler), measured."""

    def __init__(self, settings: SessionSettings) -> None:
        super().__init__(settings, telemetry=False)
        self.engine_cpu_s = 0.0  # in another process: none of this one's

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink)
        super().start(self.measured)


def run_headless(settings: SessionSettings) -> tuple[float, float]:
    source = ThreadEngine(settings)
    source.start(EventBuffer().put)
    source.stop()
    return source.measured.tps, 0.0


async def _run_app(
    source: ThreadEngine | ProcessEngine, rates: tuple[float, float]
) -> tuple[float, float]:
    app = SpecdashApp(source, ui_hz=rates[0], plot_hz=rates[1])
    wall0, cpu0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=SIZE) as pilot:
        while not source.measured.done.is_set():
            await asyncio.sleep(0.1)
        await pilot.pause(0.2)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu, wall


def run_dashboard(
    settings: SessionSettings, where: str, rates: tuple[float, float] = (UI_HZ, PLOT_HZ)
) -> tuple[float, float]:
    source = ThreadEngine(settings) if where == "thread" else ProcessEngine(settings)
    cpu, wall = asyncio.run(_run_app(source, rates))
    return source.measured.tps, (cpu - source.engine_cpu_s) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-process", action="store_true", help="skip dashboard-process")
    parser.add_argument(
        "--only", nargs="+", help="these modes (headless, dashboard-thread, dashboard-process)"
    )
    parser.add_argument("--prompts", type=Path, help="a JSONL prompt file (default: shipped)")
    parser.add_argument(
        "--rates",
        nargs="+",
        default=[f"{UI_HZ:g},{PLOT_HZ:g}"],
        help="dashboard-thread refresh rates to compare, each UI,PLOT in Hz",
    )
    args = parser.parse_args()
    settings = SessionSettings(max_new_tokens=args.max_new_tokens, prompts=args.prompts)
    load_start = os.getloadavg()
    runs: dict[str, Callable[[], tuple[float, float]]] = {
        "headless": lambda: run_headless(settings)
    }
    for pair in args.rates:
        ui_hz, plot_hz = (float(x) for x in pair.split(","))
        runs[f"dashboard-thread {ui_hz:g}/{plot_hz:g} Hz"] = partial(
            run_dashboard, settings, "thread", (ui_hz, plot_hz)
        )
    if not args.no_process:
        runs["dashboard-process"] = lambda: run_dashboard(settings, "process")
    if args.only:
        keep = {"headless", *args.only}  # the baseline always runs
        runs = {name: run for name, run in runs.items() if name.split()[0] in keep}
    for run in runs.values():  # warm-up: imports, allocator, first render
        run()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            results[name].append(run())
    base = statistics.median(t for t, _ in results["headless"])
    threads = torch.get_num_threads()
    prompts = args.prompts or "shipped"
    print(
        f"max_new_tokens={args.max_new_tokens} repeats={args.repeats} torch_threads={threads} "
        f"prompts={prompts}"
    )
    load = " ".join(f"{x:.2f}" for x in load_start), " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1/5/15 min) at start {load[0]}, at end {load[1]}")
    print(f"{'mode':<30} {'engine t/s':>10} {'vs headless':>11} {'UI CPU':>8}   runs t/s")
    for name, rows in results.items():
        tps = statistics.median(t for t, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        runs_text = " ".join(f"{t:.1f}" for t, _ in rows)
        print(f"{name:<30} {tps:>10.1f} {tps / base:>11.3f} {cpu:>7.0%}   {runs_text}")


if __name__ == "__main__":
    main()
