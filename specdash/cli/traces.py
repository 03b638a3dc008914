"""The trace subcommands: `export`, `replay`, `report` and `diff` over recorded traces.

Each reads its trace(s) with `read_trace`, prints the reader's warnings on stderr, and hands
the events to the module that does the work (`specdash.trace.*`, or the replay dashboard).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import IO

from specdash.cli.stdout import print_stdout, write_stdout
from specdash.errors import (
    EXIT_DIVERGED,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EnvironmentProblem,
    FlagError,
)
from specdash.events import Event, SessionStart
from specdash.output_files import Output
from specdash.trace.jsonl import read_trace


def _read(path: str) -> tuple[SessionStart, list[Event], list[str]]:
    header, events, warnings = read_trace(path)
    for w in warnings:
        print(f"specdash: warning: {w}", file=sys.stderr)
    return header, events, warnings


def default_output(trace: str, suffix: str) -> str:
    return str(Path(trace).with_suffix(suffix))


def _output(args: argparse.Namespace, suffix: str) -> Output:
    """Where `export` / `report` write, checked before the trace is read: never the trace
    itself, an existing file only with --overwrite."""
    if args.output == "":
        raise FlagError("argument -o/--output: expected a path, got an empty string")
    path = args.output or default_output(args.trace, suffix)
    return Output(
        path,
        what="output",
        inputs=[(Path(args.trace), "the trace it reads")],
        overwrite=args.overwrite,
        flag="--overwrite",
    )


def run_export(args: argparse.Namespace) -> int:
    from specdash.trace.export import perfetto_trace, write_csv

    suffix = ".perfetto.json" if args.format == "perfetto" else ".csv"
    output = None if args.output == "-" else _output(args, suffix)
    header, events, _ = _read(args.trace)

    def write(out: IO[str]) -> None:
        if args.format == "perfetto":
            json.dump(perfetto_trace(header, events), out, allow_nan=False)
        else:
            write_csv(header, events, out)

    if output is None:
        write_stdout(write)
        return EXIT_OK
    with output.replace() as f:
        write(f)
    print(f"wrote {output.path}", file=sys.stderr)
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("matplotlib") is None:
        raise EnvironmentProblem(
            "the report's plots need matplotlib: pip install 'specdash[report]'"
        )
    from specdash.trace.report import render_report

    output = None if args.output == "-" else _output(args, ".html")
    header, events, warnings = _read(args.trace)
    page = render_report(header, events, warnings, title=Path(args.trace).name)
    if output is None:  # `-o -`: stdout, as `export` takes it
        write_stdout(lambda out: out.write(page))
        return EXIT_OK
    with output.replace() as f:
        f.write(page)
    print(f"wrote {output.path}", file=sys.stderr)
    return EXIT_OK


def _max_new_tokens(header: SessionStart) -> int | None:
    """The session's limit on a prompt's tokens, where its header says (as a whole number)."""
    value = header.config.get("max_new_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_diff(args: argparse.Namespace) -> int:
    from specdash.trace.diff import diff_prompts, format_diff, label, verdict

    header_a, events_a, warnings_a = read_trace(args.a)
    header_b, events_b, warnings_b = read_trace(args.b)
    for w in warnings_a + warnings_b:
        print(f"specdash: warning: {w}", file=sys.stderr)
    diffs = diff_prompts(events_a, events_b, (_max_new_tokens(header_a), _max_new_tokens(header_b)))
    differing = sum(d.index is not None for d in diffs)
    incomplete = sum(bool(d.incomplete) for d in diffs)
    cut = f", {incomplete} incomplete (a recording stops mid-prompt)" if incomplete else ""
    print_stdout(
        *map(format_diff, diffs),
        f"summary: {differing} of {len(diffs)} prompts differ{cut}; "
        f"A = {label(args.a, header_a)}, B = {label(args.b, header_b)}: {verdict(diffs)}",
    )
    if differing:
        return EXIT_DIVERGED
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def run_replay(args: argparse.Namespace) -> int:
    header, events, warnings = _read(args.trace)
    from specdash.trace.replay import TraceReplay
    from specdash.ui.replay_app import ReplayApp

    replay = TraceReplay(header, events, speed=args.speed)
    # a replay's exit code is its own: a recorded engine error is no error of this run
    if ReplayApp(replay, name=Path(args.trace).name, warnings=warnings).run() == EXIT_INTERRUPTED:
        print("specdash: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK
