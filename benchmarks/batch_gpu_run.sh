#!/usr/bin/env bash
# One device call for batched decode: the batched GPU tests (captured batches against eager
# batches and plain greedy, 27B shape at B = 1/8/32), then bench_batch.py on the 27B shape
# (plain decode at 2k, and with PROFILE=1 a torch.profiler pass at B = 32); step `spec`:
# bench_spec_gpu.py's single-sequence numbers (decode t/s, exact/fast, step profiles, verify/decode)
# with SPEC_ARGS (default: no 128k prefill, 2k context only, a short spec envelope); step `attn`:
# bench_prefill_attention.py (torch's flash attention vs specdash's Triton prefill kernel); step
# `split`: the decode attention config sweep with SPLITS split sizes; step `ref`: bench_spec_gpu.py
# (SPEC_ARGS) from the reference tree REF (default .carry/ref: `REF=COMMIT bash
# benchmarks/make_carry.sh`), then from this tree, then REF again: the decode step side by side
# on one machine.
# Needs pydantic (the settings models) from .carry/sglang, installed to /tmp/pyd (and FLA from
# .carry/fla when there).
# Usage on the GPU machine, from the repo root: [STEPS="tests bench"] bash benchmarks/batch_gpu_run.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-tests bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd .carry/sglang/pydantic*.whl \
  .carry/sglang/annotated_types*.whl .carry/sglang/typing_inspection*.whl \
  .carry/sglang/typing_extensions*.whl > /tmp/pyd.log 2>&1
# FLA's chunked GDN kernel for prefill, when carried (benchmarks/make_carry.sh)
ls .carry/fla/fla_core-*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps \
  --target /tmp/pyd .carry/fla/fla_core-*.whl >> /tmp/pyd.log 2>&1
export PYTHONPATH="/tmp/pyd:$PWD"
# Triton's compiled kernels travel between calls (a cold cache cost the GPU tests over 200 s):
# read from .carry/triton-cache.tgz when carried, written to $OUT/triton-cache.tgz with CACHE_OUT=1
export TRITON_CACHE_DIR=/tmp/triton-cache; mkdir -p $TRITON_CACHE_DIR
[ -f .carry/triton-cache.tgz ] && tar -xzf .carry/triton-cache.tgz -C $TRITON_CACHE_DIR
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee "$OUT/env.txt"
# -v: a test's PASSED line as it ends, so a call that runs out of time still says which passed
if [[ " $STEPS " == *" tests "* ]]; then
  echo "== tests $(date -u +%T)"
  timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -v -rA -p no:cacheprovider -m gpu \
    ${TESTS_FILES:-tests/engine/test_gpu_engine.py} -k "${TESTS_K-captured or batched}" > "$OUT/batched_tests.txt" 2>&1
  tail -8 "$OUT/batched_tests.txt"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  echo "== bench $(date -u +%T)"
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_batch.py --device cuda \
    --preset qwen3.5-27b-shape --drafter ngram -k ${K:-0} --context 2048 --max-new-tokens ${NEW:-8} \
    --prompts 32 --repeats ${REPEATS:-1} ${PROFILE:+--profile} --json "$OUT/bench_batch.json" \
    2>&1 | grep --line-buffered -v -i "warn\|profiler_\|USDT" | tee "$OUT/bench_batch.txt"
  nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/bench_batch.txt"
fi
if [[ " $STEPS " == *" spec "* ]]; then
  echo "== spec $(date -u +%T)"
  read -r -a SPEC <<< "${SPEC_ARGS:---long-prefill 0 --contexts 2048 --prompts 4 --spec-tokens 20}"
  timeout ${SPEC_TIMEOUT:-300} python3 benchmarks/bench_spec_gpu.py "${SPEC[@]}" \
    --json "$OUT/spec_gpu.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/spec_gpu.txt"
fi
if [[ " $STEPS " == *" attn "* ]]; then
  echo "== prefill attention $(date -u +%T)"
  timeout ${ATTN_TIMEOUT:-150} python3 benchmarks/bench_prefill_attention.py \
    --json "$OUT/prefill_attn.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/prefill_attn.txt"
fi
if [[ " $STEPS " == *" split "* ]]; then
  echo "== decode attention split sweep $(date -u +%T)"
  timeout ${SPLIT_TIMEOUT:-200} python3 benchmarks/bench_attention_gdn.py --attention-sweep \
    --splits ${SPLITS:-64,128,256} --json "$OUT/attn_sweep.json" 2>&1 | grep --line-buffered -v Warning \
    | tail -60 > "$OUT/attn_sweep.txt"
fi
if [[ " $STEPS " == *" ref "* ]]; then
  REF=${REF:-.carry/ref}
  read -r -a SPEC <<< "${SPEC_ARGS:---long-prefill 0 --contexts 2048 --prompts 4 --spec-tokens 20}"
  # a tree from before the root kernels/ and engine_patches/ moved under specdash/ imports them there
  for p in kernels engine_patches; do [ -e $REF/$p ] && [ ! -e $REF/specdash/$p ] && ln -s ../$p $REF/specdash/$p; done
  n=0
  for run in ${SIDE_RUNS:-ref this ref}; do
    n=$((n + 1)); echo "== side by side: $run $(date -u +%T)"
    tree=$PWD; [ $run = ref ] && tree=$(cd "$REF" && pwd)
    (cd "$tree" && PYTHONPATH="/tmp/pyd:$tree" timeout ${SPEC_TIMEOUT:-170} python3 \
      benchmarks/bench_spec_gpu.py "${SPEC[@]}" --json "$OUT/side_${n}_$run.json") 2>&1 \
      | grep --line-buffered -v Warning | tee "$OUT/side_${n}_$run.txt" | grep "tokens_per_s" | cut -c1-400
  done
fi
[ -n "${CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C $TRITON_CACHE_DIR . \
  && du -h "$OUT/triton-cache.tgz"
echo "== done $(date -u +%T)"
