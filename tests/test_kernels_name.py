"""`kernels/` sits at the checkout's root (installed, it is `specdash.kernels`). Run from that
root (`python -m pytest`, `python -c`), the root is on sys.path and the folder would shadow the
PyPI `kernels` package that transformers (5.25 on) imports when it loads: every HF-parity and
SGLang test then failed with "cannot import name 'CUDAProperties' from 'kernels'"."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_top_level_kernels_is_never_this_checkout() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import kernels; print(kernels.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert proc.returncode != 0 and "No module named 'kernels'" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert not Path(proc.stdout.strip()).is_relative_to(REPO / "kernels")


def test_specdash_kernels_is_this_checkout() -> None:
    import specdash.kernels

    assert Path(specdash.kernels.__file__).resolve().parent == REPO / "kernels"
