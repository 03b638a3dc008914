"""The session flags as the objects a session runs on: `SessionSettings` and, for `--engine
sglang`, `SGLangOptions`. Headless, the dashboard and the audit all read their flags here, so
they run the same session from the same command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from specdash.errors import FlagError, SpecdashError
from specdash.output_files import Input, refuse_inputs
from specdash.prompts import default_prompts_path
from specdash.registry import drafters
from specdash.runs.sglang.args import SGLangOptions, parse_engine_arg
from specdash.settings import SessionSettings
from specdash.trace.jsonl import TraceWriter

FLAGS = {
    "engine": "--engine",
    "model": "--model",
    "draft": "--draft",
    "preset": "--preset",
    "drafter": "--drafter",
    "k": "-k",
    "speculation": "--no-spec",
    "verify_mode": "--verify",
    "gemm_backend": "--gemm-backend",
    "batch": "--batch",
    "prompts": "--prompts",
    "max_new_tokens": "--max-new-tokens",
    "device": "--device",
    "dtype": "--dtype",
    "shadow": "--no-shadow",
    "trace": "--trace",
    "overwrite_trace": "--overwrite-trace",
    "speculative_algorithm": "--speculative-algorithm",
    "engine_args": "--sglang-arg",
    "shadow_mode": "--sglang-shadow",
    "force_patches": "--force-patches",
    "unpatch": "--sglang-unpatch",
}
"""The flag that sets each field of `SessionSettings` and `SGLangOptions`."""


def describe(error: SpecdashError) -> str:
    """An error's line as the command line says it: the flag of the setting it is about first."""
    if error.setting is None:
        return str(error)
    return f"{FLAGS.get(error.setting, error.setting)}: {error}"


def _path(value: str | None, setting: str) -> Path | None:
    """A path flag's value; an empty one is refused, which `Path` would read as "."."""
    if value == "":
        raise FlagError("expected a path, got an empty string", setting=setting)
    return None if value is None else Path(value)


SGLANG_FLAGS = {
    "speculative_algorithm": "--speculative-algorithm",
    "sglang_arg": "--sglang-arg",
    "sglang_shadow": "--sglang-shadow",
    "force_patches": "--force-patches",
    "sglang_unpatch": "--sglang-unpatch",
}
"""The `--engine sglang` group, by argparse name: each is None, empty or False unless given."""


def refuse_flags_without_effect(args: argparse.Namespace) -> None:
    """A flag the session would not use is refused rather than ignored: the person who gave
    it expects it to do something."""
    if args.overwrite_trace and args.trace is None:
        raise FlagError(
            "argument --overwrite/--overwrite-trace: only with --trace (it replaces an "
            "existing trace; without --trace nothing is recorded)"
        )
    if args.preset is not None and args.model is not None:
        raise FlagError(
            "argument --model: give --model or --preset, not both (a preset is the target)"
        )
    if args.engine != "sglang":
        given = [flag for name, flag in SGLANG_FLAGS.items() if getattr(args, name)]
        if given:
            raise FlagError(
                f"argument {given[0]}: only with --engine sglang (the {args.engine} engine "
                "does not read it)"
            )


def settings_from_args(args: argparse.Namespace) -> SessionSettings:
    """Settings from the CLI's session flags; a bad value or combination is a `FlagError`."""
    refuse_flags_without_effect(args)
    drafts_alone = not drafters.uses_draft_model(args.drafter)
    if args.engine == "native" and drafts_alone and args.draft is not None:
        raise FlagError(
            f"{args.draft} is not used with --drafter ngram (it drafts from the prompt); "
            "leave out --draft, or draft with it: --drafter model",
            setting="draft",
        )
    try:
        return SessionSettings(
            engine=args.engine,
            model=_path(args.model, "model"),
            draft=_path(args.draft, "draft"),
            preset=args.preset,
            drafter=args.drafter,
            k=args.k,
            speculation=not args.no_spec,
            verify_mode=args.verify,
            gemm_backend=args.gemm_backend,
            batch=args.batch,
            prompts=_path(args.prompts, "prompts"),
            max_new_tokens=args.max_new_tokens,
            device=args.device,
            dtype=args.dtype,
            shadow=not args.no_shadow,
            trace=_path(args.trace, "trace"),
            overwrite_trace=args.overwrite_trace,
        )
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise FlagError(f"{err['msg']}", setting=where) from None


def session_inputs(settings: SessionSettings) -> list[Input]:
    """Every file a session reads, which nothing it writes may replace: the prompt file, the
    checkpoints, and the data shipped in the package (the embedded pair, the default
    prompts)."""
    inputs: list[Input] = [(default_prompts_path().parent, "specdash's shipped data")]
    for path, role in (
        (settings.prompts, "the prompt file"),
        (settings.model, "the model checkpoint"),
        (settings.draft, "the draft checkpoint"),
    ):
        if path is not None:
            inputs.append((path, role))
    return inputs


def open_trace(settings: SessionSettings) -> TraceWriter | None:
    """The `--trace` recording, opened before the session loads anything: refused when it
    would replace an input or (without --overwrite-trace) any existing file, or another
    specdash is writing it (`specdash.output_files`)."""
    if settings.trace is None:
        return None
    inputs = session_inputs(settings)
    if settings.engine == "sglang":  # SGLang's logs are appended beside the trace
        from specdash.runs.sglang.process import log_file_beside, shadow_log

        log = log_file_beside(settings)
        for path in (log, shadow_log(log)):
            refuse_inputs(path, "SGLang log", inputs)
    return TraceWriter(settings.trace, overwrite=settings.overwrite_trace, inputs=inputs)


def sglang_options_from_args(args: argparse.Namespace) -> SGLangOptions:
    """The `--engine sglang` flag group (a flag not given: `SGLangOptions`' default)."""
    return SGLangOptions(
        speculative_algorithm=args.speculative_algorithm or SGLangOptions.speculative_algorithm,
        engine_args=dict(parse_engine_arg(a) for a in args.sglang_arg),
        shadow_mode=args.sglang_shadow or SGLangOptions.shadow_mode,
        force_patches=args.force_patches,
        unpatch=tuple(args.sglang_unpatch),
    )


def session_options(settings: SessionSettings, args: argparse.Namespace) -> SGLangOptions | None:
    """What a session started from the command line passes to `run_engine` as
    `options`: the SGLang flags for `--engine sglang`, else None. The headless run and
    the dashboard both call this, so both run SGLang with the same options."""
    return sglang_options_from_args(args) if settings.engine == "sglang" else None
