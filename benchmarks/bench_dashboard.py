"""Engine throughput with the dashboard open vs headless, on any session `specdash run` runs.

One run, interleaved repeats, median after a warm-up:
  headless          `run_engine` on this process's main thread, as `specdash run --headless`
                    runs it (SGLang's engine must start on a main thread), events into an
                    EventBuffer nobody draws
  dashboard-thread  the engine on a thread inside SpecdashApp (Textual headless driver, 160x48,
                    at the app's refresh rates or each `--rates UI,PLOT` pair in Hz: every
                    widget is rendered, only the final terminal write is skipped); not for
                    `--engine sglang` (its engine refuses a thread that is not a main thread)
  dashboard-process what `specdash` runs: `LiveSession` (the engine in a spawned child process,
                    `specdash.runs.engine_process`, events in 50 ms batches over a pipe; the GPU
                    sampler on a thread here) in the same app at the app's refresh rates
Every mode runs the same session, built from the session flags (`specdash run`'s own parser and
`settings_from_args`: any flag `specdash run` takes, e.g. `--device cuda --preset
qwen3.5-27b-shape --drafter ngram` or `--engine sglang --model DIR --speculative-algorithm NGRAM
-k 3 --sglang-arg KEY=VALUE`), each run a fresh session with its own engine start.
Engine t/s = emitted tokens / engine time, from the session's header (`SessionStart`, after the
engine has loaded) or, with `--warmup-prompts N`, from prompt N's start (earlier prompts warm up
kernels and CUDA graphs inside each run, without another engine start), to the last token: the
events' own clock, system-wide (the same in a child). UI CPU = the UI process's CPU time not
spent on the engine thread (all of it for dashboard-process), per second of wall time.

  python benchmarks/bench_dashboard.py [--repeats 3] [--warmup each|once|none]
      [--warmup-prompts N] [--rates 10,2 1,0.5] [--no-process] [--only MODE ...]
      [--budget-s S] [--json OUT] [session flags of `specdash run`, default 32 new tokens]

Warm-up: `each` runs every mode once first (imports, allocator, first render), `once` runs
headless once (Triton's kernels compiled, its disk cache filled), `none` measures from the first
run. A line per run as it ends, the JSON (`--json`) rewritten after every run: a run cut off
keeps what it measured. `--budget-s` starts no run that the longest run so far says would end
past it.

While the app runs, the benchmark only sleeps (a `Pilot.pause` loop would message every
widget 20 times a second and bill that to the dashboard).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdash.cli import build_parser
from specdash.cli.session_args import describe, session_options, settings_from_args
from specdash.controls import Controls
from specdash.errors import EXIT_ENVIRONMENT, SpecdashError, UsageError
from specdash.events import EngineError, Event, Idle, PromptStart, SessionStart, Summary, Token
from specdash.prompts import load_prompts
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings
from specdash.ui.app import PLOT_HZ, UI_HZ, SpecdashApp
from specdash.ui.sources import EventBuffer, LiveSession, Sink

if TYPE_CHECKING:
    from specdash.runs.runner import EngineOptions

SIZE = (160, 48)
MAX_NEW_TOKENS = 32
"""The bench's default `--max-new-tokens` (a session flag given wins)."""


class RunFailed(Exception):
    """A measured session ended with an error: the bench stops, its results so far kept."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code or EXIT_ENVIRONMENT


class Measured:
    """Wraps a sink: counts the tokens from the session's header (or prompt `from_prompt`'s
    start) on, keeps that event's and the last token's time (`t_ns`: what comes after the last
    token differs, an `Idle` or the summary), and sets `done` at the session's summary, its
    `Idle` (the dashboard's session stays open) or a fatal error (kept in `error`)."""

    def __init__(self, sink: Sink, from_prompt: int = 0) -> None:
        self.sink = sink
        self.from_prompt = from_prompt
        self.begun = time.monotonic_ns()
        self.started = 0
        """The header's time: the engine's start is over."""
        self.tokens = 0
        self.first = self.last = 0
        self.error: EngineError | None = None
        self.done = threading.Event()

    def _opens_window(self, event: Event) -> bool:
        if self.from_prompt == 0:
            return isinstance(event, SessionStart)
        return isinstance(event, PromptStart) and event.prompt_index == self.from_prompt

    def __call__(self, event: Event) -> None:
        if isinstance(event, SessionStart):
            self.started = event.t_ns
        if not self.first and self._opens_window(event):
            self.first = event.t_ns
        if isinstance(event, Token) and self.first:
            self.tokens += 1
            self.last = event.t_ns
        self.sink(event)
        if isinstance(event, EngineError) and event.fatal:
            self.error = event
            self.done.set()
        if isinstance(event, Summary | Idle):
            self.done.set()

    @property
    def tps(self) -> float | None:
        return self.tokens / ((self.last - self.first) / 1e9) if self.last > self.first else None

    @property
    def start_s(self) -> float | None:
        """Seconds from the run's start to the session's header (the engine's start)."""
        return (self.started - self.begun) / 1e9 if self.started else None


@dataclass
class Run:
    """One measured session, as printed and written to the JSON."""

    mode: str
    round: int
    """0: warm-up (not in the medians)."""
    engine_tps: float | None
    tokens: int
    start_s: float | None
    wall_s: float
    ui_cpu: float | None
    """UI process CPU per wall second; None headless (no UI)."""
    cuda_kept_gb: float | None = None
    """CUDA memory this process still holds after the run (a headless session's should be ~0:
    the next dashboard's engine process needs the room)."""


class ThreadEngine:
    """EventSource: the engine on a thread of this process (the dashboard before the engine
    had a process of its own)."""

    def __init__(
        self, settings: SessionSettings, options: EngineOptions | None, from_prompt: int
    ) -> None:
        self.controls: Controls | None = Controls.from_settings(settings)
        self.settings, self.options, self.from_prompt = settings, options, from_prompt
        self.engine_cpu_s = 0.0

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink, self.from_prompt)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        stop = threading.Event()
        run_engine(self.settings, self.measured, self.controls, stop, self.options)
        self.engine_cpu_s = time.thread_time() - cpu0

    def stop(self) -> None:
        self.thread.join(timeout=120)


class ProcessEngine(LiveSession):
    """EventSource: `LiveSession` as `specdash` builds it (`cli.dashboard.dashboard_app`: the
    engine options, `describe`, the GPU sampler), measured."""

    def __init__(
        self, settings: SessionSettings, options: EngineOptions | None, from_prompt: int
    ) -> None:
        super().__init__(settings, engine_options=options, describe=describe)
        self.from_prompt = from_prompt
        self.engine_cpu_s = 0.0  # in another process: none of this one's

    def start(self, sink: Sink) -> None:
        self.measured = Measured(sink, self.from_prompt)
        super().start(self.measured)


def cuda_kept_gb() -> float | None:
    """This process's CUDA blocks handed back to the driver (a headless session's weights: the
    next run's engine process allocates its own), and what it still holds, in GB."""
    gc.collect()
    if not torch.cuda.is_initialized():
        return None
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 1e9


def run_headless(
    settings: SessionSettings, options: EngineOptions | None, from_prompt: int
) -> tuple[Measured, float | None]:
    measured = Measured(EventBuffer().put, from_prompt)
    run_engine(settings, measured, options=options)
    return measured, None


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
    settings: SessionSettings,
    options: EngineOptions | None,
    from_prompt: int,
    where: str,
    rates: tuple[float, float] = (UI_HZ, PLOT_HZ),
) -> tuple[Measured, float | None]:
    source = (ThreadEngine if where == "thread" else ProcessEngine)(settings, options, from_prompt)
    cpu, wall = asyncio.run(_run_app(source, rates))
    return source.measured, (cpu - source.engine_cpu_s) / wall


Mode = Callable[[], tuple[Measured, float | None]]


def modes(
    args: argparse.Namespace, settings: SessionSettings, options: EngineOptions | None
) -> dict[str, Mode]:
    """The modes to compare, by name, headless first (the baseline always runs)."""
    session = (settings, options, args.warmup_prompts)
    runs: dict[str, Mode] = {"headless": partial(run_headless, *session)}
    if settings.engine == "sglang":
        print("dashboard-thread: not run (SGLang's engine starts only on a main thread)")
    else:
        for pair in args.rates:
            ui_hz, plot_hz = (float(x) for x in pair.split(","))
            runs[f"dashboard-thread {ui_hz:g}/{plot_hz:g} Hz"] = partial(
                run_dashboard, *session, "thread", (ui_hz, plot_hz)
            )
    if not args.no_process:
        runs["dashboard-process"] = partial(run_dashboard, *session, "process")
    if args.only:
        keep = {"headless", *args.only}
        runs = {name: run for name, run in runs.items() if name.split()[0] in keep}
    return runs


class Bench:
    """The runs in order, each printed as it ends and the JSON rewritten after it."""

    def __init__(self, args: argparse.Namespace, record: dict) -> None:
        self.args, self.record = args, record
        self.t0 = time.monotonic()
        self.runs: list[Run] = []

    def fits(self, label: str) -> bool:
        """Whether a run started now ends inside `--budget-s`, judged by the longest run so
        far (the first run always starts)."""
        if self.args.budget_s is None or not self.runs:
            return True
        elapsed = time.monotonic() - self.t0
        longest = max(r.wall_s for r in self.runs)
        if elapsed + longest <= self.args.budget_s:
            return True
        print(f"[{elapsed:5.0f}s] budget: {label} not started (runs take up to {longest:.0f}s)")
        return False

    def measure(self, name: str, mode: Mode, round_no: int) -> None:
        wall0 = time.monotonic()
        measured, ui_cpu = mode()
        wall = time.monotonic() - wall0
        if measured.error is not None:
            error = measured.error
            raise RunFailed(f"{name}: {error.message}", error.exit_code)
        run = Run(name, round_no, measured.tps, measured.tokens, measured.start_s, wall, ui_cpu)
        run.cuda_kept_gb = cuda_kept_gb()
        self.runs.append(run)
        self.print_run(run)
        self.write()

    def print_run(self, r: Run) -> None:
        label = "warm-up" if r.round == 0 else f"round {r.round}"
        tps = "–" if r.engine_tps is None else f"{r.engine_tps:.2f}"
        start = "–" if r.start_s is None else f"{r.start_s:.1f}s"
        cpu = "" if r.ui_cpu is None else f"  UI CPU {r.ui_cpu:.0%}"
        kept = "" if r.cuda_kept_gb is None else f"  CUDA kept {r.cuda_kept_gb:.2f} GB"
        print(
            f"[{time.monotonic() - self.t0:5.0f}s] {label:<8} {r.mode:<28} engine {tps} t/s "
            f"({r.tokens} tokens)  start {start}  run {r.wall_s:.1f}s{cpu}{kept}",
            flush=True,
        )

    def medians(self) -> dict[str, dict[str, float | int | None]]:
        """Per mode, over the measured rounds (warm-ups left out): the median engine t/s, its
        ratio to headless's, the median UI CPU, the number of runs."""
        out: dict[str, dict[str, float | int | None]] = {}
        for name in dict.fromkeys(r.mode for r in self.runs):
            rows = [r for r in self.runs if r.mode == name and r.round > 0]
            speeds = [r.engine_tps for r in rows if r.engine_tps is not None]
            cpus = [r.ui_cpu for r in rows if r.ui_cpu is not None]
            out[name] = {
                "engine_tps": statistics.median(speeds) if speeds else None,
                "ui_cpu": statistics.median(cpus) if cpus else None,
                "runs": len(rows),
            }
        base = out.get("headless", {}).get("engine_tps")
        for row in out.values():
            speed = row["engine_tps"]
            row["vs_headless"] = speed / base if speed is not None and base else None
        return out

    def write(self) -> None:
        if self.args.json is None:
            return
        self.record |= {
            "runs": [asdict(r) for r in self.runs],
            "modes": self.medians(),
            "load_average_now": os.getloadavg(),
        }
        tmp = self.args.json.with_name(self.args.json.name + ".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.args.json)

    def report(self) -> None:
        """The load, and a line per mode: medians over the measured rounds so far."""
        load = [
            " ".join(f"{x:.2f}" for x in la)
            for la in (self.record["load_average_start"], os.getloadavg())
        ]
        print(f"load average (1/5/15 min) at start {load[0]}, at end {load[1]}")
        print(f"{'mode':<30} {'engine t/s':>10} {'vs headless':>11} {'UI CPU':>8}   runs t/s")
        for name, row in self.medians().items():
            runs = " ".join(
                "–" if r.engine_tps is None else f"{r.engine_tps:.1f}"
                for r in self.runs
                if r.mode == name and r.round > 0
            )
            tps, ratio, cpu = row["engine_tps"], row["vs_headless"], row["ui_cpu"]
            print(
                f"{name:<30} {'–' if tps is None else f'{tps:.1f}':>10} "
                f"{'–' if ratio is None else f'{ratio:.3f}':>11} "
                f"{'–' if cpu is None else f'{cpu:.0%}':>8}   {runs}"
            )


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """The bench's own flags, and every other flag as `specdash run` parses it (its errors,
    its exit code 2)."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="Any other flag is a session flag of `specdash run` (`specdash run --help`).",
        allow_abbrev=False,
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warmup",
        choices=["each", "once", "none"],
        default="each",
        help="each mode once, headless once, or no warm-up run (default: each)",
    )
    parser.add_argument(
        "--warmup-prompts",
        type=int,
        default=0,
        metavar="N",
        help="measure each run from prompt N's start: the first N prompts warm up (default: 0)",
    )
    parser.add_argument("--no-process", action="store_true", help="skip dashboard-process")
    parser.add_argument(
        "--only", nargs="+", help="these modes (headless, dashboard-thread, dashboard-process)"
    )
    parser.add_argument(
        "--rates",
        nargs="+",
        default=[f"{UI_HZ:g},{PLOT_HZ:g}"],
        help="dashboard-thread refresh rates to compare, each UI,PLOT in Hz",
    )
    parser.add_argument(
        "--budget-s", type=float, help="start no run that would end past this many seconds"
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the runs and medians")
    args, session_argv = parser.parse_known_args(argv)
    # argparse keeps the last of a repeated flag: one among the session flags wins
    session = build_parser().parse_args(
        ["run", "--max-new-tokens", str(MAX_NEW_TOKENS), *session_argv]
    )
    return args, session


def main(argv: list[str] | None = None) -> int:
    args, session = parse(argv)
    bench: Bench | None = None
    try:
        settings = settings_from_args(session)
        options = session_options(settings, session)
        if settings.trace is not None:
            raise UsageError("not measured (every run would write it)", setting="trace")
        prompts = len(load_prompts(settings.prompts))
        if args.warmup_prompts >= prompts:
            raise UsageError(
                f"--warmup-prompts {args.warmup_prompts}: the prompt set has {prompts} prompts"
            )
        runs = modes(args, settings, options)
        threads = torch.get_num_threads()
        where = "" if settings.engine == "sglang" else f" on {settings.device}"
        print(
            f"{settings.engine} engine{where}: {prompts} prompts, "
            f"{settings.max_new_tokens} new tokens, measured from prompt {args.warmup_prompts}; "
            f"repeats={args.repeats} warmup={args.warmup} torch_threads={threads}",
            flush=True,
        )
        record = {
            "argv": sys.argv[1:] if argv is None else argv,
            "settings": settings.model_dump(mode="json"),
            "sglang": None if options is None else {
                "speculative_algorithm": options.speculative_algorithm,
                "engine_args": {k: repr(v) for k, v in options.engine_args.items()},
                "shadow_mode": options.shadow_mode,
            },
            "repeats": args.repeats,
            "warmup": args.warmup,
            "warmup_prompts": args.warmup_prompts,
            "budget_s": args.budget_s,
            "torch_threads": threads,
            "load_average_start": os.getloadavg(),
        }  # fmt: skip
        bench = Bench(args, record)
        warmups = {"each": list(runs), "once": ["headless"], "none": []}[args.warmup]
        planned = [(name, 0) for name in warmups]
        planned += [(name, r) for r in range(1, args.repeats + 1) for name in runs]
        for name, round_no in planned:
            if not bench.fits(f"{name} round {round_no}"):
                break
            bench.measure(name, runs[name], round_no)
    except SpecdashError as e:
        print(f"specdash: error: {describe(e)}", file=sys.stderr)
        code = e.exit_code
    except RunFailed as e:
        print(f"bench_dashboard: error: {e}", file=sys.stderr)
        code = e.exit_code
    else:
        code = 0
    if bench is not None and bench.runs:  # what was measured before an error too
        bench.report()
    return code


if __name__ == "__main__":
    sys.exit(main())
