#!/usr/bin/env bash
# One device call: GPU tests, DeepGEMM/FLA probes, attention+GDN timings, GEMM (sweep +) table,
# and with ENGINE=1 the native engine benchmark (bench_spec_gpu.py: 128k prefill, decode t/s,
# exact/fast, kernel profile, verify/decode, spec envelope). SKIP_GEMM=1 skips the GEMM table.
# Runs from the repo root on the GPU machine (torch/triton from its image, no specdash install);
# results go under $OUT. Usage: bash benchmarks/gpu_run.sh [bench_gemm args...]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv;
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee "$OUT/env.txt"
DG=""
for w in .whl/tokenspeed_deepgemm-*.whl; do
  [ -e "$w" ] || continue
  d=/tmp/dg_$(basename "$w" .whl)
  python3 -m pip install -q --no-deps --no-index --target "$d" "$w" >/dev/null 2>&1
  if PYTHONPATH="$d:$PYTHONPATH" timeout 300 python3 -c "
import torch, deep_gemm
x = torch.randn(4, 5120, device='cuda', dtype=torch.bfloat16)
w = torch.randn(1024, 5120, device='cuda', dtype=torch.bfloat16)
d = torch.empty(4, 1024, device='cuda', dtype=torch.bfloat16)
deep_gemm.bf16_gemm_nt(x, w, d); torch.cuda.synchronize()
print('runs, max|diff| vs F.linear', (d.float() - torch.nn.functional.linear(x, w).float()).abs().max().item())
" > /tmp/dg.log 2>&1; then echo "$w: OK $(tail -1 /tmp/dg.log)" >> "$OUT/deepgemm.txt"; DG="$d"; break
  else echo "$w: FAIL $(grep -v '^ ' /tmp/dg.log | tail -2 | tr '\n' ' ' | cut -c1-400)" >> "$OUT/deepgemm.txt"; fi
done
cat "$OUT/deepgemm.txt" 2>/dev/null
FLA=/tmp/fla
ls .whl/fla_core-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index --target $FLA .whl/fla_core-*.whl >/dev/null 2>&1
echo "== gpu tests $(date -u +%T)"
# -m gpu: the real-shape kernel tests and the graphed engine; the fused-row and RMSNorm kernel
# tests carry no marker (they run on the interpreter in CI) and take the GPU when it is there
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_kernels_gemm.py \
  tests/kernels/test_kernels_attention.py tests/kernels/test_kernels_gdn.py tests/engine/test_gpu_engine.py \
  > "$OUT/gpu_tests.txt" 2>&1; tail -15 "$OUT/gpu_tests.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_fused.py \
  tests/kernels/test_kernels_rmsnorm.py >> "$OUT/gpu_tests.txt" 2>&1
tail -5 "$OUT/gpu_tests.txt"
if [ -z "${SKIP_ATTN:-}" ]; then
  echo "== attention/gdn $(date -u +%T)"
  PYTHONPATH="$PYTHONPATH:$FLA" timeout 150 python3 benchmarks/bench_attention_gdn.py \
    --json "$OUT/attn_gdn.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/attn_gdn.txt"
fi
if [ -z "${SKIP_GEMM:-}" ]; then
  echo "== gemm $(date -u +%T)"
  PYTHONPATH="$PYTHONPATH${DG:+:$DG}" python3 benchmarks/bench_gemm.py --json "$OUT/gemm.json" \
    "$@" 2>&1 | tee "$OUT/gemm.txt"
fi
if [ -n "${PREFILL_ATTN:-}" ]; then
  echo "== prefill attention $(date -u +%T)"
  timeout 120 python3 benchmarks/bench_prefill_attention.py --json "$OUT/prefill_attn.json" \
    2>&1 | grep --line-buffered -v Warning | tee "$OUT/prefill_attn.txt"
fi
if [ -n "${ENGINE:-}" ]; then
  read -r -a ENGINE_ARGS <<< "${ENGINE_ARGS:-}"
  echo "== engine $(date -u +%T)"
  PYTHONPATH="$PYTHONPATH:$FLA" timeout "${ENGINE_TIMEOUT:-400}" python3 benchmarks/bench_spec_gpu.py \
    "${ENGINE_ARGS[@]}" --json "$OUT/spec_gpu.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/spec_gpu.txt"
fi
echo "== done $(date -u +%T)"
