#!/usr/bin/env bash
# One device call on the H200: real SGLang 0.5.17 (carried wheels) with specdash's patches.
# Installs .carry/sglang/*.whl and (where carried) .carry/ui/*.whl to /tmp/site, builds the benchmark pair and
# a DFlash draft of its target (benchmarks/sglang_checkpoint.py with CK_ARGS, e.g. `--shape 27b
# --layers 4 --device cuda` for real-dim weights; add `--multimodal` for the target as
# Qwen3_5ForConditionalGeneration, which 0.5.17's DFLASH needs), then runs, in order, what STEPS names
# (default below):
#   start     benchmarks/bench_sglang_start.py: the sessions START_RUNS names (default: NGRAM,
#             STANDALONE), start phases
#   cli       specdash run --headless --engine sglang (NGRAM k=3, --json), once per CLI_RUNS entry
#   matrix    benchmarks/bench_sglang_shape.py --phases spec on this pair, once per ';'-separated
#             MATRIX_RUNS entry (e.g. "--algorithms NEXTN,DFLASH --batches 8,32"): one batch-1
#             shadow, then each algorithm at batch 1 and at every --batches against it; an entry
#             runs until the call's time is up unless it names its own --budget-s
#   bench     benchmarks/bench_sglang.py --phases $PHASES
#   tests     pytest -m sglang_gpu ($TEST_ARGS added, e.g. -k STANDALONE)
#   dashboard benchmarks/sglang_dashboard_shot.py (Textual headless, SVG)
# Results under $OUT; SGLang's own log lines go to $OUT/*.log, not to stdout.
# Triton's cache travels between calls: read from .carry/triton-cache.tgz when carried, written
# back to $OUT/triton-cache.tgz unless NO_CACHE_OUT=1 (a fresh machine otherwise spends ~70 s
# compiling per call).
set -u
WHEELS="$(ls .carry/ui/*.whl 2>/dev/null)" source benchmarks/sglang_box.sh  # UI wheels where carried
python3 -c "import sglang, torch, triton; print('sglang', sglang.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
echo "== install done $(( $(date +%s) - T0 ))s"
CK=/tmp/sglang_pair
# shellcheck disable=SC2086  # CK_ARGS is a list of arguments
[ -e $CK/dflash/model.safetensors ] \
  || python3 benchmarks/sglang_checkpoint.py $CK --dflash-draft $CK/dflash ${CK_ARGS:-} 2>&1 | tail -2
echo "== checkpoint built $(( $(date +%s) - T0 ))s: $(du -sh $CK/target | cut -f1)"
# at most 8 files come back from $OUT: `patches check` goes into env.txt
python3 -c "from specdash.cli import main; main(['patches', 'check'])" >> "$OUT/env.txt" 2>&1
tail -1 "$OUT/env.txt"
# What the carried SGLang supports on this box (its README): xgrammar and flashinfer are stubs.
BOX="--sglang-arg grammar_backend=none --sglang-arg sampling_backend=pytorch"
for step in ${STEPS:-cli bench}; do
  l=$(left); [ "$l" -lt 60 ] && { echo "== SKIP $step (${l}s left)"; continue; }
  echo "== $step $(date -u +%T) (${l}s left)"
  case $step in
    cli)  # one run per ';'-separated entry of CLI_RUNS (args added to the NGRAM k=3 defaults)
      # SGLang logs of earlier steps or calls on this machine belong to no run here
      rm -f /tmp/specdash-sglang-[0-9]*.log
      n=0; IFS=';' read -ra RUNS <<< "${CLI_RUNS:- }"
      for run_args in "${RUNS[@]}"; do
        n=$((n + 1)); l=$(left); [ "$l" -lt 60 ] && { echo "== SKIP cli-$n (${l}s left)"; continue; }
        echo "== cli-$n: $run_args"
        # stderr (SGLang's processes too) with seconds since the run started on every line
        timeout $(( l - 20 )) python3 -c "from specdash.cli import main; import sys; sys.exit(main(sys.argv[1:]))" \
          run --headless --engine sglang --model $CK/target --speculative-algorithm NGRAM -k 3 \
          --max-new-tokens ${CLI_MAX_NEW:-32} --json $BOX $run_args \
          > "$OUT/cli-$n.json" 2> >(python3 benchmarks/stamp_lines.py > "$OUT/cli-$n.log"); echo "exit $?"
        cut -c1-600 "$OUT/cli-$n.json"; grep -a "specdash: error" "$OUT/cli-$n.log" | tail -3
        # SGLang's own log of the run (start phases, each prefill batch's cached tokens), after
        # specdash's stderr, so a run's one file says what SGLang did
        for f in /tmp/specdash-sglang-[0-9]*.log; do
          [ -e "$f" ] && { echo "== $f"; cat "$f"; rm -f "$f"; } >> "$OUT/cli-$n.log"; done
      done ;;
    matrix)
      n=0; IFS=';' read -ra RUNS <<< "${MATRIX_RUNS:- }"
      for run_args in "${RUNS[@]}"; do
        n=$((n + 1)); l=$(left); [ "$l" -lt 60 ] && { echo "== SKIP matrix-$n (${l}s left)"; continue; }
        echo "== matrix-$n: $run_args"
        # shellcheck disable=SC2086  # run_args is a list of arguments
        timeout $(( l - 5 )) python3 benchmarks/bench_sglang_shape.py --phases spec \
          --json "$OUT/matrix-$n.json" --budget-s $(( l - 15 )) --target $CK/target \
          --draft $CK/draft --dflash-draft $CK/dflash --sglang-arg grammar_backend=none \
          --sglang-arg sampling_backend=pytorch $run_args > "$OUT/matrix-$n.log" 2>&1; echo "exit $?"
        grep -aE '^\[ *[0-9.]+s\] (exact|error)|engine .* started|Error' "$OUT/matrix-$n.log" | cut -c1-300
        gzip -f "$OUT/matrix-$n.log"
      done ;;
    start)  # time to the first verified token, phase by phase (benchmarks/bench_sglang_start.py)
      # START_RUNS: the labels to run, in order (a label run twice: cold, then warm cache)
      RUNS=(); for r in ${START_RUNS:-ngram standalone}; do
        case $r in standalone*) RUNS+=(--run "$r:--speculative-algorithm STANDALONE --draft $CK/draft");;
          *) RUNS+=(--run "$r");; esac; done
      timeout $(( l - 15 )) python3 benchmarks/bench_sglang_start.py --target $CK/target \
        --json "$OUT/start.json" "${RUNS[@]}" ${START_ARGS:-} -- $BOX 2>&1 | tee "$OUT/start.log" ;;
    bench)
      timeout $(( l - 15 )) python3 benchmarks/bench_sglang.py --target $CK/target --draft $CK/draft \
        --dflash-draft $CK/dflash \
        --json "$OUT/bench.json" --phases "${PHASES:-anchor,matrix}" --budget-s $(( l - 30 )) \
        $BOX ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep --line-buffered -E '^\[|engine |Error|error' | cut -c1-700 ;;
    tests)  # one pytest per test: a call that runs out of time keeps the finished reports
      export SPECDASH_SGLANG_TEST_ARGS='{"grammar_backend": "none", "sampling_backend": "pytorch"}'
      PYTEST="python3 -m pytest -q -rA --tb=short -p no:cacheprovider -m sglang_gpu"
      for t in $($PYTEST --collect-only ${TEST_ARGS:-} tests/sglang | grep '::'); do
        l=$(left); [ "$l" -lt 90 ] && { echo "== SKIP $t (${l}s left)" | tee -a "$OUT/gpu_tests.txt"; continue; }
        echo "== $t" >> "$OUT/gpu_tests.txt"
        timeout $(( l - 10 )) $PYTEST "$t" >> "$OUT/gpu_tests.txt" 2>&1
        echo "$t: exit $?"
      done; grep -E "^(PASSED|FAILED|ERROR)|^E " "$OUT/gpu_tests.txt" | tail -20 ;;
    dashboard)
      timeout $(( l - 10 )) python3 benchmarks/sglang_dashboard_shot.py --target $CK/target \
        --out "$OUT" $BOX > "$OUT/dashboard.log" 2>&1; echo "exit $?"; tail -8 "$OUT/dashboard.log" ;;
  esac
done
[ -z "${NO_CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C $TRITON_CACHE_DIR . && du -h "$OUT/triton-cache.tgz"
echo "== done $(( $(date +%s) - T0 ))s"
