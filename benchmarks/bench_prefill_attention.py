"""Prefill attention of the 27B shape (24 q heads, 4 kv heads, head_dim 256, bf16) per SDPA
backend: one 16k-token chunk from position 0 (causal) and the last chunk of a 128k prompt
(16k queries over 128k keys, lower-right causal), ms per layer, median of repeats.

Why: at 128k tokens attention is the prefill's largest FLOP term after the GEMMs, and torch
picks its backend; this shows what each would cost.

    python benchmarks/bench_prefill_attention.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HQ, HKV, D, CHUNK, TOTAL = 24, 4, 256, 16384, 131072


def time_ms(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    q = torch.randn(1, HQ, CHUNK, D, device=dev, dtype=bf)
    k = torch.randn(1, HKV, TOTAL, D, device=dev, dtype=bf)
    v = torch.randn_like(k)
    rep = HQ // HKV
    flops_first = 4 * CHUNK * CHUNK / 2 * D * HQ
    flops_last = 4 * CHUNK * (TOTAL - CHUNK / 2) * D * HQ
    rows = []
    cases = {
        "first chunk, causal": (lambda kk, vv, **kw: F.scaled_dot_product_attention(
            q, kk[:, :, :CHUNK], vv[:, :, :CHUNK], is_causal=True, **kw), flops_first),
        "last chunk, lower-right causal": (lambda kk, vv, **kw: F.scaled_dot_product_attention(
            q, kk, vv, attn_mask=causal_lower_right(CHUNK, TOTAL), **kw), flops_last),
    }  # fmt: skip
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        for case, (fn, flops) in cases.items():
            row = {"backend": backend.name, "case": case}
            try:
                with sdpa_kernel([backend]):
                    try:
                        ms = time_ms(lambda fn=fn: fn(k, v, enable_gqa=True))
                        row["gqa"] = "native"
                    except RuntimeError:  # backend without GQA: expanded K/V (not timed)
                        ke, ve = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                        ms = time_ms(lambda fn=fn, ke=ke, ve=ve: fn(ke, ve))
                        row["gqa"] = "expanded"
                        del ke, ve
                row |= {"ms": ms, "TFLOPs": flops / ms / 1e9}
            except RuntimeError as e:
                row["error"] = str(e).splitlines()[0][:160]
            rows.append(row)
            print(row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
