"""`specdash` command line. Each subcommand lives in its own module and is imported lazily,
so `specdash run --headless` never pays for Textual and `specdash patches check` never
pays for torch."""

from __future__ import annotations

import argparse
import sys

from specdash.errors import EXIT_INTERRUPTED, SpecdashError


def _add_session_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["native", "sglang"], default="native")
    p.add_argument("--model", metavar="DIR", help="target checkpoint (HF format directory)")
    p.add_argument("--draft", metavar="DIR", help="draft checkpoint (same tokenizer)")
    p.add_argument("--preset", help="random weights of a named shape, e.g. qwen3.5-27b-shape")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model")
    p.add_argument("-k", type=int, default=4, help="draft tokens per verify step (1..16)")
    p.add_argument("--verify", choices=["exact", "fast"], default="exact")
    p.add_argument("--gemm-backend", default="auto")
    p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    p.add_argument("--prompts", metavar="FILE", help='JSONL, one {"prompt": ...} per line')
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    p.add_argument("--no-shadow", action="store_true", help="skip the shadow decode")
    p.add_argument("--no-spec", action="store_true", help="plain greedy decode only")
    p.add_argument("--trace", metavar="PATH", help="record a JSONL session trace")
    sgl = p.add_argument_group("--engine sglang")
    sgl.add_argument(
        "--speculative-algorithm",
        choices=["NEXTN", "EAGLE3", "DFLASH", "STANDALONE", "NGRAM"],
        default="NEXTN",
    )
    sgl.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any sglang.Engine argument, e.g. mem_fraction_static=0.4 (repeatable)",
    )
    sgl.add_argument(
        "--sglang-shadow",
        choices=["split", "sequential"],
        default="split",
        help="shadow as a second engine (memory split) or after the spec run",
    )
    sgl.add_argument(
        "--force-patches",
        action="store_true",
        help="apply the engine patches on an SGLang version they were not checked on",
    )
    sgl.add_argument(
        "--sglang-unpatch",
        action="append",
        default=[],
        choices=["gdn", "attention", "gemm", "telemetry"],
        help="leave one patch off in both engines, to see which fix matters (repeatable)",
    )


def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="a trace as Perfetto (Chrome Trace Event) JSON or CSV")
    export.add_argument("trace", metavar="TRACE")
    export.add_argument("--format", choices=["perfetto", "csv"], default="perfetto")
    export.add_argument("-o", "--output", metavar="OUT", help="default: next to TRACE; - stdout")

    replay = sub.add_parser("replay", help="the dashboard on a recorded trace")
    replay.add_argument("trace", metavar="TRACE")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (x real time)")

    report = sub.add_parser("report", help="a self-contained HTML report of a trace")
    report.add_argument("trace", metavar="TRACE")
    report.add_argument("-o", "--output", metavar="OUT", help="default: TRACE with .html")

    diff = sub.add_parser("diff", help="first differing token per prompt of two traces")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdash", description=__doc__)
    _add_session_flags(parser)  # `specdash [flags]` with no subcommand opens the dashboard
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="decode a prompt set (use --headless for no dashboard)")
    _add_session_flags(run)
    run.add_argument("--headless", action="store_true", help="no dashboard: print a summary")
    run.add_argument("--json", action="store_true", help="print one JSON summary object")
    run.add_argument("--fail-on-divergence", action="store_true", help="exit 1 on divergence")

    audit = sub.add_parser("audit", help="exactness matrix: k x drafter x batch x verify mode")
    _add_session_flags(audit)
    audit.add_argument("--json", action="store_true")
    audit.add_argument("--ks", default="1,3,5,9", help="comma-separated k values")
    audit.add_argument("--num-prompts", type=int, default=8, help="prompts per cell")
    _add_trace_commands(sub)
    patches = sub.add_parser("patches", help="SGLang engine patches")
    patches.add_subparsers(dest="patches_command", required=True).add_parser(
        "check", help="each patch target in the installed SGLang: OK / changed / missing"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run" and args.headless:
            from specdash.cli.headless import run_headless

            return run_headless(args)
        if args.command is None or args.command == "run":
            from specdash.ui.app import run_dashboard

            return run_dashboard(args)
        if args.command == "audit":
            from specdash.cli.audit import run_audit

            return run_audit(args)
        if args.command == "export":
            from specdash.trace.export import run_export

            return run_export(args)
        if args.command == "replay":
            from specdash.trace.replay import run_replay

            return run_replay(args)
        if args.command == "report":
            from specdash.trace.report import run_report

            return run_report(args)
        if args.command == "patches":
            from specdash.engine_patches.check import run_check

            return run_check(args)
        if args.command == "diff":
            from specdash.trace.diff import run_diff

            return run_diff(args)
        parser.print_help()
        return 0
    except SpecdashError as e:
        print(f"specdash: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("specdash: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
