"""The trace subcommands: `export`, `replay`, `report` and `diff` over recorded traces.

Each reads its trace(s) with `read_trace`, prints the reader's warnings on stderr, and hands
the events to the module that does the work (`specdash.trace.*`, or the replay dashboard).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import IO

from specdash.errors import EXIT_DIVERGED, EXIT_OK, EnvironmentProblem
from specdash.events import Event, SessionStart
from specdash.trace.jsonl import read_trace


def _read(path: str) -> tuple[SessionStart, list[Event], list[str]]:
    header, events, warnings = read_trace(path)
    for w in warnings:
        print(f"specdash: warning: {w}", file=sys.stderr)
    return header, events, warnings


def default_output(trace: str, suffix: str) -> str:
    return str(Path(trace).with_suffix(suffix))


def _open_output(path: str | None) -> IO[str]:
    if path is None or path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8", newline="")
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {path}: {e.strerror or e}") from None


def run_export(args: argparse.Namespace) -> int:
    from specdash.trace.export import perfetto_trace, write_csv

    header, events, _ = _read(args.trace)
    suffix = ".perfetto.json" if args.format == "perfetto" else ".csv"
    path = args.output or default_output(args.trace, suffix)
    out = _open_output(path)
    try:
        if args.format == "perfetto":
            json.dump(perfetto_trace(header, events), out, allow_nan=False)
        else:
            write_csv(header, events, out)
        out.flush()
    except BrokenPipeError:
        if out is not sys.stdout:
            raise EnvironmentProblem(f"cannot write {path}: broken pipe") from None
        # `| head`: the reader took what it wanted; point stdout at /dev/null for the exit flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if out is not sys.stdout:
            out.close()
    if out is not sys.stdout:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("matplotlib") is None:
        raise EnvironmentProblem(
            "the report's plots need matplotlib: pip install 'specdash[report]'"
        )
    from specdash.trace.report import render_report

    header, events, warnings = _read(args.trace)
    out = Path(args.output or default_output(args.trace, ".html"))
    page = render_report(header, events, warnings, title=Path(args.trace).name)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {out}: {e.strerror or e}") from None
    print(f"wrote {out}", file=sys.stderr)
    return EXIT_OK


def run_diff(args: argparse.Namespace) -> int:
    from specdash.trace.diff import diff_prompts, format_diff, label, verdict

    header_a, events_a, warnings_a = read_trace(args.a)
    header_b, events_b, warnings_b = read_trace(args.b)
    for w in warnings_a + warnings_b:
        print(f"specdash: warning: {w}", file=sys.stderr)
    diffs = diff_prompts(events_a, events_b)
    for d in diffs:
        print(format_diff(d))
    differing = sum(d.index is not None for d in diffs)
    print(
        f"summary: {differing} of {len(diffs)} prompts differ; A = {label(args.a, header_a)}, "
        f"B = {label(args.b, header_b)}: {verdict(diffs)}"
    )
    return EXIT_DIVERGED if differing else EXIT_OK


def run_replay(args: argparse.Namespace) -> int:
    header, events, warnings = _read(args.trace)
    from specdash.trace.replay import TraceReplay
    from specdash.ui.replay_app import ReplayApp

    replay = TraceReplay(header, events, speed=args.speed)
    ReplayApp(replay, name=Path(args.trace).name, warnings=warnings).run()
    return EXIT_OK
