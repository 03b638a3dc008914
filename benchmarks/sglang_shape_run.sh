#!/usr/bin/env bash
# One device call: benchmarks/bench_sglang_shape.py (SGLang at the 27B shape, dummy weights) with
# the carried SGLang 0.5.17 wheels (.carry/sglang) and fla-core (.carry/fla, for the native
# engine's prefill). PHASES / SHAPE_ARGS pass through; Triton's cache travels in
# .carry/triton-cache.tgz and comes back as $OUT/triton-cache.tgz unless NO_CACHE_OUT=1.
set -u
WHEELS=".carry/fla/*.whl" source benchmarks/sglang_box.sh
python3 -c "from specdash.cli import main; main(['patches', 'check'])" 2>&1 | tail -3 >> "$OUT/env.txt"
cat "$OUT/env.txt"; echo "== install done $(( $(date +%s) - T0 ))s"
left=$(left)
timeout $(( left - 15 )) python3 benchmarks/bench_sglang_shape.py --json "$OUT/shape.json" \
  --phases "${PHASES:-plain,stock,native}" --budget-s $(( left - 30 )) \
  --sglang-arg grammar_backend=none --sglang-arg sampling_backend=pytorch ${SHAPE_ARGS:-} \
  > "$OUT/shape.log" 2>&1; echo "exit $?"
grep -E '^\[|^==|engine |Error|error' "$OUT/shape.log" | cut -c1-900 | tail -60
[ -z "${NO_CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C $TRITON_CACHE_DIR . && du -h "$OUT/triton-cache.tgz"
echo "== done $(( $(date +%s) - T0 ))s"
