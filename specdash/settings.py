"""What a session is asked to do: one validated object shared by CLI, dashboard and trace header."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdash.errors import UsageError

MAX_K = 16


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


class SessionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["native", "sglang"] = "native"
    model: Path | None = None
    """Target checkpoint directory (HF format). None: the embedded default, or `preset`."""
    draft: Path | None = None
    """Draft checkpoint directory for `drafter="model"`. None: the embedded default draft."""
    preset: str | None = None
    """Random weights of a named shape (e.g. `qwen3.5-27b-shape`) instead of a checkpoint."""
    drafter: Literal["model", "ngram"] = "model"
    k: int = Field(default=4, ge=1, le=MAX_K)
    speculation: bool = True
    verify: Literal["exact", "fast"] = "exact"
    gemm_backend: str = "auto"
    batch: int = Field(default=1, ge=1)
    prompts: Path | None = None
    """JSONL, one {"prompt": ...} per line. None: the shipped 24-prompt set."""
    max_new_tokens: int = Field(default=64, ge=1)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] | None = None
    shadow: bool = True
    root_cause: bool = True
    seed: int = 0
    trace: Path | None = None
    overwrite_trace: bool = False
    """Replace an existing `trace` file (otherwise an existing file is refused, exit 2)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SessionSettings:
        """Settings from the CLI's session flags; a bad value is a one-line `UsageError`."""
        try:
            return cls(
                engine=args.engine,
                model=_path(args.model),
                draft=_path(args.draft),
                preset=args.preset,
                drafter=args.drafter,
                k=args.k,
                speculation=not args.no_spec,
                verify=args.verify,
                gemm_backend=args.gemm_backend,
                batch=args.batch,
                prompts=_path(args.prompts),
                max_new_tokens=args.max_new_tokens,
                device=args.device,
                dtype=args.dtype,
                shadow=not args.no_shadow,
                trace=_path(args.trace),
                overwrite_trace=args.overwrite_trace,
            )
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise UsageError(f"{where}: {err['msg']}") from None
