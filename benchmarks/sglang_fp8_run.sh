#!/usr/bin/env bash
# One device call for FP8 on real SGLang 0.5.17 (carried wheels): the kernel check
# (benchmarks/fp8_rows_check.py: does an FP8 GEMM row depend on M, stock vs fp8_routing), a
# block-FP8 target (sglang_checkpoint.py --fp8-block, with FP8_CK_ARGS) at /tmp/fp8ck, then
# benchmarks/sglang_gpu_run.sh with STEPS/CLI_RUNS/CK_ARGS as given (its pair at /tmp/sglang_pair).
# Everything it writes is packed into $OUT/fp8-call.tgz (the device returns at most 8 files).
set -u
FINAL=$OUT; T00=$(date +%s); export OUT=/tmp/fp8out; mkdir -p $OUT
source benchmarks/sglang_box.sh
[ -n "${ROWS-1}" ] && python3 benchmarks/fp8_rows_check.py --json $OUT/rows.json ${ROWS_ARGS:-} 2>&1 | tee $OUT/rows.log
# shellcheck disable=SC2086
[ -n "${FP8_CK_ARGS:-}" ] && python3 benchmarks/sglang_checkpoint.py /tmp/fp8ck --fp8-block $FP8_CK_ARGS 2>&1 | tail -1
used=$(( $(date +%s) - T00 ))
BUDGET=$(( ${TOTAL:-575} - used )) NO_CACHE_OUT=1 bash benchmarks/sglang_gpu_run.sh
tar -czf "$FINAL/fp8-call.tgz" -C $OUT . && ls -la "$FINAL"
