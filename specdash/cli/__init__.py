"""`specdash` command line. Each subcommand lives in its own module and is imported lazily,
so `specdash run --headless` never pays for Textual and `specdash patches check` never
pays for torch."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from specdash.errors import EXIT_INTERRUPTED, EXIT_USAGE, FlagError, SpecdashError
from specdash.registry import algorithms, drafters, engines, gemm, help_lines
from specdash.runs.sglang.args import SGLangOptions
from specdash.runs.sglang.patches import patch_set
from specdash.settings import MAX_K

DESCRIPTION = """\
Plain `specdash` opens the dashboard: the embedded tiny target + draft pair decodes the
shipped 24-prompt set on the CPU, speculative and a plain greedy shadow side by side,
checked bit for bit (the session flags below apply to it).

  specdash run --headless        the same session, a summary instead of the dashboard
  specdash audit                 exactness matrix: k x drafter x batch x verify mode
  specdash COMMAND --help        the flags of one command
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help lines end with the default, where there is one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and default not in (None, False, [], argparse.SUPPRESS)
            and "%(default)" not in text
        ):
            text += " (default: %(default)s)"
        return text


def flag_error(prog: str, message: str) -> None:
    """A flag error as every command reports it: one line, then the hint to `--help`."""
    sys.stderr.write(f"specdash: error: {message}\nhint: `{prog} --help` lists every flag\n")


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in low..high (no upper bound when None), said in the
    flag's own words when it is not."""
    bounds = f"{low}..{high}" if high is not None else f"{low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range ({bounds})")
        return value

    return parse


def above_zero(text: str) -> float:
    """An argparse type: a finite number above 0 (a playback speed; an infinite one would
    have no pace to keep)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < math.inf:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} is out of range (a finite number above 0)")
    return value


class _Parser(argparse.ArgumentParser):
    """A usage error is one line and a hint, not the whole usage block."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        flag_error(self.prog, message)
        sys.exit(EXIT_USAGE)


def _add_session_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=engines.NAMES,
        default="native",
        help=f"the in-process engine; {help_lines(engines.ENGINES)}",
    )
    p.add_argument(
        "--model", metavar="DIR", help="target checkpoint (HF format); default: the embedded one"
    )
    p.add_argument(
        "--draft",
        metavar="DIR",
        help="draft checkpoint, same tokenizer (--drafter model); default: the embedded one",
    )
    p.add_argument(
        "--preset",
        metavar="NAME",
        help="random weights of a named shape: qwen3.5-27b-shape, or qwen3.5-27b-shape-fp8 "
        "(block-FP8, for CUDA)",
    )
    p.add_argument(
        "--drafter",
        choices=drafters.NAMES,
        default="model",
        help=help_lines(drafters.DRAFTERS),
    )
    p.add_argument(
        "-k",
        type=whole_number(1, MAX_K),
        default=4,
        help=f"draft tokens per verify step, 1..{MAX_K}",
    )
    p.add_argument(
        "--verify",
        choices=["exact", "fast"],
        default="exact",
        help="exact: every verify row computed as decode computes it (bit-exact); "
        "fast: one batched verify pass, divergences reported",
    )
    p.add_argument(
        "--gemm-backend",
        choices=gemm.NAMES,
        default="auto",
        help=f"GEMM implementation; {help_lines(gemm.GEMM_BACKENDS)}",
    )
    p.add_argument(
        "--batch",
        type=whole_number(1),
        default=1,
        metavar="N",
        help="N prompts decoded together, one forward a step (exact mode: the same bits at "
        "any N); the audit's batch axis",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help='JSONL, one {"prompt": ...} per line; default: the shipped 24 prompts',
    )
    p.add_argument(
        "--max-new-tokens",
        type=whole_number(1),
        default=64,
        metavar="N",
        help="tokens generated per prompt",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="weights and activations; default: float32 on the CPU, bfloat16 on CUDA",
    )
    p.add_argument("--no-shadow", action="store_true", help="skip the shadow decode (no check)")
    p.add_argument("--no-spec", action="store_true", help="plain greedy decode only")
    p.add_argument("--trace", metavar="PATH", help="record the session as a JSONL trace")
    p.add_argument(
        "--overwrite-trace",
        "--overwrite",
        action="store_true",
        help="replace an existing --trace file (otherwise it is refused, exit 2); never an input",
    )
    sgl = p.add_argument_group("--engine sglang")
    sgl.add_argument(
        "--speculative-algorithm",
        choices=algorithms.NAMES,
        help=f"SGLang's speculative algorithm (default: {SGLangOptions.speculative_algorithm}); "
        f"{help_lines(algorithms.ALGORITHMS)}",
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
        help="shadow as a second engine (memory split) or after the spec run "
        f"(default: {SGLangOptions.shadow_mode})",
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
        choices=[p.flag for p in patch_set.optional_patches()],
        help="leave one patch off in both engines, to see which fix matters (repeatable)",
    )


def _add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing OUT (otherwise it is refused, exit 2); never the trace read",
    )


def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="a trace as Perfetto (Chrome Trace Event) JSON or CSV")
    export.add_argument("trace", metavar="TRACE", help="a JSONL trace (run --trace, or e)")
    export.add_argument(
        "--format",
        choices=["perfetto", "csv"],
        default="perfetto",
        help="Perfetto JSON for ui.perfetto.dev, or CSV with one row per verify step",
    )
    export.add_argument(
        "-o", "--output", metavar="OUT", help="output file; default: next to TRACE; - for stdout"
    )
    _add_overwrite(export)

    replay = sub.add_parser("replay", help="the dashboard on a recorded trace")
    replay.add_argument("trace", metavar="TRACE", help="a JSONL trace")
    replay.add_argument(
        "--speed", type=above_zero, default=1.0, help="playback speed (x real time)"
    )

    report = sub.add_parser("report", help="a self-contained HTML report of a trace")
    report.add_argument("trace", metavar="TRACE", help="a JSONL trace")
    report.add_argument(
        "-o", "--output", metavar="OUT", help="output file; default: TRACE with .html; - for stdout"
    )
    _add_overwrite(report)

    report.add_argument(
        "--compare",
        metavar="B",
        help="add `compare TRACE B`: B (a quant, another engine) against TRACE as reference",
    )
    _add_compare_flags(report)

    diff = sub.add_parser("diff", help="first differing token per prompt of two traces")
    diff.add_argument("a", metavar="A", help="a JSONL trace")
    diff.add_argument("b", metavar="B", help="another JSONL trace of the same prompts")

    compare = sub.add_parser(
        "compare",
        help="a quant (B) against its reference (A): flips, margins, teacher-forced agreement",
    )
    compare.add_argument("a", metavar="A", help="the reference's JSONL trace")
    compare.add_argument("b", metavar="B", help="a trace of the same prompts, another setting")
    compare.add_argument("--json", action="store_true", help="print one JSON object (see README)")
    _add_compare_flags(compare)


def _add_compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--top-k",
        type=whole_number(2),
        default=64,
        metavar="N",
        help="A's top-N tokens per position, the support of KL(A || B)",
    )
    p.add_argument(
        "--trace-only",
        action="store_true",
        help="no teacher-forced re-scoring (it loads both settings' models): flips only",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specdash",
        usage="specdash [session flags]       (the dashboard)\n       specdash COMMAND [flags]",
        description=DESCRIPTION,
    )
    _add_session_flags(parser)  # `specdash [flags]` with no subcommand opens the dashboard
    sub = parser.add_subparsers(
        dest="command", title="commands", metavar="COMMAND", prog="specdash"
    )

    run = sub.add_parser(
        "run",
        help="decode a prompt set (use --headless for no dashboard)",
        usage="specdash run [--headless] [session flags] [--json] [--fail-on-divergence]",
    )
    _add_session_flags(run)
    run.add_argument("--headless", action="store_true", help="no dashboard: print a summary")
    run.add_argument(
        "--json", action="store_true", help="print one JSON summary object (see README)"
    )
    run.add_argument("--fail-on-divergence", action="store_true", help="exit 1 on divergence")

    audit = sub.add_parser(
        "audit",
        help="exactness matrix: k x drafter x batch x verify mode",
        usage="specdash audit [--json] [--ks K,K,...] [--num-prompts N] [session flags]",
        description="-k, --drafter, --batch and --verify narrow their axis of the matrix to the "
        "value given; --no-shadow, --no-spec, --trace and --engine sglang are refused.",
    )
    _add_session_flags(audit)
    # given, -k / --drafter / --batch / --verify narrow their axis of the matrix to that value
    audit.set_defaults(k=None, drafter=None, batch=None, verify=None)
    audit.add_argument("--json", action="store_true", help="print the cells as one JSON object")
    audit.add_argument("--ks", metavar="K,K,...", help="the k values (default: 1,3,5,9)")
    audit.add_argument(
        "--num-prompts",
        type=whole_number(1),
        default=8,
        metavar="N",
        help="prompts per cell, spread over the set's lengths (the shortest and the longest)",
    )
    _add_trace_commands(sub)
    patches = sub.add_parser("patches", help="SGLang engine patches")
    patches.add_subparsers(dest="patches_command", required=True, metavar="SUBCOMMAND").add_parser(
        "check", help="each patch target in the installed SGLang: OK / changed / missing"
    )
    return parser


COMMANDS: dict[str | None, tuple[str, str]] = {
    None: ("specdash.cli.dashboard", "run_dashboard"),
    "run": ("specdash.cli.dashboard", "run_dashboard"),  # `run --headless`: see `_command`
    "audit": ("specdash.cli.audit", "run_audit"),
    "export": ("specdash.cli.traces", "run_export"),
    "replay": ("specdash.cli.traces", "run_replay"),
    "report": ("specdash.cli.traces", "run_report"),
    "diff": ("specdash.cli.traces", "run_diff"),
    "compare": ("specdash.cli.traces", "run_compare"),
    "patches": ("specdash.runs.sglang.patches.check", "run_check"),
}
"""Subcommand -> (module, function taking the parsed args); imported only when run."""


def _command(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    if args.command == "run" and args.headless:
        module, name = "specdash.cli.headless", "run_headless"
    else:
        module, name = COMMANDS[args.command]
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    from specdash.cli.signals import Terminated, on_termination

    args = build_parser().parse_args(argv)
    try:
        with on_termination():
            return _command(args)(args)
    except Terminated as e:  # SIGTERM, SIGHUP: as Ctrl-C, with the signal's own code
        print(e.line, file=sys.stderr)
        return e.exit_code
    except SpecdashError as e:
        from specdash.cli.session_args import describe

        if isinstance(e, FlagError):
            flag_error(
                " ".join(["specdash", *([args.command] if args.command else [])]), describe(e)
            )
        else:
            print(f"specdash: error: {describe(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("specdash: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
