"""The bit-exactness and fault tests again, in a subprocess, under a second CPU vector ISA.

How every op rounds depends on the CPU: ATen picks its vectorised kernels (reductions, exp,
softmax, ...) by the widest ISA the CPU has, and MKL its GEMM kernels. An expectation that
holds under one ISA only (which token first shows a 1-ulp fault, a recorded logprob) passes
where it was written and fails on a CI machine with the other. So the suite runs those
tests twice: once in this process under the machine's default, and once here with ATen and
MKL capped to a narrower ISA: AVX2 on an AVX-512 machine, the scalar default on an AVX2 one.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CHILD = "SPECDASH_ISA_CHILD"  # set in the child, so that it never recurses
# tests whose expectations are bits (or argmaxes) computed on this CPU
RERUN = [
    "tests/engine/test_engine_exact.py",
    "tests/engine/test_cpu_rows.py",
    "tests/engine/test_prefill_chunks.py",
]
HF = [
    "tests/engine/test_hf_parity.py",
    "tests/engine/test_tiny_training.py::test_shipped_target_is_a_transformers_checkpoint",
]
# ATen's capability -> (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS) of the second ISA
SECOND = {"AVX512": ("avx2", "AVX2"), "AVX2": ("default", "SSE4_2")}
# ... and oneDNN's cap to match: ATen's bf16 SDPA packs through oneDNN, which otherwise still
# sees the AVX-512 hardware and asks the AVX2 build for its VNNI packing ("pack_vnni2 is only
# supported when avx512 is supported", torch 2.13 on an AVX-512 machine)
ONEDNN = {"AVX2": "AVX2", "SSE4_2": "SSE41"}
# the child says which capability ATen runs under before it runs pytest
CHILD_MAIN = (
    "import sys, pytest, torch; "
    "print('cpu capability:', torch.backends.cpu.get_cpu_capability(), flush=True); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def second_isa() -> tuple[str, str | None] | None:
    cap = torch.backends.cpu.get_cpu_capability()
    if cap in SECOND:
        return SECOND[cap]
    # another architecture's vector path (SVE, VSX, ZVECTOR): its scalar default
    return None if cap == "DEFAULT" else ("default", None)


@pytest.mark.skipif(CHILD in os.environ, reason="the second-ISA run does not recurse")
def test_exactness_holds_under_a_second_isa() -> None:
    second = second_isa()
    if second is None:
        pytest.skip("ATen runs its scalar default here: there is no second ISA to try")
    aten, mkl = second
    # a plain pytest run: not this run's options, nor its xdist worker's identity
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTEST_ADDOPTS" and not k.startswith("PYTEST_XDIST")
    }
    env.update({CHILD: aten, "ATEN_CPU_CAPABILITY": aten})
    if mkl is not None:
        env["MKL_ENABLE_INSTRUCTIONS"] = mkl
        env["ONEDNN_MAX_CPU_ISA"] = ONEDNN[mkl]
    tests = RERUN + (HF if importlib.util.find_spec("transformers") else [])
    child = subprocess.run(
        [sys.executable, "-c", CHILD_MAIN, "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = child.stdout + child.stderr
    assert child.stdout.startswith(f"cpu capability: {aten.upper()}\n"), out[-3000:]
    assert child.returncode == 0, f"ATEN_CPU_CAPABILITY={aten}:\n{out[-6000:]}"
    summary = child.stdout.strip().splitlines()[-1]  # plugins may still warn on stderr
    assert re.match(r"\d+ passed", summary) and "skipped" not in summary, summary
