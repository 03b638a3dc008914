"""`kernels/` sits at the checkout's root (installed, it is `specdash.kernels`). Run from that
root (`python -m pytest`, `python -c`), the root is on sys.path and the folder would shadow the
PyPI `kernels` package that transformers imports when it loads. With PyPI `kernels` installed
(transformers 5.25 requires it) every HF-parity and SGLang test failed with "cannot import name
'CUDAProperties' from 'kernels'"; without it (transformers 5.24, CI's Python) transformers'
probe imported the folder and raised."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Run first in the child: PyPI `kernels` (module and metadata) is not installed there.
WITHOUT_PYPI_KERNELS = f"""
from importlib.machinery import PathFinder
_find = PathFinder.find_spec.__func__

def _find_no_pypi_kernels(cls, name, path=None, target=None):
    spec = _find(cls, name, path, target)
    if name == "kernels" and spec and not spec.origin.startswith({str(REPO / "kernels")!r}):
        return None
    return spec

PathFinder.find_spec = classmethod(_find_no_pypi_kernels)

import importlib.metadata
_from_name = importlib.metadata.Distribution.from_name.__func__

def _no_kernels_distribution(cls, name):
    if name == "kernels":
        raise importlib.metadata.PackageNotFoundError(name)
    return _from_name(cls, name)

importlib.metadata.Distribution.from_name = classmethod(_no_kernels_distribution)
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)


def test_top_level_kernels_is_never_this_checkout() -> None:
    proc = _run("import kernels; print(getattr(kernels, '__file__', None))")
    assert proc.returncode == 0, proc.stderr
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert proc.stdout.strip() == "None"
    else:
        assert not Path(proc.stdout.strip()).is_relative_to(REPO / "kernels")


def test_without_pypi_kernels_transformers_sees_none() -> None:
    pytest.importorskip("transformers")
    proc = _run(
        WITHOUT_PYPI_KERNELS
        + "import kernels\n"
        + "assert getattr(kernels, '__file__', None) is None, kernels.__file__\n"
        + "from transformers.utils import import_utils\n"
        + "print(import_utils._is_package_available('kernels', return_version=True))\n"
        + "print(import_utils._is_package_available('kernels', return_version=True))\n"
        + "import transformers.activations\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(False,", "'N/A')", "(False,", "'N/A')"]


def test_specdash_kernels_is_this_checkout() -> None:
    import specdash.kernels

    assert Path(specdash.kernels.__file__).resolve().parent == REPO / "kernels"
