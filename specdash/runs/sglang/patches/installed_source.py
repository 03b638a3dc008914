"""The source text of a patch target in the installed SGLang, read from its files, not imported.

Why not import: SGLang's modules pull in torch, CUDA-only kernels (FA3's `sgl_kernel`) and
seconds of start-up; `specdash patches check` must run on any machine, quickly, and judge the
FA3 target too. A target is a dotted path: the longest prefix that is a file of the sglang
distribution is the module (a module alone: its whole file), the rest are names of classes,
functions, class-level assignments or imported names (an import's source is its statement: which
object the name is bound to), looked up in the module's syntax tree (also inside module-level
if/try blocks).
"""

from __future__ import annotations

import ast
import hashlib
import textwrap
from importlib import metadata
from pathlib import Path


def sglang_root() -> Path | None:
    """The directory holding the installed `sglang` package, or None when not installed."""
    try:
        return Path(str(metadata.distribution("sglang").locate_file("")))
    except metadata.PackageNotFoundError:
        return None


def module_file(root: Path, parts: list[str]) -> Path | None:
    for candidate in (
        root.joinpath(*parts).with_suffix(".py"),
        root.joinpath(*parts, "__init__.py"),
    ):
        if candidate.is_file():
            return candidate
    return None


def _children(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of a body, with module-level `if`/`try` blocks flattened in."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [h.body for h in node.handlers] + [node.finalbody]
            for block in blocks:
                out += _children(block)
        else:
            out.append(node)
    return out


def _named(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name) == name for a in node.names)
    return False


def target_source(path: str, root: Path) -> str | None:
    """Dedented source of the definition `path` names (decorators included), or the whole
    file when `path` is a module; None if absent."""
    parts = path.split(".")
    whole = module_file(root, parts)
    if whole is not None:
        return whole.read_text(encoding="utf-8")
    for cut in range(len(parts) - 1, 0, -1):
        file = module_file(root, parts[:cut])
        if file is not None:
            break
    else:
        return None
    text = file.read_text(encoding="utf-8")
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.stmt | None = None
    for name in parts[cut:]:
        node = next((n for n in reversed(_children(body)) if _named(n, name)), None)
        if node is None:
            return None
        body = node.body if isinstance(node, ast.ClassDef) else []
    assert node is not None
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    lines = text.splitlines(keepends=True)[first - 1 : node.end_lineno]
    return textwrap.dedent("".join(lines))


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
