"""What a session is asked to do: one validated object shared by CLI, dashboard and trace header.

`specdash.cli.session_args.settings_from_args` builds it from the command line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from specdash.registry import drafters, engines

MAX_K = 16
MAX_BATCH = 4096
"""The most prompts a session decodes together: each one holds state slots (twice, with the
shadow), so a mistyped `--batch` is refused before anything is allocated."""
VerifyMode = Literal["exact", "fast"]
"""How a verify step computes its rows: as decode does (`exact`), or in one batched pass."""


def _one_of(names: Sequence[str]) -> AfterValidator:
    """A name of a registry (`specdash.registry`), or a validation error naming them."""

    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"{value!r} is not one of {', '.join(names)}")
        return value

    return AfterValidator(check)


class SessionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Annotated[str, _one_of(engines.NAMES)] = "native"
    model: Path | None = None
    """Target checkpoint directory (HF format). None: the embedded default, or `preset`."""
    draft: Path | None = None
    """Draft checkpoint directory for `drafter="model"`. None: the embedded default draft."""
    preset: str | None = None
    """Random weights of a named shape (e.g. `qwen3.5-27b-shape`) instead of a checkpoint."""
    drafter: Annotated[str, _one_of(drafters.NAMES)] = "model"
    k: int = Field(default=4, ge=1, le=MAX_K)
    speculation: bool = True
    verify_mode: VerifyMode = "exact"
    gemm_backend: str = "auto"
    batch: int = Field(default=1, ge=1, le=MAX_BATCH)
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
