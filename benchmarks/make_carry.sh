#!/usr/bin/env bash
# Builds .carry/ (git-ignored), what the device-call scripts install on the GPU box, which has
# no network: .carry/sglang (SGLang 0.5.17 and every wheel it needs, from ../shared/sglang-h200),
# .carry/fla (fla-core and einops: the native prefill's chunked GDN), .carry/ui (the dashboard's
# wheels the box lacks) and, with REF=COMMIT, .carry/ref (that commit's engine, for
# batch_gpu_run.sh's side-by-side step). Triton's cache (.carry/triton-cache.tgz) only ever comes
# back from a call. Every folder counts against the 64 MiB a call carries (sglang ~33 MiB).
# Usage, from the repo root: [REF=a60b5ff] bash benchmarks/make_carry.sh
set -euo pipefail
SHARED=${SHARED:-../shared/sglang-h200}
mkdir -p .carry/sglang .carry/fla .carry/ui
cp "$SHARED"/*.whl .carry/sglang/
# the box runs Python 3.12; these are pure Python
pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d .carry/fla \
  fla-core==0.6.0 einops==0.8.2
pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d .carry/ui \
  textual==8.2.8 textual-plotext==1.0.1 plotext==5.3.2 platformdirs linkify-it-py uc-micro-py \
  pytest-asyncio
if [ -n "${REF:-}" ]; then
  rm -rf .carry/ref && mkdir -p .carry/ref
  # shellcheck disable=SC2046  # a commit from before the move keeps kernels/, engine_patches/ at the root
  git archive "$REF" specdash $(git ls-tree --name-only "$REF" kernels engine_patches) \
    benchmarks/bench_spec_gpu.py benchmarks/cuda_timing.py pyproject.toml | tar -x -C .carry/ref
  rm -rf .carry/ref/specdash/data/draft .carry/ref/specdash/data/target  # not used on a GPU
fi
du -sh .carry/*
