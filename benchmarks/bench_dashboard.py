"""Engine throughput with the dashboard open vs headless, and where the engine should run.

One run, interleaved repeats, median after a warm-up:
  headless          engine on a thread, events into an EventBuffer nobody draws
  dashboard-thread  the same engine thread inside SpecdashApp (Textual headless driver,
                    160x48, UI 12 Hz, plots 3 Hz: every widget is rendered, only the final
                    terminal write is skipped)
  dashboard-process the engine in a child process, events pickled over a multiprocessing
                    queue into the dashboard's EventBuffer
Engine t/s = emitted tokens / engine wall time (first to last event). Dashboard CPU share =
the UI process's CPU time not spent on the engine thread, per second of wall time.

  python benchmarks/bench_dashboard.py --engine synthetic   # torch decode-like loop
  python benchmarks/bench_dashboard.py --engine native      # specdash.session.run_session
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import threading
import time

import torch

from specdash.app import SpecdashApp
from specdash.controls import Controls
from specdash.events import Event, Summary, Token, VerifyStep
from specdash.settings import SessionSettings
from specdash.sources import EventBuffer, Sink, initial_controls

SIZE = (160, 48)


def synthetic_session(settings, sink, controls, stop, steps: int = 150) -> None:
    """A decode-shaped CPU load: per step 4 "layers" of small matmuls, k drafts, k+1 tokens."""
    torch.manual_seed(0)
    weights = [torch.randn(256, 256) for _ in range(4)]
    x = torch.randn(5, 256)
    position = 0
    for step in range(steps):
        if stop.is_set():
            return
        controls.wait_while_paused(stop)
        k = controls.snapshot().k
        t0 = time.perf_counter()
        for _ in range(k + 2):  # drafts + verify + shadow, each a pass over the layers
            h = x
            for w in weights:
                h = torch.tanh(h @ w)
        accepted = step % (k + 1)
        seconds = time.perf_counter() - t0
        sink(
            VerifyStep(
                prompt_index=0,
                step=step,
                k=k,
                accepted=accepted,
                draft_tokens=[1] * k,
                emitted_tokens=[1] * (accepted + 1),
                verify_mode="exact",
                gemm_backend="torch",
                draft_s=seconds / 3,
                verify_s=seconds / 3,
                shadow_s=seconds / 3,
                rollback_s=0.0,
            )
        )
        for i in range(accepted + 1):
            sink(
                Token(
                    prompt_index=0,
                    position=position,
                    token_id=1,
                    logprob=-0.5,
                    text=" tok",
                    source="draft" if i < accepted else "bonus",
                    step=step,
                )
            )
            position += 1
    sink(
        Summary(
            prompts=1,
            exact_prompts=1,
            new_tokens=position,
            seconds=0.0,
            tokens_per_s=0.0,
            mean_accepted_length=0.0,
            acceptance_rate=0.0,
            verify_steps=steps,
            divergences=0,
        )
    )


def engine_fn(name: str):
    if name == "synthetic":
        return synthetic_session
    from specdash.session import run_session

    return run_session


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

    def __init__(self, engine: str, settings: SessionSettings) -> None:
        self.controls: Controls | None = initial_controls(settings)
        self.engine, self.settings = engine, settings
        self.done = threading.Event()
        self.engine_cpu_s = 0.0

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        engine_fn(self.engine)(self.settings, self.measured, self.controls, threading.Event())
        self.engine_cpu_s = time.thread_time() - cpu0
        self.done.set()

    def stop(self) -> None:
        self.done.wait()


def _child(engine: str, settings_json: str, queue: mp.Queue) -> None:
    settings = SessionSettings.model_validate_json(settings_json)
    measured = Measured(queue.put)
    engine_fn(engine)(settings, measured, initial_controls(settings), threading.Event())
    queue.put(("tps", measured.tps))
    queue.put(None)


class ProcessEngine:
    """EventSource: the engine in a child process; a pump thread feeds the parent's sink.

    (Controls would need a pipe to the child; the benchmark does not press keys.)"""

    def __init__(self, engine: str, settings: SessionSettings) -> None:
        self.controls: Controls | None = None
        self.engine, self.settings = engine, settings
        self.done = threading.Event()
        self.tps = 0.0

    def start(self, sink: Sink) -> None:
        ctx = mp.get_context("spawn")
        self.queue = ctx.Queue()
        self.process = ctx.Process(
            target=_child, args=(self.engine, self.settings.model_dump_json(), self.queue)
        )
        self.process.start()
        threading.Thread(target=self._pump, args=(sink,), daemon=True).start()

    def _pump(self, sink: Sink) -> None:
        while (item := self.queue.get()) is not None:
            if isinstance(item, tuple):
                self.tps = item[1]
            else:
                sink(item)
        self.process.join()
        self.done.set()

    def stop(self) -> None:
        self.done.wait()


def run_headless(engine: str, settings: SessionSettings) -> tuple[float, float]:
    source = ThreadEngine(engine, settings)
    source.start(EventBuffer().put)
    source.done.wait()
    return source.measured.tps, 0.0


async def _run_app(source, done: threading.Event) -> tuple[float, float]:
    app = SpecdashApp(source)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=SIZE) as pilot:
        while not done.is_set():
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu, wall


def run_dashboard(engine: str, settings: SessionSettings, where: str) -> tuple[float, float]:
    if where == "thread":
        source = ThreadEngine(engine, settings)
        cpu, wall = asyncio.run(_run_app(source, source.done))
        return source.measured.tps, (cpu - source.engine_cpu_s) / wall
    source = ProcessEngine(engine, settings)
    cpu, wall = asyncio.run(_run_app(source, source.done))
    return source.tps, cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["synthetic", "native"], default="synthetic")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--no-process", action="store_true", help="skip dashboard-process")
    args = parser.parse_args()
    settings = SessionSettings(max_new_tokens=args.max_new_tokens)
    runs = {
        "headless": lambda: run_headless(args.engine, settings),
        "dashboard-thread": lambda: run_dashboard(args.engine, settings, "thread"),
    }
    if not args.no_process:
        runs["dashboard-process"] = lambda: run_dashboard(args.engine, settings, "process")
    for run in runs.values():  # warm-up: imports, allocator, first render
        run()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            results[name].append(run())
    base = statistics.median(t for t, _ in results["headless"])
    print(f"engine={args.engine} repeats={args.repeats} torch_threads={torch.get_num_threads()}")
    print(f"{'mode':<18} {'engine t/s':>10} {'vs headless':>11} {'UI CPU':>8}   runs t/s")
    for name, rows in results.items():
        tps = statistics.median(t for t, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        runs_text = " ".join(f"{t:.1f}" for t, _ in rows)
        print(f"{name:<18} {tps:>10.1f} {tps / base:>11.3f} {cpu:>7.0%}   {runs_text}")


if __name__ == "__main__":
    main()
