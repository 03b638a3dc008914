"""Engine throughput with the dashboard open vs headless, and where the engine should run.

One run, interleaved repeats, median after a warm-up:
  headless          engine on a thread, events into an EventBuffer nobody draws
  dashboard-thread  the same engine thread inside SpecdashApp (Textual headless driver,
                    160x48, at the app's refresh rates or each `--rates UI,PLOT` pair in Hz:
                    every widget is rendered, only the final terminal write is skipped)
  dashboard-process the engine in a child process, events pickled over a multiprocessing
                    queue into the dashboard's EventBuffer, one `put` per event
  dashboard-process-batched
                    the same, events sent in batches (one `put` per BATCH_S of engine time)
Engine t/s = emitted tokens / engine wall time (first to last event). Dashboard CPU share =
the UI process's CPU time not spent on the engine thread, per second of wall time.

  python benchmarks/bench_dashboard.py [--repeats 3] [--max-new-tokens 32] [--prompts FILE]
      [--rates 10,2 1,0.5] [--no-process]

While the app runs, the benchmark only sleeps (a `Pilot.pause` loop would message every
widget 20 times a second and bill that to the dashboard).

The engine is `specdash.runs.runner.run_engine` on the embedded default pair (CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from specdash.controls import Controls
from specdash.events import Event, Token
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings
from specdash.ui.app import PLOT_HZ, UI_HZ, SpecdashApp
from specdash.ui.sources import EventBuffer, Sink

SIZE = (160, 48)
BATCH_S = 0.05


class Measured:
    """Wraps a sink: counts tokens and stamps the engine's first and last event."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.tokens = 0
        self.first = self.last = 0.0

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        self.tokens += isinstance(event, Token)
        self.sink(event)

    @property
    def tps(self) -> float:
        return self.tokens / (self.last - self.first)


class ThreadEngine:
    """EventSource: the engine on a thread of this process (what LiveSession does)."""

    def __init__(self, settings: SessionSettings) -> None:
        self.controls: Controls | None = Controls.from_settings(settings)
        self.settings = settings
        self.done = threading.Event()
        self.engine_cpu_s = 0.0

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        run_engine(self.settings, self.measured, self.controls, threading.Event())
        self.engine_cpu_s = time.thread_time() - cpu0
        self.done.set()

    def stop(self) -> None:
        self.done.wait(timeout=120)


class Batcher:
    """Sink that sends events as lists, at most one `put` per `BATCH_S` (plus the last)."""

    def __init__(self, put: Callable[[list[Event]], None]) -> None:
        self.put = put
        self.batch: list[Event] = []
        self.sent = time.monotonic()

    def __call__(self, event: Event) -> None:
        self.batch.append(event)
        now = time.monotonic()
        if now - self.sent >= BATCH_S:
            self.flush()
            self.sent = now

    def flush(self) -> None:
        if self.batch:
            self.put(self.batch)
            self.batch = []


def _child(settings_json: str, queue: mp.Queue, batched: bool) -> None:
    settings = SessionSettings.model_validate_json(settings_json)
    batcher = Batcher(queue.put) if batched else None
    measured = Measured(batcher or (lambda event: queue.put([event])))
    run_engine(settings, measured, Controls.from_settings(settings), threading.Event())
    if batcher is not None:
        batcher.flush()
    queue.put(("tps", measured.tps))
    queue.put(None)


class ProcessEngine:
    """EventSource: the engine in a child process; a pump thread feeds the parent's sink.

    (Controls would need a pipe to the child; the benchmark does not press keys.)"""

    def __init__(self, settings: SessionSettings, batched: bool) -> None:
        self.controls: Controls | None = None
        self.settings = settings
        self.done = threading.Event()
        self.tps = 0.0
        # Created before the app starts: multiprocessing's resource tracker needs a real
        # stderr file descriptor, which Textual replaces while it runs.
        ctx = mp.get_context("spawn")
        self.queue = ctx.Queue()
        self.process = ctx.Process(
            target=_child, args=(self.settings.model_dump_json(), self.queue, batched)
        )

    def start(self, sink: Sink) -> None:
        self.process.start()
        threading.Thread(target=self._pump, args=(sink,), daemon=True).start()

    def _pump(self, sink: Sink) -> None:
        while (item := self.queue.get()) is not None:
            if isinstance(item, tuple):
                self.tps = item[1]
            else:
                for event in item:
                    sink(event)
        self.process.join()
        self.done.set()

    def stop(self) -> None:
        self.done.wait(timeout=120)


def run_headless(settings: SessionSettings) -> tuple[float, float]:
    source = ThreadEngine(settings)
    source.start(EventBuffer().put)
    source.done.wait()
    return source.measured.tps, 0.0


async def _run_app(
    source, done: threading.Event, rates: tuple[float, float] = (UI_HZ, PLOT_HZ)
) -> tuple[float, float]:
    app = SpecdashApp(source, ui_hz=rates[0], plot_hz=rates[1])
    wall0, cpu0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=SIZE) as pilot:
        while not done.is_set():
            await asyncio.sleep(0.1)
        await pilot.pause(0.2)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu, wall


def run_dashboard(
    settings: SessionSettings, where: str, rates: tuple[float, float] = (UI_HZ, PLOT_HZ)
) -> tuple[float, float]:
    if where == "thread":
        source = ThreadEngine(settings)
        cpu, wall = asyncio.run(_run_app(source, source.done, rates))
        return source.measured.tps, (cpu - source.engine_cpu_s) / wall
    source = ProcessEngine(settings, batched=where == "process-batched")
    cpu, wall = asyncio.run(_run_app(source, source.done))
    return source.tps, cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-process", action="store_true", help="skip dashboard-process")
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
        runs["dashboard-process-batched"] = lambda: run_dashboard(settings, "process-batched")
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
