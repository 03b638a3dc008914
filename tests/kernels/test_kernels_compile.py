"""The row kernels and the GEMMs (bf16 and FP8) compile for a Hopper GPU (sm_90, cubin via
ptxas) on this GPU-less machine, as launched plainly and in both programmatic dependent launch
modes.

The interpreter tests check arithmetic but never run Triton's GPU compiler, which rejects
things the interpreter accepts (a loop variable re-bound with another type, say). This is the
check CI can make for the GPU route; the H200 runs the kernels themselves (docs/PERF.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("compile_kernels_sm90.py")


def test_row_kernels_compile_for_sm90() -> None:
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    kernels = ("_rms_norm_kernel", "_gated_kernel", "_conv_kernel", "_qk_norm_rope_kernel",
               "_gdn_steps_kernel", "_split_kernel", "_merge_kernel", "_gemm_kernel",
               "_fp8_gemm_kernel")  # fmt: skip
    for kernel in kernels:
        assert f"{kernel}: ok" in run.stdout
        assert f"{kernel} (PDL): ok" in run.stdout  # programmatic dependent launch variants
        assert f"{kernel} (early PDL): ok" in run.stdout
    assert "_quantize_kernel: ok" in run.stdout
