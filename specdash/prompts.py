"""Prompt sets: JSONL, one {"prompt": ...} per line (extra keys such as "name" are kept)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdash.errors import UsageError


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    name: str


def default_prompts_path() -> Path:
    return Path(str(resources.files("specdash") / "data" / "prompts.jsonl"))


def load_prompts(path: Path | None) -> list[Prompt]:
    path = path or default_prompts_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: prompt file does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read prompt file ({e})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UsageError(f'{path}:{n}: expected an object with a "prompt" string')
        prompts.append(Prompt(obj["prompt"], str(obj.get("name", f"prompt-{len(prompts)}"))))
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts
