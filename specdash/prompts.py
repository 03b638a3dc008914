"""Prompt sets: JSONL, one {"prompt": ...} per line (extra keys such as "name" are kept)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdash import json_text
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
        # JSONL lines end at "\n" only: `splitlines` would also break inside a string at
        # U+2028, U+0085 and the like, which JSON writes raw
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        raise UsageError(f"{path}: prompt file does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read prompt file ({e})") from None
    prompts: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json_text.loads(line)
        except json_text.JsonTextError as e:
            raise UsageError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UsageError(f'{path}:{n}: expected an object with a "prompt" string')
        prompt = Prompt(obj["prompt"], str(obj.get("name", f"prompt-{len(prompts)}")))
        for key, value in (("prompt", prompt.text), ("name", prompt.name)):
            _check_text(value, f"{path}:{n}: {key}")
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def _check_text(text: str, where: str) -> None:
    """JSON's \\u escapes can spell a lone surrogate, which is no Unicode text: no tokenizer
    takes it and no terminal or UTF-8 file can show it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(
            f"{where} holds a lone surrogate ({ascii(text[e.start])} at character {e.start}), "
            "which is not Unicode text"
        ) from None
