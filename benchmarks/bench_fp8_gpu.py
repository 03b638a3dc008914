"""Native engine with block-FP8 weights on a GPU: the FP8 tile's bandwidth per 27B GEMM shape, and
plain exact decode t/s at `qwen3.5-27b-shape-fp8` against the FP8 weight-bandwidth limit.

In one run:

1. each Qwen3.5-27B FP8 GEMM (N, K) at M = 1 and 16 inside a CUDA graph, the weight rotated
   over copies larger than L2 together, x quantized beforehand (`quantize_rows`, not timed):
   µs per call and GB/s of FP8 weight and scales;
2. the FP8 preset as `specdash run --preset` loads it (random weights block-quantized, bf16
   embedding, lm_head and GDN b|a; `--gemm-backend auto` picks triton-fp8), its
   bytes per decode step (FP8 weights + scales + bf16 rows) and the limit they set, bytes /
   the card's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s; a device-to-device copy's rate
   is printed beside it);
3. plain greedy decode (graphed, the shadow's path) t/s (median of `--repeats`) and its
   fraction of that limit, and the device time by kernel of one eager decode step;
4. speculative decoding with drafts replaying the plain output (k = 3, every fifth token
   spoiled on odd prompts) at `--batch` 1 and 8: prompts whose ids and fp32 logprob bits equal
   the lockstep shadow, and whether batch 8 gives every prompt batch 1's bits;
5. with `--sweep`, other tile configs per shape at M = 1 (last: the numbers above come first).

    python benchmarks/bench_fp8_gpu.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch
from bench_spec_gpu import plain_decode, profile_step
from cuda_timing import graph_us

from specdash.engine.drafters import RandomDrafter, ReplayDrafter
from specdash.engine.engine import Engine
from specdash.engine.loader import load_models
from specdash.engine.model import Model
from specdash.kernels.fp8 import Fp8Weight, quantize_blocks
from specdash.kernels.triton.gemm_fp8 import (
    Fp8GemmConfig,
    fp8_gemm_config,
    matmul,
    quantize_rows,
)
from specdash.settings import SessionSettings

SHAPES = {
    "attn qkv": (14336, 5120),
    "gdn in_proj qkvz": (16384, 5120),
    "o_proj / out_proj": (5120, 6144),
    "mlp gate_up": (34816, 5120),
    "mlp down": (5120, 17408),
}
HBM_TBPS = {"H100": 3.35, "H200": 4.8}


def card_tbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((v for k, v in HBM_TBPS.items() if k in name), None)


def copy_tbps() -> float:
    """Bytes read + written per second by a 2 GB device-to-device copy."""
    a_bytes = 2 << 30
    a = torch.empty(a_bytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = graph_us(lambda: b.copy_(a), reps=5)
    return 2 * a_bytes / us / 1e6


SWEEP = [(64, 256, 4, 3), (64, 128, 4, 6), (128, 256, 8, 3), (32, 256, 4, 4)]
"""(block_n, block_k, num_warps, num_stages) tried beside the shipped config with `--sweep`."""


def gemm_rows(ms: list[int], shapes: dict[str, tuple[int, int]], sweep: bool) -> list[dict]:
    rows = []
    for what, (n, k) in shapes.items():
        q, s = quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5)
        per = q.numel() + s.numel() * 4
        copies = [Fp8Weight(q.clone(), s.clone()) for _ in range(max(2, -(-150_000_000 // per)))]
        shipped = fp8_gemm_config(n, k, "block")
        configs = [shipped]
        if sweep:  # the same split-K (programs), other tiles; and the split doubled
            configs += [Fp8GemmConfig(bn, bk, shipped.split_k, w, st) for bn, bk, w, st in SWEEP]
            configs.append(replace(shipped, split_k=2 * shipped.split_k))
        cases = [(m, shipped) for m in ms] + [(ms[0], c) for c in configs[1:]]
        for m, cfg in cases:
            xq, xs = quantize_rows(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
            at = [0]

            def call(xq=xq, xs=xs, at=at, copies=copies, cfg=cfg) -> None:  # noqa: ANN001
                w = copies[at[0] % len(copies)]
                matmul(xq, xs, w.q, w.scale, "block", config=cfg)
                at[0] += 1

            try:
                us = graph_us(call, reps=len(copies) * 4)
            except Exception as e:  # a swept config the compiler refuses: say so, go on
                print({"gemm": what, "config": cfg.__dict__, "error": str(e)[:200]}, flush=True)
                continue
            row = {"gemm": what, "n": n, "k": k, "m": m, "us": us, "GBps": per / us / 1e3,
                   "shipped": cfg == shipped, "config": cfg.__dict__}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
        del copies, q, s
        torch.cuda.empty_cache()
    return rows


def spec_check(model: Model, prompts: list[list[int]], n: int, k: int) -> dict:
    vocab = model.cfg.vocab_size
    plain = Engine(model, lambda: RandomDrafter(vocab), [])
    continuation = {}
    for i, p in enumerate(prompts):
        ids, _, _ = plain_decode(plain, p, n)
        if i % 2:
            ids = [(t + 1) % vocab if j % 5 == 4 else t for j, t in enumerate(ids)]
        continuation[tuple(p)] = ids
    out: dict = {"k": k, "new_tokens": n, "prompts": len(prompts)}
    runs = {}
    for batch in (1, 8):
        engine = Engine(model, lambda: ReplayDrafter(continuation), [])
        if batch > 1:
            engine.reserve(max(map(len, prompts)), n, k, sequences=batch, shadow=True)
        queue, flight, done = list(enumerate(prompts)), [], {}
        t0 = time.perf_counter()
        with torch.inference_mode():
            while queue or flight:
                while queue and len(flight) < batch:
                    i, p = queue.pop(0)
                    flight.append(engine.start(i, p, n, k, shadow=True)[0])
                live = [s for s in flight if not s.done]
                if live:
                    engine.spec_step(live, k, "exact", n)
                for s in [s for s in flight if s.done]:
                    flight.remove(s)
                    engine.release(s)
                    done[s.index] = s
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        runs[batch] = done
        out[f"batch{batch}"] = {
            "exact_prompts": sum(s.diverged_at is None for s in done.values()),
            "tokens_per_s_with_shadow_and_capture": sum(len(s.ids) for s in done.values())
            / elapsed,
        }
    out["batch8_bits_equal_batch1"] = all(
        runs[1][i].ids == runs[8][i].ids and runs[1][i].logprobs == runs[8][i].logprobs
        for i in runs[1]
    )
    print(out, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-27b-shape-fp8")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="decode runs (median)")
    ap.add_argument("--spec-prompts", type=int, default=8)
    ap.add_argument("--spec-tokens", type=int, default=24)
    ap.add_argument("--skip-gemms", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="other tile configs, after the rest")
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "card_TBps": card_tbps(),
        "copy_TBps": copy_tbps(),
    }
    torch.cuda.empty_cache()
    print(out, flush=True)

    def finish() -> int:  # after each stage, whole (a run stopped at its limit keeps the rest)
        if args.json:
            with open(args.json + ".part", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(args.json + ".part", args.json)
        return 0

    if not args.skip_gemms:
        out["gemms"] = gemm_rows([1, 16], SHAPES, sweep=False)
        finish()
    t0 = time.perf_counter()  # the CLI's loading: memory check, `auto` picking triton-fp8
    settings = SessionSettings(preset=args.preset, device="cuda", drafter="ngram")
    model = load_models(settings).target
    cfg = model.cfg
    out["gemm_backend"] = model.gemm.name
    step_bytes = model.step_weight_bytes
    out |= {"build_s": round(time.perf_counter() - t0, 1), "step_GB": step_bytes / 1e9,
            "memory_GB": torch.cuda.memory_allocated() / 1e9}  # fmt: skip
    limit = step_bytes / (out["card_TBps"] or out["copy_TBps"]) / 1e12  # seconds per step
    out["fp8_limit_tok_s"] = 1 / limit
    print(out, flush=True)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist()
    plain = Engine(model, lambda: RandomDrafter(cfg.vocab_size), [])
    rates = [plain_decode(plain, prompt, args.decode_tokens)[2] for _ in range(args.repeats)]
    tps = statistics.median(rates)
    out["decode"] = {"context": args.prompt_len, "tokens_per_s": tps, "step_ms": 1e3 / tps,
                     "fraction_of_fp8_limit": tps * limit,
                     "weight_TBps": step_bytes * tps / 1e12, "runs_tok_s": rates}  # fmt: skip
    print(out["decode"], flush=True)
    finish()
    out["decode_profile"] = profile_step(model, prompt, 1)
    print(out["decode_profile"], flush=True)
    finish()
    prompts = [
        torch.randint(0, cfg.vocab_size, (16 + 9 * i,), generator=gen).tolist()
        for i in range(args.spec_prompts)
    ]
    out["spec"] = spec_check(model, prompts, args.spec_tokens, 3)
    finish()
    if args.sweep:
        model = None
        torch.cuda.empty_cache()
        out["sweep"] = gemm_rows([1], SHAPES, sweep=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
