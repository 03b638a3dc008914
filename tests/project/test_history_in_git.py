"""History lives in git, not in the tree: comments and docstrings say why a line is there,
never which issue or session it came from or on which date; benchmark output is named by what
it measures (plus card and date), and docs/PERF.md keeps what it cites: every results path the
docs give exists, and every file under benchmarks/results/ is cited.

Citations are read from the docs in order. A path with `results/` in it is resolved from the
repository (`results/...` means `benchmarks/results/...`); a shorter one (`2-decode-repeat/`,
`bench_run2.*`, `.../3-slot-pool/`, `...-h200-<date>/`) from the results folders cited just
before it, as a reader resolves it. `{a,b}` and `*` expand. A cited folder covers its files.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE_DIRS = ["specdash", "benchmarks", "tests", "training"]

HISTORY = re.compile(
    r"\bissues?\s+#?\d+|\bsessions?[\s-]*\d+|\b20\d\d-\d\d-\d\d\b"
    r"|\b(earlier|last|previous) session",
    re.IGNORECASE,
)
FOLDER = re.compile(r"^[a-z0-9]+(-[a-z0-9.]+)*-(cpu|h100|h200)-\d{4}-\d{2}-\d{2}$")
ARTIFACT = re.compile(r"^(\.\.\.?/?|…/)?[\w.{},*…-]+(/[\w.{},*…-]+)*/?$")


def code_files() -> list[Path]:
    return [
        p
        for d in CODE_DIRS
        for p in sorted((REPO / d).rglob("*"))
        if p.suffix in (".py", ".sh") and RESULTS not in p.parents
    ]


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment, and of every docstring (a string standing alone as a
    statement: module, class, function and attribute docstrings)."""
    src = path.read_text()
    if path.suffix == ".sh":
        return [(i, ln) for i, ln in enumerate(src.splitlines(), 1) if ln.lstrip().startswith("#")]
    found = [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(io.StringIO(src).readline)
        if t.type == tokenize.COMMENT
    ]
    found += [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    return found


def expand(pattern: str) -> list[str]:
    """`a/{b,c}.{json,txt}` -> the four paths."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [
        path
        for alt in m.group(1).split(",")
        for path in expand(pattern[: m.start()] + alt + pattern[m.end() :])
    ]


def existing(base: Path, token: str) -> list[Path]:
    """The files or folders `token` names under `base` (braces and `*` expanded)."""
    paths = []
    for t in expand(token.rstrip("/")):
        paths += sorted(base.glob(t)) if "*" in t else [base / t] if (base / t).exists() else []
    return paths


def code_spans(doc: Path) -> Iterator[str]:
    """The inline code of a Markdown file, in order (tables included; a span may wrap lines)."""
    stack = MarkdownIt("commonmark").enable("table").parse(doc.read_text())[::-1]
    while stack:
        token = stack.pop()
        if token.type == "code_inline":
            yield token.content
        stack += (token.children or [])[::-1]


def citations() -> tuple[set[Path], list[str]]:
    """(every cited file or folder under benchmarks/results, the full results paths that name
    nothing), reading the docs in order."""
    cited: set[Path] = set()
    missing: list[str] = []
    for doc in DOCS:
        recent: list[Path] = []  # the results folders cited last, newest first
        for span in code_spans(doc):
            for word in span.split():
                word = word.rstrip(".,;:)")
                if not re.search(r"[a-z0-9]", word, re.IGNORECASE):
                    continue
                if "results/" in word:
                    rel = word[word.index("results/") :]
                    found = existing(RESULTS.parent, rel)
                    if not found:
                        missing.append(f"{doc.name}: {word}")
                elif ARTIFACT.match(word) and recent:
                    found = resolve_short(word, recent)
                else:
                    continue
                found = [f for f in found if RESULTS in f.parents]  # not results/ itself
                cited.update(found)
                for f in found:
                    folder = f if f.is_dir() else f.parent
                    recent = [folder] + [r for r in recent if r != folder][:5]
    return cited, missing


def resolve_short(word: str, recent: list[Path]) -> list[Path]:
    """A path given relative to the results folders cited just before it."""
    for folder in recent:
        for base in (folder, folder.parent):
            if base == RESULTS.parent or RESULTS not in [base, *base.parents]:
                continue
            if word.startswith(("...-", "…-")):  # `...-h200-<date>/`: a sibling's name
                name = base.name
                tail = word.lstrip(".…")
                hits = [
                    s for i in range(len(name)) if (s := base.parent / (name[:i] + tail)).exists()
                ]
                if hits:
                    return hits[:1]
                continue
            found = existing(base, re.sub(r"^(\.\.\./|…/)", "", word))
            if found:
                return found
    return []


def test_comments_say_why_not_which_issue_session_or_date() -> None:
    hits = [
        f"{p.relative_to(REPO)}:{line}: {m.group(0)!r}"
        for p in code_files()
        for line, text in comments_and_docstrings(p)
        for m in HISTORY.finditer(text)
    ]
    assert not hits, "\n".join(hits)


def test_results_folders_are_named_by_what_they_measure_card_and_date() -> None:
    bad = [p.name for p in RESULTS.iterdir() if p.is_dir() and not FOLDER.match(p.name)]
    bad += [p.name for p in RESULTS.iterdir() if re.search(r"session|-s\d+$", p.name)]
    assert not bad, bad


def test_every_results_path_in_the_docs_exists() -> None:
    _, missing = citations()
    assert not missing, "\n".join(missing)


def test_every_file_under_results_is_cited() -> None:
    cited, _ = citations()
    uncited = [
        str(f.relative_to(RESULTS))
        for f in sorted(RESULTS.rglob("*"))
        if f.is_file() and not any(c == f or c in f.parents for c in cited)
    ]
    assert not uncited, "\n".join(uncited)
