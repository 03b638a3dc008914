"""`specdash run --headless`: decode the prompt set, print a summary table or one JSON object."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from contextlib import ExitStack

from specdash.cli.progress import SessionProgress, make_progress
from specdash.cli.session_args import open_trace, session_options, settings_from_args
from specdash.cli.stdout import print_stdout
from specdash.errors import EXIT_DIVERGED, EXIT_OK, FlagError
from specdash.events import Divergence, Event, SessionStart, Summary
from specdash.prompts import load_prompts
from specdash.runs.runner import run_engine
from specdash.stats import SessionStats
from specdash.trace.recorder import TraceRecorder


def _rate(value: float | None, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def format_summary(summary: Summary, divergences: list[Divergence]) -> str:
    s = summary
    speculated = s.verify_steps > 0 or not s.new_tokens
    if s.rate_includes_prefill:  # the engine times whole requests (SGLang): no decode-only time
        rate, basis = "t/s, {} requests", "requests"
        spec_parts, shadow_what = (
            "prefill + draft + verify",
            "the same prompts alone, no speculation",
        )
    else:
        rate, basis = "decode t/s, {}", "decode"
        spec_parts, shadow_what = "draft + verify + rollback", "the same tokens, no speculation"
    if not speculated:  # --no-spec: plain decode, nothing drafted, nothing accepted
        spec_parts = "plain greedy decode, no speculation"
    rows = [
        ("prompts", f"{s.prompts}"),
        ("exact prompts", s.exact_text),
        ("new tokens", f"{s.new_tokens}"),
        (
            rate.format("speculative" if speculated else "plain"),
            f"{s.tokens_per_s:.1f}  ({spec_parts})",
        ),
        (
            rate.format("shadow (plain greedy)"),
            f"{_rate(s.shadow_tokens_per_s)}  ({shadow_what})"
            if s.checked
            else "– (--no-shadow: no plain decode ran)",
        ),
        (f"speculative / shadow {basis}", f"{_rate(s.speedup, '.2f')}x" if s.speedup else "–"),
        (
            "wall t/s",
            f"{_rate(s.wall_tokens_per_s)}  (the whole session: prefill, "
            f"{'speculative' if speculated else 'plain'}"
            f"{' and shadow' if s.checked else ''} decode; loading excluded)",
        ),
        ("mean accepted length", f"{s.mean_accepted_length:.2f} tokens/step"),
        ("acceptance rate", f"{100 * s.acceptance_rate:.1f} %"),
        ("verify steps", f"{s.verify_steps}"),
        ("divergences", f"{s.divergences}"),
    ]
    if not speculated:
        rows = [r for r in rows if r[0] not in ("mean accepted length", "acceptance rate")]
        rows = [(f"plain / shadow {basis}", v) if r.startswith("speculative /") else (r, v)
                for r, v in rows]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    for d in divergences:
        cause = f"; root cause: {d.root_cause.detail}" if d.root_cause else ""
        if d.root_cause is not None and (origin := d.root_cause.origin_text(d.position)):
            cause += f" ({origin})"
        if d.shadow_margin is not None:
            cause += f"; {d.shadow_margin.text(flipped=d.what == 'token')}"
        lines.append(
            f"DIVERGED prompt {d.prompt_index} at generated token {d.position} ({d.what}): "
            f"spec {d.spec_token} ({d.spec_logprob!r}) vs shadow {d.shadow_token} "
            f"({d.shadow_logprob!r}){cause}"
        )
    return "\n".join(lines)


def _json_float(value: float) -> float | None:
    """JSON has no NaN (a logprob SGLang did not report): null, its hex beside it says "nan"."""
    return None if math.isnan(value) else value


def divergence_record(d: Divergence) -> dict[str, object]:
    """One divergence as `run --json` lists it: where, both tokens, both logprobs as floats and
    as exact hex (`float.hex`, what the dashboard's detail shows), the root cause."""
    return {
        "prompt": d.prompt_index,
        "token_index": d.position,
        "what": d.what,
        "step": d.step,
        "k": d.k,
        "verify_mode": d.verify_mode,
        "gemm_backend": d.gemm_backend,
        "spec_token": d.spec_token,
        "shadow_token": d.shadow_token,
        "spec_text": d.spec_text,
        "shadow_text": d.shadow_text,
        "spec_logprob": _json_float(d.spec_logprob),
        "spec_logprob_hex": d.spec_logprob.hex(),
        "shadow_logprob": _json_float(d.shadow_logprob),
        "shadow_logprob_hex": d.shadow_logprob.hex(),
        "root_cause": None if d.root_cause is None else d.root_cause.model_dump(),
        "shadow_margin": None if d.shadow_margin is None else d.shadow_margin.model_dump(),
        "prefix_cached": None if d.prefix_cached is None else list(d.prefix_cached),
    }


def summary_json(summary: Summary, divergences: list[Divergence]) -> str:
    """`run --json`: the summary's fields, its derived rates, and every divergence listed
    (`divergences`) beside their count (`divergence_count`)."""
    record = summary.model_dump(exclude={"kind", "t_ns", "divergences"})
    record |= {
        "speedup": summary.speedup,
        "wall_tokens_per_s": summary.wall_tokens_per_s,
        "divergence_count": summary.divergences,
        "divergences": [divergence_record(d) for d in divergences],
    }
    return json.dumps(record)


def run_headless(args: argparse.Namespace) -> int:
    recorders: list[TraceRecorder] = []
    try:
        return _run_headless(args, recorders)
    except BaseException:  # Ctrl-C, or an error: the trace is closed by now, say what it holds
        for recorder in recorders:
            if recorder.stopped:
                print(f"specdash: warning: {recorder.stopped}", file=sys.stderr)
        raise


def _run_headless(args: argparse.Namespace, recorders: list[TraceRecorder]) -> int:
    settings = settings_from_args(args)
    if args.fail_on_divergence and not settings.shadow:
        raise FlagError(
            "argument --fail-on-divergence: nothing is checked with --no-shadow, so no "
            "divergence could fail the run; leave out one of the two"
        )
    # read once, before the load: a bad prompt file fails first, and a FIFO or a pipe has
    # nothing left for a second read
    prompts = load_prompts(settings.prompts)
    divergences: list[Divergence] = []
    recorder = None
    with ExitStack() as stack:
        progress = stack.enter_context(make_progress())
        so_far = SessionStats()  # what an interrupted run prints
        sinks: list[Callable[[Event], object]] = [
            SessionProgress(progress, len(prompts), settings.max_new_tokens),
            so_far.consume,
        ]
        sampler = None

        def sink(event: Event) -> None:
            if isinstance(event, Divergence):
                divergences.append(event)
            for s in sinks:
                s(event)
            if sampler is not None and isinstance(event, SessionStart):
                sampler.start()

        writer = open_trace(settings)
        if writer is not None:
            from specdash.runs.nvml_sampler import GpuSampler, device_index

            recorder = TraceRecorder(writer)
            recorders.append(recorder)
            stack.callback(recorder.close, "the session stopped early")
            sinks.append(recorder.consume)
            # a recorded session carries GPU samples (or the labelled "no GPU" state),
            # started once the header is written
            sampler = GpuSampler(sink, index=device_index(settings.device) or 0)
            stack.callback(sampler.stop)

        try:
            summary = run_engine(
                settings, sink, options=session_options(settings, args), prompts=prompts
            )
        except KeyboardInterrupt:  # Ctrl-C: the prompts done so far, then exit 130 (`main`)
            partial = so_far.summary()
            print_stdout(
                summary_json(partial, divergences)
                if args.json
                else "interrupted: the prompts done so far\n" + format_summary(partial, divergences)
            )
            raise
    print_stdout(
        summary_json(summary, divergences) if args.json else format_summary(summary, divergences)
    )
    if recorder is not None and recorder.stopped:
        # an I/O error (disk full) is an environment problem: the trace asked for is short
        level = "error" if recorder.failure else "warning"
        print(f"specdash: {level}: {recorder.stopped}", file=sys.stderr)
        if recorder.exit_code:
            return recorder.exit_code
    if args.fail_on_divergence and divergences:
        print(f"specdash: {len(divergences)} divergence(s)", file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK
