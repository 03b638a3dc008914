"""Native engine with block-FP8 weights on a GPU: the FP8 tile's bandwidth per 27B GEMM shape, and
plain exact decode t/s at `qwen3.5-27b-shape-fp8` against the FP8 weight-bandwidth limit.

In one run:

1. each Qwen3.5-27B FP8 GEMM (N, K) at M = 1 and 16 inside a CUDA graph, the weight rotated
   over copies larger than L2 together: µs per call and GB/s of FP8 weight and scales;
2. the FP8 preset (random weights block-quantized, bf16 embedding, lm_head and GDN b|a), its
   bytes per decode step (FP8 weights + scales + bf16 rows) and the limit they set, bytes /
   the card's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s; a device-to-device copy's rate
   is printed beside it);
3. plain greedy decode (graphed, the shadow's path) t/s and its fraction of that limit, and
   the device time by kernel of one eager decode step;
4. speculative decoding with drafts replaying the plain output (k = 3, every fifth token
   spoiled on odd prompts) at `--batch` 1 and 8: prompts whose ids and fp32 logprob bits equal
   the lockstep shadow, and whether batch 8 gives every prompt batch 1's bits.

    python benchmarks/bench_fp8_gpu.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch
from bench_spec_gpu import plain_decode, profile_step
from cuda_timing import graph_us

from specdash.engine.config import preset
from specdash.engine.drafters import RandomDrafter, ReplayDrafter
from specdash.engine.engine import Engine
from specdash.engine.model import Model
from specdash.kernels import gemm_backends
from specdash.kernels.fp8 import Fp8Weight, quantize_blocks
from specdash.kernels.triton.gemm_fp8 import fp8_gemm_config, linear

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
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = graph_us(lambda: b.copy_(a), reps=5)
    return 2 * a.numel() / us / 1e6


def gemm_rows(ms: list[int]) -> list[dict]:
    rows = []
    for what, (n, k) in SHAPES.items():
        q, s = quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5)
        per = q.numel() + s.numel() * 4
        copies = [Fp8Weight(q.clone(), s.clone()) for _ in range(max(2, -(-150_000_000 // per)))]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            at = [0]

            def call(x: torch.Tensor = x, at: list[int] = at, copies: list = copies) -> None:
                linear(x, copies[at[0] % len(copies)])
                at[0] += 1

            us = graph_us(call, reps=len(copies) * 4)
            cfg = fp8_gemm_config(n, k, "block")
            row = {"gemm": what, "n": n, "k": k, "m": m, "us": us, "GBps": per / us / 1e3,
                   "config": cfg.__dict__}  # fmt: skip
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
    ap.add_argument("--spec-prompts", type=int, default=8)
    ap.add_argument("--spec-tokens", type=int, default=24)
    ap.add_argument("--skip-gemms", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "card_TBps": card_tbps(),
        "copy_TBps": copy_tbps(),
    }
    print(out, flush=True)

    def finish() -> int:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0

    if not args.skip_gemms:
        out["gemms"] = gemm_rows([1, 16])
        finish()
    t0 = time.perf_counter()
    cfg = preset(args.preset)
    model = Model.random(cfg, 0, torch.bfloat16, dev, gemm_backends.resolve("triton-fp8", dev))
    step_bytes = model.step_weight_bytes
    out |= {"build_s": round(time.perf_counter() - t0, 1), "step_GB": step_bytes / 1e9,
            "memory_GB": torch.cuda.memory_allocated() / 1e9}  # fmt: skip
    limit = step_bytes / (out["card_TBps"] or out["copy_TBps"]) / 1e12  # seconds per step
    out["fp8_limit_tok_s"] = 1 / limit
    print(out, flush=True)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist()
    plain = Engine(model, lambda: RandomDrafter(cfg.vocab_size), [])
    _, _, tps = plain_decode(plain, prompt, args.decode_tokens)
    out["decode"] = {"context": args.prompt_len, "tokens_per_s": tps, "step_ms": 1e3 / tps,
                     "fraction_of_fp8_limit": tps * limit,
                     "weight_TBps": step_bytes * tps / 1e12}  # fmt: skip
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
    return finish()


if __name__ == "__main__":
    sys.exit(main())
