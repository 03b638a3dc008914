# Sourced by the SGLang device-call scripts: the box's environment, Triton's carried cache, the
# carried wheels (`.carry/sglang/*.whl` and the caller's WHEELS; benchmarks/make_carry.sh builds
# them) installed to /tmp/site, and this tree importable as specdash. Sets T0, BUDGET, OUT;
# `left` prints the seconds left.
T0=$(date +%s); BUDGET=${BUDGET:-560}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export SGLANG_IS_FLASHINFER_AVAILABLE=false   # flashinfer is an import stub in the carry
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TRITON_CACHE_DIR=/tmp/triton-cache; mkdir -p $TRITON_CACHE_DIR
[ -f .carry/triton-cache.tgz ] && tar -xzf .carry/triton-cache.tgz -C $TRITON_CACHE_DIR
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$OUT/env.txt"
# shellcheck disable=SC2086  # WHEELS is a list of globs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .carry/sglang/*.whl ${WHEELS:-} > /tmp/install.log 2>&1 \
  || { tail -5 /tmp/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import torch,sys; sys.exit(0 if hasattr(torch.Tensor,"__dlpack_c_exchange_api__") else 1)' \
  || export TVM_FFI_DISABLE_TORCH_C_DLPACK=1
