"""The default prompt set: spans of held-out standard-library files, never trained on.

Code prompts end after a line of code; prose-like prompts end inside a docstring or a
comment block, so the model continues English rather than Python. Code-page tables
(encodings/) are left out: they are so repetitive they would flatter acceptance. Three lengths cover
short interactive prompts, ~2k-token and ~4.5k-token contexts (long prefills stay quick
on a CPU and leave room for 256 new tokens under the 8192-position limit).
"""

from __future__ import annotations

import hashlib

from tokenizers import Tokenizer

from training.corpus import SourceFile

LENGTHS = {"short": 120, "2k": 2000, "long": 4700}
"""Target prompt length in tokens; a prompt ends at the first suitable line past it."""


def _line_kinds(lines: list[str]) -> list[str]:
    """'prose' for docstring and comment lines, 'code' for other non-blank lines, '' for blank."""
    kinds, in_doc = [], False
    for line in lines:
        s = line.strip()
        quotes = s.count('"""') + s.count("'''")
        if in_doc or s.startswith("#") or (quotes == 1 and not s.endswith(('"""', "'''"))):
            kind = "prose" if s else ""
        else:
            kind = "code" if s else ""
        if quotes % 2 == 1:
            in_doc = not in_doc
        kinds.append(kind)
    return kinds


def _span(
    f: SourceFile, tok: Tokenizer, target: int, kind: str, salt: int
) -> tuple[str, int] | None:
    """A line-aligned span of about `target` tokens ending on a `kind` line, or None."""
    lines = f.text.splitlines(keepends=True)
    counts = [len(e.ids) for e in tok.encode_batch(lines)]
    total = sum(counts)
    if total < target * 1.15:
        return None
    kinds = _line_kinds(lines)
    # start late enough to vary between prompts, early enough to leave target tokens
    room, acc, last_start = total - int(target * 1.15), 0, 0
    for i, c in enumerate(counts):
        if acc > room:
            break
        last_start, acc = i, acc + c
    start = salt % (last_start + 1)
    while start > 0 and lines[start - 1].strip():  # begin after a blank line
        start -= 1
    acc = 0
    for i in range(start, len(lines)):
        acc += counts[i]
        nxt = kinds[i + 1] if i + 1 < len(lines) else ""
        if acc > target * 1.5:
            return None
        if acc >= target and kinds[i] == kind and (kind == "code" or nxt == "prose"):
            return "".join(lines[start : i + 1]), start + 1
    return None


def heldout_prompts(files: list[SourceFile], tok: Tokenizer, count: int) -> list[dict]:
    """`count` prompts spread evenly over lengths and {code, prose}, from distinct spans."""
    slots = [(length, kind) for length in LENGTHS for kind in ("code", "prose")]
    per_slot = -(-count // len(slots))
    files = [f for f in files if not f.path.startswith("encodings/")]  # code-page tables
    prompts: list[dict] = []
    for length, kind in slots:
        made = 0
        for f in sorted(
            files, key=lambda f: hashlib.sha256((f.path + kind + length).encode()).digest()
        ):
            if made == per_slot or len(prompts) == count:
                break
            salt = int(hashlib.sha256(f.path.encode()).hexdigest()[:8], 16)
            span = _span(f, tok, LENGTHS[length], kind, salt)
            if span is None:
                continue
            text, line = span
            module = f.path.removesuffix(".py").replace("/", ".")
            prompts.append(
                {
                    "prompt": text,
                    "name": f"{kind}-{length}-{module}-L{line}",
                    "length": length,
                    "kind": kind,
                    "source": f"{f.path}:{line}",
                    "tokens": len(tok.encode(text).ids),
                }
            )
            made += 1
    return prompts
