"""Every data file a source checkout uses is shipped in the wheel: the package-data globs in
pyproject.toml cover them (the per-release patch diffs once were not: `diffs/*.diff` missed
`diffs/<release>/*.diff`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_package_data_globs_cover_every_data_file() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {"specdash": REPO / "specdash", **{k: REPO / v for k, v in tool["package-dir"].items()}}
    shipped: set[Path] = set()
    for package, globs in tool["package-data"].items():
        root = dirs.get(package) or REPO / package.replace(".", "/")
        for pattern in globs:
            shipped |= set(root.glob(pattern))
    data = [
        p
        for root in (REPO / "specdash", REPO / "engine_patches", REPO / "kernels")
        for p in root.rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"} and "__pycache__" not in p.parts
    ]
    assert data and not [str(p.relative_to(REPO)) for p in data if p not in shipped]
