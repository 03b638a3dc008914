"""Prefill attention of the 27B shape (24 q heads, 4 kv heads, head_dim 256, bf16) per SDPA backend
and per config of the Triton kernel (specdash/kernels/triton/prefill_attention.py): one
16k-token chunk from position 0 (causal) and the last chunk of a 128k prompt (16k queries over
128k keys, lower-right causal), on the same tensors in the engine's layout (q [T, Hq, D], caches
[Hkv, L, D]). Per row: ms per layer (median of repeats after a warm-up), TFLOP/s, the speedup
over torch's FlashAttention-2 and the max abs difference from FA2's output.

Why: at 128k tokens attention is the prefill's largest FLOP term after the GEMMs; this shows
what each backend and each kernel config would cost. A config that fails to compile or launch
gets its error in its row, and the sweep goes on.

python benchmarks/bench_prefill_attention.py [--json out.json] [--reps 5]"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from specdash.kernels.triton.prefill_attention import CANDIDATES, causal_prefill_attention

HQ, HKV, D, CHUNK, TOTAL = 24, 4, 256, 16384, 131072
SCALE = D**-0.5


def time_ms(fn, reps: int) -> float:
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


def _error(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {(lines[-1] if lines else '')[:300]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    q = torch.randn(CHUNK, HQ, D, device=dev, dtype=bf)
    k = torch.randn(HKV, TOTAL, D, device=dev, dtype=bf)
    v = torch.randn_like(k)
    rep = HQ // HKV
    # case -> (start, keys, FLOPs, SDPA mask arguments)
    cases = {
        "first chunk, causal": (0, CHUNK, 4 * CHUNK * CHUNK / 2 * D * HQ, {"is_causal": True}),
        "last chunk, lower-right causal": (
            TOTAL - CHUNK,
            TOTAL,
            4 * CHUNK * (TOTAL - CHUNK / 2) * D * HQ,
            {"attn_mask": causal_lower_right(CHUNK, TOTAL)},
        ),
    }
    rows, fa2 = [], {}  # fa2: case -> (ms, output [1, Hq, T, D])

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    q4 = q.transpose(0, 1)[None]  # as specdash.engine.ops.attention_batched calls SDPA
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        for case, (_, n, flops, mask) in cases.items():
            row = {"backend": backend.name, "case": case}

            def fn(kk=k[None, :, :n], vv=v[None, :, :n], mask=mask, **kw):
                return F.scaled_dot_product_attention(q4, kk, vv, scale=SCALE, **mask, **kw)

            try:
                with sdpa_kernel([backend]):
                    try:
                        ms = time_ms(lambda fn=fn: fn(enable_gqa=True), args.reps)
                        row["gqa"] = "native"
                        if backend == SDPBackend.FLASH_ATTENTION:
                            fa2[case] = (ms, fn(enable_gqa=True))
                    except RuntimeError:  # backend without GQA: expanded K/V (not timed)
                        ke = k[None, :, :n].repeat_interleave(rep, 1)
                        ve = v[None, :, :n].repeat_interleave(rep, 1)
                        ms = time_ms(lambda fn=fn, ke=ke, ve=ve: fn(ke, ve), args.reps)
                        row["gqa"] = "expanded"
                        del ke, ve
                row |= {"ms": ms, "TFLOPs": flops / ms / 1e9}
            except RuntimeError as e:
                row["error"] = _error(e)
            emit(row)

    for cfg in CANDIDATES:
        for case, (start, _, flops, _) in cases.items():
            row = {"backend": "TRITON", "config": asdict(cfg), "case": case}

            def run(cfg=cfg, start=start):
                return causal_prefill_attention(q, k, v, start, SCALE, cfg)

            try:
                out = run()  # compiles on the first case
                torch.cuda.synchronize()
                ms = time_ms(run, args.reps)
                row |= {"ms": ms, "TFLOPs": flops / ms / 1e9}
                if case in fa2:
                    fa2_ms, fa2_out = fa2[case]
                    diff = (out.transpose(0, 1)[None].float() - fa2_out.float()).abs().max()
                    row |= {"speedup_vs_fa2": fa2_ms / ms, "max_abs_diff_vs_fa2": diff.item()}
                del out
            except Exception as e:  # a compile error or an out-of-resources launch: record it
                row["error"] = _error(e)
            emit(row)

    print(f"\n{'backend / config':<48} {'case':<31} {'ms':>8} {'TFLOP/s':>8} {'vs FA2':>7}")
    for r in rows:
        name = r["backend"]
        if "config" in r:
            c = r["config"]
            name = (f"triton {c['block_m']}x{c['block_n']} w{c['num_warps']} "
                    f"s{c['num_stages']} {'tma' if c['tma'] else 'ptr'}")  # fmt: skip
        if "error" in r:
            print(f"{name:<48} {r['case']:<31} {r['error'][:80]}")
        else:
            speedup = f"{r['speedup_vs_fa2']:.2f}x" if "speedup_vs_fa2" in r else ""
            print(f"{name:<48} {r['case']:<31} {r['ms']:>8.1f} {r['TFLOPs']:>8.0f} {speedup:>7}")
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump(meta | {"triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
