"""`specdash audit`: the exactness matrix, k x drafter x batch x verify mode.

Exact mode must come out all-exact (exit 1 otherwise); fast mode is reported as found.
Weights are loaded once per drafter and shared by its cells. `-k`, `--drafter`, `--batch` and
`--verify` narrow their axis to the one value given; the flags the audit cannot honour
(`--no-shadow`, `--no-spec`, `--trace`, `--engine sglang`) are refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from specdash.cli.progress import AuditProgress, SessionProgress, make_progress
from specdash.cli.session_args import settings_from_args
from specdash.cli.stdout import print_stdout
from specdash.engine.loader import load_models
from specdash.errors import EXIT_DIVERGED, EXIT_OK, FlagError
from specdash.events import Divergence, Event
from specdash.prompts import Prompt, load_prompts
from specdash.registry.drafters import NAMES as DRAFTERS
from specdash.runs.native import native_session
from specdash.settings import MAX_K, SessionSettings

BATCHES = (1, 8)
VERIFY_MODES = ("exact", "fast")
DEFAULT_KS = "1,3,5,9"


def spread_by_length(prompts: list[Prompt], n: int) -> list[Prompt]:
    """`n` prompts spread evenly over the set's lengths (in characters), the shortest and the
    longest included, in the set's order: long prompts move GEMM M, attention splits and
    the KV a row reads, which short ones never exercise."""
    if n >= len(prompts):
        return prompts
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i].text))
    last = len(prompts) - 1
    picked = {by_length[round(j * last / max(n - 1, 1))] for j in range(n)}
    return [p for i, p in enumerate(prompts) if i in picked]


def _write(prompts: list[Prompt], workdir: Path) -> Path:
    path = workdir / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.text, "name": p.name}) + "\n" for p in prompts))
    return path


@dataclasses.dataclass(frozen=True, slots=True)
class Matrix:
    """The audit's axes: every cell is one of each."""

    ks: tuple[int, ...]
    drafters: tuple[str, ...] = DRAFTERS
    batches: tuple[int, ...] = BATCHES
    verify_modes: tuple[str, ...] = VERIFY_MODES

    @property
    def cells(self) -> int:
        return len(self.ks) * len(self.drafters) * len(self.batches) * len(self.verify_modes)


REFUSED = {
    "no_shadow": ("--no-shadow", "every cell is checked against the shadow"),
    "no_spec": ("--no-spec", "every cell speculates (that is what it audits)"),
    "trace": ("--trace", "it records no trace (`run --headless --trace` records a session)"),
}
"""Session flags the audit cannot honour: (flag, why), by argparse name."""


def matrix_from_args(args: argparse.Namespace) -> Matrix:
    """The axes the flags ask for: `-k`, `--drafter`, `--batch`, `--verify` each narrow one
    to the value given (the audit parser leaves them None when not given)."""
    for name, (flag, why) in REFUSED.items():
        if getattr(args, name):
            raise FlagError(f"argument {flag}: not an audit flag: {why}")
    if args.engine != "native":
        raise FlagError("argument --engine: the audit runs the native engine only")
    if args.k is not None and args.ks is not None:
        raise FlagError("argument -k: give -k (one k) or --ks (several), not both")
    try:
        ks = [int(k) for k in (args.ks or DEFAULT_KS).split(",")]
    except ValueError:
        raise FlagError(
            f"argument --ks: expected comma-separated whole numbers, got {args.ks!r}"
        ) from None
    bad = [k for k in ks if not 1 <= k <= MAX_K]
    if bad:
        raise FlagError(f"argument --ks: {bad[0]} is out of range (1..{MAX_K})")
    return Matrix(
        ks=tuple(ks) if args.k is None else (args.k,),
        drafters=DRAFTERS if args.drafter is None else (args.drafter,),
        batches=BATCHES if args.batch is None else (args.batch,),
        verify_modes=VERIFY_MODES if args.verify is None else (args.verify,),
    )


def audit_cells(
    base: SessionSettings,
    matrix: Matrix,
    chosen: list[Prompt],
    progress: AuditProgress | None = None,
) -> list[dict[str, Any]]:
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = _write(chosen, Path(tmp))
        for drafter in matrix.drafters:
            if progress is not None:
                progress.loading(drafter)
            loaded = load_models(base.model_copy(update={"drafter": drafter}))
            axes = (matrix.ks, matrix.batches, matrix.verify_modes)
            for k, batch, verify in itertools.product(*axes):
                settings = base.model_copy(
                    update={
                        "drafter": drafter,
                        "k": k,
                        "batch": batch,
                        "verify_mode": verify,
                        "prompts": prompts,
                        "shadow": True,
                        "root_cause": False,
                    }
                )
                divergences: list[Divergence] = []
                shown = (
                    progress.start_cell(f"{drafter} k={k} batch={batch} {verify}")
                    if progress is not None
                    else None
                )

                def sink(
                    e: Event,
                    out: list[Divergence] = divergences,
                    shown: SessionProgress | None = shown,
                ) -> None:
                    if isinstance(e, Divergence):
                        out.append(e)
                    if shown is not None:
                        shown(e)

                summary = native_session(settings, sink, loaded=loaded).run()
                if progress is not None:
                    progress.end_cell()
                cells.append(
                    {
                        "k": k,
                        "drafter": drafter,
                        "batch": batch,
                        "verify": verify,
                        "prompts": summary.prompts,
                        "exact_prompts": summary.exact_prompts,
                        "tokens_per_s": round(summary.tokens_per_s, 2),
                        "mean_accepted_length": round(summary.mean_accepted_length, 3),
                        "acceptance_rate": round(summary.acceptance_rate, 4),
                        "token_divergences": sum(d.what == "token" for d in divergences),
                        "logprob_divergences": sum(d.what == "logprob" for d in divergences),
                    }
                )
    return cells


def run_audit(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    first = {"k": matrix.ks[0], "drafter": matrix.drafters[0], "batch": matrix.batches[0],
             "verify": matrix.verify_modes[0]}  # fmt: skip
    base = settings_from_args(argparse.Namespace(**(vars(args) | first)))  # each cell sets its own
    chosen = spread_by_length(load_prompts(base.prompts), args.num_prompts)
    with make_progress() as shown:
        progress = AuditProgress(shown, matrix.cells, len(chosen), base.max_new_tokens)
        cells = audit_cells(base, matrix, chosen, progress)
    failed = [c for c in cells if c["verify"] == "exact" and c["exact_prompts"] != c["prompts"]]
    names = [p.name for p in chosen]
    if args.json:
        print_stdout(
            json.dumps({"prompts": names, "cells": cells, "exact_mode_all_exact": not failed})
        )
    else:
        cols = list(cells[0])
        print_stdout(
            "prompts: " + ", ".join(names),
            "  ".join(f"{c:>12}" for c in cols),
            *("  ".join(f"{cell[c]!s:>12}" for c in cols) for cell in cells),
            "exact mode: " + ("all exact" if not failed else f"{len(failed)} cell(s) NOT exact"),
        )
    return EXIT_DIVERGED if failed else EXIT_OK
