"""Native model on the GPU, random weights of a preset shape: decode and verify step times, eager.

Builds specdash.engine.model.Model on `--preset` (default qwen3.5-27b-shape, bf16, ~51 GB) and
times, per GEMM backend: an exact decode step (1 row), an exact verify step (k+1 rows), and a
fast-mode decode step, after a prefill. Also checks that the verify rows' log-probs equal the decode
log-probs bit for bit (the exact guarantee end to end on random weights). Eager PyTorch: no CUDA
graphs (the engine has none yet), so host launch overhead is part of every number.

    python benchmarks/bench_engine_gpu.py [--preset qwen3.5-27b-shape] [--k 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

from specdash.engine.config import preset
from specdash.engine.model import Model
from specdash.engine.state import SeqState
from specdash.kernels import gemm_backends


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-27b-shape")
    ap.add_argument("--k", type=int, default=9)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--backends", default="triton,cublas")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = preset(args.preset)
    t0 = time.perf_counter()
    model = Model.random(cfg, 0, torch.bfloat16, dev, gemm_backends.resolve("triton", dev))
    weight_bytes = model.step_weight_bytes
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "build_s": time.perf_counter() - t0,
        "gemm_weight_GB": weight_bytes / 1e9,
        "memory_GB": torch.cuda.memory_allocated() / 1e9,
    }
    print(info, flush=True)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt,), generator=gen).to(dev)
    rows = torch.randint(0, cfg.vocab_size, (args.k + 1,), generator=gen).to(dev)
    results = []
    for name in args.backends.split(","):
        model.gemm = gemm_backends.resolve(name, dev)
        capacity = args.prompt + args.repeats * (args.k + 2) + 64
        state = SeqState.empty(cfg, capacity, model.dtype, dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.forward(prompt, state, "prefill")
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        base = SeqState.empty(cfg, capacity, model.dtype, dev)
        base.copy_from(state)

        def decode(mode, state=state):
            model.forward(rows[:1], state, mode)
            state.commit(1)

        def verify(state=state):
            model.forward(rows, state, "exact")
            state.commit(args.k + 1)

        decode("exact")  # warm-up: Triton compiles
        verify()
        dec = timed(lambda: decode("exact"), args.repeats)
        ver = timed(verify, args.repeats)
        fast = timed(lambda: decode("fast"), args.repeats)
        # exactness: verify rows == decode rows, from the same state
        s1, s2 = (SeqState.empty(cfg, capacity, model.dtype, dev) for _ in range(2))
        s1.copy_from(base)
        s2.copy_from(base)
        lp_verify = model.forward(rows, s1, "exact")
        lp_decode = []
        for i in range(args.k + 1):
            lp_decode.append(model.forward(rows[i : i + 1], s2, "exact")[0])
            s2.commit(1)
        exact = torch.equal(lp_verify, torch.stack(lp_decode))
        med = statistics.median
        entry = {
            "backend": name,
            "prefill_tokens": args.prompt,
            "prefill_s": prefill_s,
            "decode_exact_ms": med(dec) * 1e3,
            "decode_exact_tok_s": 1 / med(dec),
            "verify_k_ms": med(ver) * 1e3,
            "verify_over_decode": med(ver) / med(dec),
            "decode_fast_ms": med(fast) * 1e3,
            "exact_over_fast_tok_s": med(fast) / med(dec),
            "weight_TBps_at_decode": weight_bytes / med(dec) / 1e12,
            "verify_rows_equal_decode_rows": exact,
        }
        results.append(entry)
        print(entry, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
