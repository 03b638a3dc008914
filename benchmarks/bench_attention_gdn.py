"""Decode attention and GDN step timings on the Qwen3.5-27B shapes, plus the decode == verify check.

Attention: 24 q heads, 4 kv heads, head_dim 256, pinned split; decode row vs a k=9 verify (10 rows
issued as decode rows). GDN: 16 k-heads, 48 v-heads, 128 x 128 fp32 state; one decode step vs a
10-token verify writing every step's state. Prefill: the torch chunked GDN (and FLA's, if it
imports) at a few lengths. Times: median of do_bench (L2 flushed) and of CUDA-graph replays.

    python benchmarks/bench_attention_gdn.py [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
import triton
from cuda_timing import graph_us
from triton.testing import do_bench

from specdash.engine.ops import gdn_chunked_prefill, gdn_prefill
from specdash.kernels.triton.decode_attention import decode_attention, verify_as_decode_rows
from specdash.kernels.triton.gdn import (
    gdn_recurrent_step,
    gdn_verify_steps,
)

HQ, HKV, HEAD_DIM = 24, 4, 256
GDN_H, GDN_HV, GDN_D = 16, 48, 128
VERIFY_T = 10


def bench_us(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def attention_at(ctx: int) -> dict:
    lmax = ctx + 64
    k = torch.randn(1, HKV, lmax, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(1, VERIFY_T, HQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([ctx], device="cuda", dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    ver = verify_as_decode_rows(q, k, v, lens, scale)
    q_rows = [q[:, t].contiguous() for t in range(VERIFY_T)]
    exact = all(
        torch.equal(decode_attention(q_rows[t], k, v, lens + 1 + t, scale), ver[:, t])
        for t in range(VERIFY_T)
    )
    lens1 = lens + 1

    def decode():
        return decode_attention(q_rows[0], k, v, lens1, scale)

    def verify():
        return verify_as_decode_rows(q, k, v, lens, scale)

    dec_g, ver_g = graph_us(decode), graph_us(verify)
    rep = HQ // HKV
    ref = torch.nn.functional.scaled_dot_product_attention(
        q_rows[0][:, :, None].float(),
        k[:, :, : ctx + 1].float().repeat_interleave(rep, 1),
        v[:, :, : ctx + 1].float().repeat_interleave(rep, 1),
        scale=scale,
    )[:, :, 0]
    rel = ((decode().float() - ref).norm() / ref.norm()).item()
    kv_bytes = 2 * HKV * (ctx + 1) * HEAD_DIM * 2
    return {
        "ctx": ctx,
        "decode_us": bench_us(decode),
        "decode_graph_us": dec_g,
        "verify10_us": bench_us(verify),
        "verify10_graph_us": ver_g,
        "verify_over_decode_graph": ver_g / dec_g,
        "decode_kv_tbps": kv_bytes / dec_g / 1e6,
        "decode_eq_verify": exact,
        "rel_err_vs_fp32_sdpa": rel,
    }


def attention_sweep(results: dict, splits: list[int]) -> None:
    """Decode and verify graph times of each split-kernel config, to pick the pinned one."""
    import itertools

    from specdash.kernels.triton import decode_attention as da

    rows = []
    configs = itertools.product(splits, (16, 32), (32, 64), (4, 8), (2, 3))
    for split, tile_m, block_t, warps, stages in configs:
        if split % block_t:
            continue
        da.CONFIG = da.AttentionConfig(split, block_t, tile_m, warps, stages)
        try:
            per_ctx = {ctx: attention_at(ctx) for ctx in (2048, 32768)}
        except Exception as exc:
            print("config", da.CONFIG, "failed:", str(exc)[:120], flush=True)
            continue
        row = {"config": [split, block_t, tile_m, warps, stages]}
        for ctx, r in per_ctx.items():
            row[f"decode_{ctx}_us"] = r["decode_graph_us"]
            row[f"verify_{ctx}_us"] = r["verify10_graph_us"]
            row["exact"] = row.get("exact", True) and r["decode_eq_verify"]
        rows.append(row)
        print("sweep", row, flush=True)
    results["attention_sweep"] = rows


def attention(results: dict) -> None:
    for ctx in (2048, 8192, 32768):
        row = attention_at(ctx)
        results.setdefault("attention", []).append(row)
        print("attention", row, flush=True)


def gdn(results: dict) -> None:
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(1, VERIFY_T, GDN_H, GDN_D, device=dev, dtype=bf)
    k = torch.randn_like(q)
    v = torch.randn(1, VERIFY_T, GDN_HV, GDN_D, device=dev, dtype=bf)
    a = torch.randn(1, VERIFY_T, GDN_HV, device=dev, dtype=bf)
    b = torch.randn_like(a)
    a_log = torch.randn(GDN_HV, device=dev)
    dt_bias = torch.randn(GDN_HV, device=dev)
    state = torch.randn(1, GDN_HV, GDN_D, GDN_D, device=dev)
    o, states = gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state)
    st, exact = state, True
    for t in range(VERIFY_T):
        od, st = gdn_recurrent_step(q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], a_log, dt_bias, st)
        exact &= torch.equal(od, o[:, t]) and torch.equal(st, states[:, t])
    args1 = (q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0], a_log, dt_bias, state)
    step_g = graph_us(lambda: gdn_recurrent_step(*args1))
    step = bench_us(lambda: gdn_recurrent_step(*args1))
    ver_g = graph_us(lambda: gdn_verify_steps(q, k, v, a, b, a_log, dt_bias, state))
    state_bytes = 2 * state.numel() * 4
    row = {
        "decode_step_us": step,
        "decode_step_graph_us": step_g,
        "verify10_graph_us": ver_g,
        "step_state_rw_tbps": state_bytes / step_g / 1e6,
        "decode_eq_verify": exact,
        "per_layer_state_MB": state.numel() * 4 / 1e6,
    }
    results["gdn"] = row
    print("gdn", row, flush=True)
    results["gdn_prefill"] = []
    for t in (4096, 16384, 131072):
        entry = prefill_at(t, a_log, dt_bias, state)
        results["gdn_prefill"].append(entry)
        print("gdn prefill", entry, flush=True)


def prefill_at(t: int, a_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor) -> dict:
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(1, t, GDN_H, GDN_D, device=dev, dtype=bf)
    k = torch.randn_like(q)
    v = torch.randn(1, t, GDN_HV, GDN_D, device=dev, dtype=bf)
    a = torch.randn(1, t, GDN_HV, device=dev, dtype=bf)
    b = torch.randn_like(a)

    def torch_run():
        return gdn_chunked_prefill(q, k, v, a, b, a_log, dt_bias, state)

    entry = {"T": t}
    if t <= 16384:  # the torch reference takes seconds beyond
        entry["torch_chunked_ms"] = do_bench(torch_run, warmup=1, rep=1)
    try:
        import fla  # noqa: F401  (gdn_prefill falls back to torch without it)

        def fla_run():
            return gdn_prefill(q, k, v, a, b, a_log, dt_bias, state)

        entry["fla_ms"] = do_bench(fla_run, warmup=2, rep=10, return_mode="median")
        if t > 16384:
            return entry
        fo, fs = fla_run()
        to, ts = torch_run()
        entry["fla_vs_torch_state_rel"] = ((fs.float() - ts).norm() / ts.norm()).item()
        entry["fla_vs_torch_out_rel"] = (
            (fo.float() - to.float()).norm() / to.float().norm()
        ).item()
    except Exception as exc:
        entry["fla"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--attention-sweep", action="store_true", help="only sweep attention configs")
    ap.add_argument("--splits", default="256", help="split sizes the sweep tries (tokens)")
    args = ap.parse_args()
    results = {
        "info": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "command": " ".join(sys.argv),
        }
    }
    if args.attention_sweep:
        attention_sweep(results, [int(s) for s in args.splits.split(",")])
    else:
        attention(results)
        gdn(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
