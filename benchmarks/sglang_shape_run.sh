#!/usr/bin/env bash
# One device call: benchmarks/bench_sglang_shape.py (SGLang at the 27B shape, dummy weights) with
# the carried SGLang 0.5.17 wheels (.carry/sglang) and fla-core (.carry/fla, for the native
# engine's prefill). PHASES / SHAPE_ARGS pass through; Triton's cache travels in
# .carry/triton-cache.tgz and comes back as $OUT/triton-cache.tgz unless NO_CACHE_OUT=1.
set -u
T0=$(date +%s); BUDGET=${BUDGET:-560}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SGLANG_IS_FLASHINFER_AVAILABLE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=/tmp/triton-cache; mkdir -p $TRITON_CACHE_DIR
[ -f .carry/triton-cache.tgz ] && tar -xzf .carry/triton-cache.tgz -C $TRITON_CACHE_DIR
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$OUT/env.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .carry/sglang/*.whl .carry/fla/*.whl > /tmp/install.log 2>&1 \
  || { tail -5 /tmp/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ -e specdash/kernels ] || ln -s ../kernels specdash/kernels
[ -e specdash/engine_patches ] || ln -s ../engine_patches specdash/engine_patches
python3 -c 'import torch,sys; sys.exit(0 if hasattr(torch.Tensor,"__dlpack_c_exchange_api__") else 1)' \
  || export TVM_FFI_DISABLE_TORCH_C_DLPACK=1
python3 -c "from specdash.cli import main; main(['patches', 'check'])" 2>&1 | tail -3 >> "$OUT/env.txt"
cat "$OUT/env.txt"; echo "== install done $(( $(date +%s) - T0 ))s"
left=$(( BUDGET - ($(date +%s) - T0) ))
timeout $(( left - 15 )) python3 benchmarks/bench_sglang_shape.py --json "$OUT/shape.json" \
  --phases "${PHASES:-plain,stock,native}" --budget-s $(( left - 30 )) \
  --sglang-arg grammar_backend=none --sglang-arg sampling_backend=pytorch ${SHAPE_ARGS:-} \
  > "$OUT/shape.log" 2>&1; echo "exit $?"
grep -E '^\[|^==|engine |Error|error' "$OUT/shape.log" | cut -c1-900 | tail -60
[ -z "${NO_CACHE_OUT:-}" ] && tar -czf "$OUT/triton-cache.tgz" -C $TRITON_CACHE_DIR . && du -h "$OUT/triton-cache.tgz"
echo "== done $(( $(date +%s) - T0 ))s"
