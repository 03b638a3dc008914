#!/usr/bin/env bash
# One device call for the native engine's FP8: bench_fp8_gpu.py (the FP8 tile's GB/s per 27B
# GEMM shape, FP8-preset decode t/s against the FP8 weight-bandwidth limit, a decode step's
# kernel profile, spec == shadow at batch 1 and 8), then the FP8 GPU tests (the tile's rows at
# every M on the 27B shapes; spec == shadow == plain greedy at batch 1, 8, 32; compare of a
# block-FP8 checkpoint against its bf16 weights), sharing one
# Triton cache. Needs pydantic's wheels in WHEELS (default .carry/sglang).
# Usage on the GPU machine, from the repo root: bash benchmarks/fp8_gpu_run.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W=${WHEELS:-.carry/sglang}
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd "$W"/pydantic*.whl \
  "$W"/annotated_types*.whl "$W"/typing_inspection*.whl "$W"/typing_extensions*.whl \
  > /tmp/pyd.log 2>&1
export PYTHONPATH="/tmp/pyd:$PWD"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee "$OUT/env.txt"
echo "== bench $(date -u +%T)"
timeout ${BENCH_TIMEOUT:-170} python3 benchmarks/bench_fp8_gpu.py ${BENCH_ARGS:-} \
  --json "$OUT/bench_fp8.json" 2>&1 | grep --line-buffered -v -i "warn" | tee "$OUT/bench_fp8.txt"
echo "== tests $(date -u +%T)"
timeout ${TESTS_TIMEOUT:-110} python3 -m pytest -v -rA -p no:cacheprovider -m gpu -x \
  tests/engine/test_gpu_fp8.py tests/kernels/test_kernels_gemm_fp8.py tests/engine/test_gpu_compare.py > "$OUT/fp8_tests.txt" 2>&1
tail -15 "$OUT/fp8_tests.txt"
echo "== done $(date -u +%T)"
