"""The real sglang 0.5.23 wheel from PyPI, importable on a CPU-only machine, without touching torch.

`pip install --no-deps --target .cache/sglang-0.5.23` fetches the wheel and the small
pure-Python/binary packages its patched modules import (pinned; sglang's own pins where it
pins), next to, never inside, the main venv: torch, triton and transformers come from the
venv. Tests run SGLang code in subprocesses with that directory and the torchvision import
stub on PYTHONPATH, so nothing leaks into the rest of the suite. No network is a failure,
not a skip: CI has PyPI.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.23"
CACHE = REPO / ".cache" / f"sglang-{SGLANG_VERSION}"
STUBS = Path(__file__).resolve().parent / "stubs"
IMPORT_DEPS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "apache-tvm-ffi==0.1.11",
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "compressed-tensors==0.18.0",
    "dill==0.4.1",
    "distro==1.9.0",
    "einops==0.8.2",
    "fastapi==0.165.0",
    "frozenlist==1.8.0",
    "gguf==0.19.0",
    "httpx==0.29.0",
    "idna==3.20",
    "ipython==9.18.1",
    "loguru==0.7.3",
    "msgspec==0.23.0",
    "multidict==7.2.1",
    "openai==2.8.0",
    "opentelemetry-api==1.45.2",
    "orjson==3.13.0",
    "partial-json-parser==0.2.1.1.post7",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pyzmq==27.3.0",
    "requests==2.34.2",
    "sentencepiece==0.2.1",
    "setproctitle==1.3.8",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "traitlets==5.16.1",
    "urllib3==2.8.0",
    "uvicorn==0.55.0",
    "uvloop==0.23.0",
    "yarl==1.25.1",
]


def _install() -> None:
    """Install into a sibling directory, then rename: a half-finished install is never used."""
    partial = CACHE.with_name(CACHE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--target",
        str(partial),
        f"sglang=={SGLANG_VERSION}",
        *IMPORT_DEPS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"could not install sglang {SGLANG_VERSION} from PyPI:\n{proc.stderr[-3000:]}")
    partial.rename(CACHE)


@pytest.fixture(scope="session")
def sglang_path() -> str:
    """PYTHONPATH entries that make the real sglang wheel importable."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / f".sglang-{SGLANG_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (CACHE / "sglang" / "__init__.py").exists():
            _install()
    return os.pathsep.join([str(STUBS), str(CACHE)])


@pytest.fixture(scope="session")
def run_sglang(sglang_path: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet (or `-m module args`) with SGLang importable.

    With check=True (the default) a non-zero exit fails the test with the child's output.
    """

    def run(
        code: str | None = None,
        *,
        module_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        check: bool = True,
        timeout: float = 240,
    ) -> subprocess.CompletedProcess[str]:
        argv = ["-m", *module_args] if module_args else ["-c", textwrap.dedent(code or "")]
        full_env = {**os.environ, "PYTHONPATH": sglang_path, "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            env={**full_env, **(env or {})},
            cwd=REPO,
            timeout=timeout,
        )
        if check:
            assert proc.returncode == 0, (
                f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    return run
