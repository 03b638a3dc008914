#!/usr/bin/env bash
# One device call: the dashboard's cost to the engine on a GPU, headless vs dashboard-process
# alternating (benchmarks/bench_dashboard.py: the same session each run, a fresh engine start
# per run, engine t/s from the second prompt's start, the first prompt warming kernels and CUDA
# graphs inside each run), for what STEPS names, in order (default: native sglang):
#   native  `--device cuda --preset qwen3.5-27b-shape --drafter ngram` (random 27B-shape weights,
#           ~1 min to build per run), within NATIVE_S seconds (default 270) of the call's budget
#   sglang  `--engine sglang` on benchmarks/sglang_checkpoint.py's small real-weights pair
#           (CK_ARGS), NGRAM k=3, the rest of the budget (each run starts two engines)
# Both: PROMPTS (default 5) shipped prompts, NEW (default 32) new tokens, REPEATS (default 2)
# rounds, BENCH_ARGS added to both (e.g. `--warmup once`: a headless run left out of the
# medians), NATIVE_ARGS / SGLANG_ARGS (default `--max-new-tokens 128`) to one: any flag of
# `specdash run`, a later one wins. A run that would end past its step's budget is not started;
# each run's line is printed as it ends and the JSON rewritten after it.
# Environment: benchmarks/sglang_box.sh (the carried SGLang wheels, Triton's carried cache), the
# UI wheels from .carry/ui, fla-core from .carry/fla where carried (the native prefill's GDN).
# Results under $OUT: env.txt, native.{txt,json}, sglang.{txt,json}, sglang_log_tail.txt, and
# with CACHE_OUT=1 triton-cache.tgz (off by default: the carried tree is near its 64 MiB).
# Usage on the GPU machine, from the repo root: [STEPS=native] bash benchmarks/dashboard_gpu_run.sh
set -u
BUDGET=${BUDGET:-540}
WHEELS="$(ls .carry/ui/*.whl .carry/fla/*.whl 2>/dev/null)" source benchmarks/sglang_box.sh
python3 -c "import sglang, torch, triton, textual; print('sglang', sglang.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'textual', textual.__version__)" | tee -a "$OUT/env.txt"
PROMPTS_FILE=/tmp/dashboard_prompts.jsonl
head -n "${PROMPTS:-5}" specdash/data/prompts.jsonl > $PROMPTS_FILE
CK=/tmp/sglang_pair
if [[ " ${STEPS:-native sglang} " == *" sglang "* ]]; then  # built now: not beside a measured run
  # shellcheck disable=SC2086  # CK_ARGS is a list of arguments
  [ -e $CK/target/model.safetensors ] || python3 benchmarks/sglang_checkpoint.py $CK ${CK_ARGS:-} 2>&1 | tail -1
fi
echo "== ready $(( $(date +%s) - T0 ))s"
COMMON=(--only dashboard-process --warmup none --warmup-prompts 1 --repeats "${REPEATS:-2}"
  --prompts "$PROMPTS_FILE" --max-new-tokens "${NEW:-32}")
read -r -a EXTRA <<< "${BENCH_ARGS:-}"
for step in ${STEPS:-native sglang}; do
  l=$(left)
  case $step in
    native) s=$(( l < ${NATIVE_S:-270} ? l : ${NATIVE_S:-270} ))
      ARGS=(--device cuda --preset qwen3.5-27b-shape --drafter ngram)
      read -r -a MORE <<< "${NATIVE_ARGS:-}" ;;
    sglang) s=$(( l - 10 ))  # what the carried SGLang supports on this box: its README
      ARGS=(--engine sglang --model "$CK/target" --speculative-algorithm NGRAM -k 3
        --sglang-arg grammar_backend=none --sglang-arg sampling_backend=pytorch)
      read -r -a MORE <<< "${SGLANG_ARGS---max-new-tokens 128}" ;;  # the start dwarfs 32 tokens
    *) echo "== unknown step $step"; continue ;;
  esac
  [ "$s" -lt 90 ] && { echo "== SKIP $step (${s}s left)"; continue; }
  echo "== $step $(date -u +%T) (${s}s)"
  timeout "$s" python3 benchmarks/bench_dashboard.py "${COMMON[@]}" --budget-s $(( s - 15 )) \
    --json "$OUT/$step.json" "${ARGS[@]}" "${MORE[@]}" "${EXTRA[@]}" 2>&1 \
    | grep --line-buffered -v -i "warn" | tee "$OUT/$step.txt"
  echo "exit ${PIPESTATUS[0]}"
  # SGLang's own logs (the session's and its shadow engine's): why a start failed
  [ "$step" = sglang ] && find /tmp -maxdepth 1 -name 'specdash-sglang-*.log' -newermt "@$T0" \
    -exec tail -n 30 {} + > "$OUT/sglang_log_tail.txt" 2>&1
done
[ -n "${CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C "$TRITON_CACHE_DIR" . && du -h "$OUT/triton-cache.tgz"
echo "== done $(( $(date +%s) - T0 ))s"
