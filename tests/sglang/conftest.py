"""The real sglang 0.5.17 and 0.5.23 wheels from PyPI, importable on a CPU-only machine, without
touching torch.

`pip install --no-deps --target .cache/sglang-<version>` fetches the wheel and the small
pure-Python/binary packages its patched modules import (pinned; sglang's own pins where it
pins), next to, never inside, the main venv: torch, triton and transformers come from the
venv. Tests run SGLang code in subprocesses with that directory and the import stubs on
PYTHONPATH, so nothing leaks into the rest of the suite. No network is a failure, not a skip:
CI has PyPI.

0.5.17 needs two things 0.5.23 fixed: an xgrammar import stub (it imports `xgrammar` at module
level; `stubs-0.5.17/`), and `AutoConfig.register("qwen3_asr", ..., exist_ok=True)` (without it
transformers >= 5.17 refuses the import; the same one-line fix as 0.5.23's own), applied to
the installed copy.
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
"""The release the single-version tests run on (`sglang_path`, `run_sglang`)."""
SGLANG_VERSIONS = ("0.5.17", "0.5.23")
HERE = Path(__file__).resolve().parent
STUBS = {v: [HERE / "stubs"] for v in SGLANG_VERSIONS} | {
    "0.5.17": [HERE / "stubs", HERE / "stubs-0.5.17"]
}
QWEN3_ASR_FIX = (
    "sglang/srt/configs/qwen3_asr.py",
    'AutoConfig.register("qwen3_asr", Qwen3ASRConfig)',
    'AutoConfig.register("qwen3_asr", Qwen3ASRConfig, exist_ok=True)',
)
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


def cache(version: str) -> Path:
    return REPO / ".cache" / f"sglang-{version}"


def _install(version: str) -> None:
    """Install into a sibling directory, then rename: a half-finished install is never used."""
    target = cache(version)
    partial = target.with_name(target.name + ".partial")
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
        f"sglang=={version}",
        *IMPORT_DEPS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"could not install sglang {version} from PyPI:\n{proc.stderr[-3000:]}")
    if version == "0.5.17":
        rel, old, new = QWEN3_ASR_FIX
        path = partial / rel
        path.write_text(path.read_text().replace(old, new, 1))
    partial.rename(target)


def sglang_path_for(version: str) -> str:
    """PYTHONPATH entries that make the real sglang `version` wheel importable."""
    target = cache(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".sglang-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "sglang" / "__init__.py").exists():
            _install(version)
    return os.pathsep.join([*map(str, STUBS[version]), str(target)])


@pytest.fixture(scope="session")
def sglang_path() -> str:
    return sglang_path_for(SGLANG_VERSION)


@pytest.fixture(scope="session")
def run_sglang(sglang_path: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet (or `-m module args`) with SGLang 0.5.23 importable."""
    return runner(sglang_path)


@pytest.fixture(scope="session", params=SGLANG_VERSIONS)
def run_each_sglang(request) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_sglang` once per supported release (the test runs twice); `.version` says which,
    `.wheel` is where that release is installed."""
    path = sglang_path_for(request.param)
    run = runner(path)
    run.version = request.param  # type: ignore[attr-defined]
    run.wheel = Path(path.split(os.pathsep)[-1])  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="session")
def run_release() -> Callable[[str], Callable[..., subprocess.CompletedProcess[str]]]:
    """`run_sglang` for a named release: a test comparing two releases within one run."""
    return lambda version: runner(sglang_path_for(version))


def runner(path: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet (or `-m module args`) with `path` on PYTHONPATH.

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
        full_env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
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
