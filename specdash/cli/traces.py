"""The trace subcommands: `export`, `replay`, `report`, `diff` and `compare` over recorded traces.

Each reads its trace(s) with `read_trace`, prints the reader's warnings on stderr, and hands
the events to the module that does the work (`specdash.trace.*`, or the replay dashboard).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

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
from specdash.trace.diff import label
from specdash.trace.jsonl import open_trace, read_trace

if TYPE_CHECKING:
    from specdash.trace.compare import Comparison


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
    inputs = [(Path(args.trace), "the trace it reads")]
    if getattr(args, "compare", None):
        inputs.append((Path(args.compare), "the trace it compares"))
    return Output(
        path,
        what="output",
        inputs=inputs,
        overwrite=args.overwrite,
        flag="--overwrite",
    )


def run_export(args: argparse.Namespace) -> int:
    from specdash.trace.export import write_csv, write_perfetto

    suffix = ".perfetto.json" if args.format == "perfetto" else ".csv"
    output = None if args.output == "-" else _output(args, suffix)
    # each event is written as it is read: export holds one event, whatever the trace's size
    with open_trace(args.trace) as (header, events, warnings):

        def write(out: IO[str]) -> None:
            (write_perfetto if args.format == "perfetto" else write_csv)(header, events, out)

        if output is None:
            write_stdout(write)
        else:
            with output.replace() as f:
                write(f)
    for w in warnings:
        print(f"specdash: warning: {w}", file=sys.stderr)
    if output is not None:
        print(f"wrote {output.path}", file=sys.stderr)
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("matplotlib") is None:
        raise EnvironmentProblem(
            "the report's plots need matplotlib: pip install 'specdash[report]'"
        )
    from specdash.trace.report import render_report

    output = None if args.output == "-" else _output(args, ".html")
    title = Path(args.trace).name
    if args.compare:  # the comparison reads both traces whole
        header, events, warnings = _read(args.trace)
        header_b, events_b, more = _read(args.compare)
        comparison = (
            _compare(args, (header, events), (header_b, events_b)),
            label(args.trace, header),
            label(args.compare, header_b),
        )
        page = render_report(header, events, [*warnings, *more], title, comparison)
    else:  # the page keeps only what it shows of each event as the trace is read
        with open_trace(args.trace) as (header, stream, warnings):
            page = render_report(header, stream, warnings, title)
        for w in warnings:
            print(f"specdash: warning: {w}", file=sys.stderr)
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
    from specdash.trace.diff import diff_prompts, format_diff, verdict

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


def _compare(
    args: argparse.Namespace,
    a: tuple[SessionStart, list[Event]],
    b: tuple[SessionStart, list[Event]],
) -> Comparison:
    """A's and B's comparison, B re-scored along A's path unless --trace-only; prompts that
    differ are refused before any model loads."""
    from specdash.trace.compare import TeacherForced, compare
    from specdash.trace.diff import diff_prompts

    diff_prompts(a[1], b[1])
    if args.trace_only:
        scores = TeacherForced(missing="not run (--trace-only)")
    else:
        from specdash.runs.teacher_forced import teacher_forced

        scores = teacher_forced((a[0], b[0]), a[1], args.top_k)
    return compare(a[1], b[1], scores)


def run_compare(args: argparse.Namespace) -> int:
    from specdash.trace.compare import comparison_record, format_comparison

    a, b = _read(args.a), _read(args.b)
    cmp = _compare(args, a[:2], b[:2])
    labels = label(args.a, a[0]), label(args.b, b[0])
    if args.json:
        print(json.dumps(comparison_record(cmp, *labels)))
    else:
        print("\n".join(format_comparison(cmp, *labels)))
    if cmp.determinism.failed:
        return EXIT_DIVERGED
    return EXIT_OK if cmp.determinism.checked else EXIT_INCOMPLETE


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
