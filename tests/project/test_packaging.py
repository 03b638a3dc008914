"""What a user installs is a wheel, not this checkout: every data file a source checkout uses is
in the package data, and a wheel built from the tracked files, installed into a fresh venv (not
editable), imports every module it carries and runs `specdash run --headless`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_package_data_globs_cover_every_data_file() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped: set[Path] = set()
    for package, globs in tool["package-data"].items():
        root = REPO / package.replace(".", "/")
        for pattern in globs:
            shipped |= set(root.glob(pattern))
    data = [
        p
        for p in (REPO / "specdash").rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"} and "__pycache__" not in p.parts
    ]
    assert data and not [str(p.relative_to(REPO)) for p in data if p not in shipped]


def test_packages_come_from_the_folder_tree() -> None:
    """No hand-kept package list: a new folder with an __init__.py ships without an edit."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in tool and tool["packages"] == {"find": {"include": ["specdash*"]}}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from the tracked (and untracked, not ignored) files alone, as a clean
    clone holds them."""
    tree = tmp_path_factory.mktemp("clean") / "specdash"
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(tree)],
        check=True,
        capture_output=True,
    )
    (built,) = dist.glob("specdash-*.whl")
    return built


def test_the_wheel_carries_every_module_of_the_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "specdash").rglob("*.py")}
    assert modules and not sorted(modules - names)


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (not editable). Its dependencies are the running
    interpreter's, reached through a .pth file: that site's editable specdash is a finder
    started by its own .pth, which a path entry does not run, so only the wheel's specdash is
    importable."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return root


def _in_venv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_the_installed_wheel_imports_every_module(venv: Path, tmp_path: Path) -> None:
    code = """
import importlib, json, pkgutil, specdash
names = [m.name for m in pkgutil.walk_packages(specdash.__path__, "specdash.")]
names = [n for n in names if not n.endswith(".__main__")]  # importing one runs the command
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = repr(e)
print(json.dumps({"file": specdash.__file__, "names": names, "failed": failed}))
"""
    proc = _in_venv(venv, "python", "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    assert Path(seen["file"]).is_relative_to(venv)
    carried = {
        "specdash.runs.sglang.backend",
        "specdash.engine.rows.gdn",
        "specdash.kernels.triton.gemm",
        "specdash.runs.sglang.patches.check",
    }
    assert carried <= set(seen["names"])
    assert not seen["failed"]


def test_the_installed_wheel_runs_headless(venv: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "The cat sat on the"}\n{"prompt": "Once upon a time"}\n')
    proc = _in_venv(
        venv,
        "specdash",
        "run",
        "--headless",
        "--json",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "8",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["prompts"] == 2 and summary["exact_prompts"] == 2
