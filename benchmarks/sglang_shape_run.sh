#!/usr/bin/env bash
# One device call: benchmarks/bench_sglang_shape.py (SGLang at the 27B shape, dummy weights) with
# the carried SGLang 0.5.17 wheels (.carry/sglang) and fla-core (.carry/fla, for the native
# engine's prefill). PHASES / SHAPE_ARGS (or SHAPE_RUNS, below) pass through; Triton's cache travels in
# .carry/triton-cache.tgz and comes back as $OUT/triton-cache.tgz unless NO_CACHE_OUT=1.
set -u
WHEELS=".carry/fla/*.whl" source benchmarks/sglang_box.sh
python3 -c "from specdash.cli import main; main(['patches', 'check'])" 2>&1 | tail -3 >> "$OUT/env.txt"
cat "$OUT/env.txt"; echo "== install done $(( $(date +%s) - T0 ))s"
# SHAPE_RUNS: ';'-separated argument lists, one bench run each (shape-N.json); an entry runs
# until the call's time is up unless it names its own --budget-s
n=0; IFS=';' read -ra RUNS <<< "${SHAPE_RUNS:-${SHAPE_ARGS:-}}"
for run_args in "${RUNS[@]}"; do
  n=$((n + 1)); l=$(left); [ "$l" -lt 60 ] && { echo "== SKIP shape-$n (${l}s left)"; continue; }
  name=shape; [ ${#RUNS[@]} -gt 1 ] && name=shape-$n
  echo "== $name: $run_args"
  # shellcheck disable=SC2086  # run_args is a list of arguments
  timeout $(( l - 15 )) python3 benchmarks/bench_sglang_shape.py --json "$OUT/$name.json" \
    --phases "${PHASES:-plain,stock,native}" --budget-s $(( l - 30 )) \
    --sglang-arg grammar_backend=none --sglang-arg sampling_backend=pytorch $run_args \
    > "$OUT/$name.log" 2>&1; echo "exit $?"
  grep -aE '^\[ *[0-9.]+s\]|^==|engine .* started|Error' "$OUT/$name.log" | cut -c1-600 | tail -40
  gzip -f "$OUT/$name.log"
done
[ -z "${NO_CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C $TRITON_CACHE_DIR . && du -h "$OUT/triton-cache.tgz"
echo "== done $(( $(date +%s) - T0 ))s"
