"""GEMM weight-read bandwidth at decode/verify M for every Qwen3.5-27B projection, ours vs cuBLAS.

Same run, same weights, weights rotated past L2 (and do_bench flushes L2 before each call), median
of repeats after warm-up. Bandwidth = weight bytes / kernel time. Also checks, per shape, that every
row of our M=16 result equals that row computed alone (decode) and in every M=1..16 prefix, and
counts the rows where cuBLAS does not. Optional: a config sweep per shape (--sweep), DeepGEMM if it
loads, NVML GPM DRAM_BW_UTIL during a long GEMM loop next to our own bytes/time. On Hopper ours
launches with programmatic dependent launch (specdash/kernels/pdl.py), so back-to-back calls in a
graph overlap; --no-pdl-too adds ours without it, side by side.

    python benchmarks/bench_gemm.py [--sweep 2,3,7,9,10,11] [--json out.json] [--nvml]
        [--no-pdl-too]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton
from cuda_timing import graph_us
from triton.testing import do_bench

from specdash.kernels.triton import pdl
from specdash.kernels.triton.gemm import GemmConfig, gemm_config, matmul_batch_invariant

HIDDEN = 5120
# (name, N, K) for Qwen3.5-27B (docs/exactness.md §4); fused variants an engine may use.
SHAPES = [
    ("attn q_proj (gated)", 12288, HIDDEN),
    ("attn k_proj / v_proj", 1024, HIDDEN),
    ("attn qkv fused", 14336, HIDDEN),
    ("attn o_proj / gdn out_proj", HIDDEN, 6144),
    ("gdn in_proj_qkv", 10240, HIDDEN),
    ("gdn in_proj_z", 6144, HIDDEN),
    ("gdn in_proj_b / a", 48, HIDDEN),
    ("gdn in_proj fused qkvzba", 16480, HIDDEN),
    ("mlp gate / up", 17408, HIDDEN),
    ("mlp gate_up fused", 34816, HIDDEN),
    ("mlp down", HIDDEN, 17408),
    ("lm_head", 248320, HIDDEN),
]
MS = (1, 2, 4, 8, 10, 16)
ROTATE_BYTES = 512 << 20


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    count = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(count)]


def time_us(fn, ws: list[torch.Tensor], x: torch.Tensor, rep_ms: int = 40) -> float:
    i = [0]

    def call():
        i[0] += 1
        fn(x, ws[i[0] % len(ws)])

    return do_bench(call, warmup=rep_ms // 4, rep=rep_ms, return_mode="median") * 1e3


def graph_time_us(fn, ws: list[torch.Tensor], x: torch.Tensor) -> float:
    """Per-call time inside a CUDA graph of back-to-back calls over all copies (engine-like)."""
    calls = max(len(ws), 16)  # consecutive calls cycle through every weight copy
    fn(x, ws[0])
    counter = itertools.count()
    return graph_us(lambda: fn(x, ws[next(counter) % len(ws)]), reps=calls)


# The default search space, and a wider one (--wide) for the tall-K, N=5120 shapes.
SPACES = {
    "default": dict(
        bn=(32, 64, 128), bk=(64, 128, 256), split=(1, 2, 4, 8), stages=(3, 4, 6), warps=(4,)
    ),
    "wide": dict(
        bn=(16, 32, 64), bk=(128, 256, 512), split=(1, 2, 3), stages=(4, 6, 8), warps=(2, 4)
    ),
}
SPACE = SPACES["default"]


def candidate_configs(n: int, k: int) -> list[GemmConfig]:
    out = []
    for bn, bk, tma, split, stages, warps in itertools.product(
        SPACE["bn"], SPACE["bk"], (False, True), SPACE["split"], SPACE["stages"], SPACE["warps"]
    ):
        if k % (split * bk) or k // split < 512:
            continue
        if split > 1 and triton.cdiv(n, bn) * split > 8 * 132:
            continue
        if stages * (bn + 16) * bk * 2 > 200 * 1024:  # shared memory
            continue
        out.append(GemmConfig(bn, bk, split, warps, stages, tma))
    return out


def _compile_configs(jobs: list[tuple[int, int, GemmConfig]]) -> int:
    """Worker: launch each config once so Triton compiles it into the shared on-disk cache."""
    done = 0
    for n, k, cfg in jobs:
        w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
        try:
            matmul_batch_invariant(x, w, config=cfg)
            done += 1
        except Exception:  # reported by the timed sweep
            pass
    torch.cuda.synchronize()
    return done


def precompile(shapes: list[tuple[str, int, int]], workers: int) -> None:
    """Compile every sweep config in parallel processes first: compiling dominates a sweep."""
    import concurrent.futures
    import multiprocessing

    seen, jobs = set(), []
    for _, n, k in shapes:
        for cfg in candidate_configs(n, k):
            key = (cfg, n % cfg.block_n == 0)
            if key not in seen:
                seen.add(key)
                jobs.append((n, k, cfg))
    chunks = [jobs[i::workers] for i in range(workers)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        done = sum(pool.map(_compile_configs, chunks))
    print(f"precompiled {done}/{len(jobs)} kernel variants with {workers} processes", flush=True)


def sweep(n: int, k: int, ws, x) -> tuple[GemmConfig, list[dict]]:
    """Best config by CUDA-graph time, which is what the engine sees (back-to-back kernels)."""
    rows = []
    for cfg in candidate_configs(n, k):
        try:
            t = graph_time_us(lambda a, b, c=cfg: matmul_batch_invariant(a, b, config=c), ws, x)
        except Exception as exc:  # a config the compiler rejects (shared memory) is skipped
            rows.append({"config": cfg.__dict__, "error": str(exc)[:120]})
            continue
        rows.append({"config": cfg.__dict__, "us": t})
    best = min((r for r in rows if "us" in r), key=lambda r: r["us"])
    base = GemmConfig(**best["config"])
    for warps in (4, 8):
        cfg = GemmConfig(base.block_n, base.block_k, base.split_k, warps, base.num_stages, base.tma)
        if cfg == base:
            continue
        t = graph_time_us(lambda a, b, c=cfg: matmul_batch_invariant(a, b, config=c), ws, x)
        rows.append({"config": cfg.__dict__, "us": t})
    best = min((r for r in rows if "us" in r), key=lambda r: r["us"])
    return GemmConfig(**best["config"]), rows


def rows_check(fn, w: torch.Tensor) -> dict:
    """Rows of an M=16 launch vs every prefix M and vs each row alone (the decode launch)."""
    x = torch.randn(16, w.shape[1], device="cuda", dtype=torch.bfloat16)
    full = fn(x, w)
    prefix_bad = [m for m in range(1, 17) if not torch.equal(fn(x[:m], w), full[:m])]
    alone_bad = [i for i in range(16) if not torch.equal(fn(x[i : i + 1], w), full[i : i + 1])]
    perm = torch.randperm(16, device="cuda")
    perm_ok = torch.equal(fn(x[perm], w), full[perm])
    ref = x.double() @ w.double().T
    rel = ((full.double() - ref).norm() / ref.norm()).item()
    return {
        "prefix_bad_M": prefix_bad,
        "alone_bad_rows": alone_bad,
        "perm_ok": perm_ok,
        "rel_err_fp64": rel,
    }


def deepgemm_fn():
    try:
        import deep_gemm
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"

    def fn(x, w):
        out = torch.empty((x.shape[0], w.shape[0]), device="cuda", dtype=torch.bfloat16)
        deep_gemm.bf16_gemm_nt(x, w, out)
        return out

    try:
        x = torch.randn(4, 5120, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1024, 5120, device="cuda", dtype=torch.bfloat16)
        err = (fn(x, w).float() - F.linear(x, w).float()).abs().max().item()
    except Exception as exc:
        return None, f"loads but fails to run: {type(exc).__name__}: {str(exc)[:200]}"
    return fn, f"loaded {getattr(deep_gemm, '__version__', '?')}, max|diff| vs cuBLAS {err:.3g}"


def copy_tbps() -> float:
    a = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    b = torch.empty_like(a)
    t = do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median") * 1e-3
    return 2 * a.numel() / t / 1e12


def nvml_during(fn, ws, x, seconds: float = 2.0) -> dict:
    """GPM DRAM_BW_UTIL over a loop of GEMMs, next to our own bytes / elapsed time."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        bus_bits = nv.nvmlDeviceGetMemoryBusWidth(h)
        mem_mhz = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)
        peak = bus_bits / 8 * mem_mhz * 1e6 * 2 / 1e12
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    except Exception as exc:
        return {"error": f"NVML/GPM unavailable: {type(exc).__name__}: {exc}"}
    for j in range(20):
        fn(x, ws[j % len(ws)])
    torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    nv.nvmlGpmSampleGet(h, s1)
    while time.perf_counter() - t0 < seconds:
        for j in range(50):
            fn(x, ws[(calls + j) % len(ws)])
        calls += 50
        torch.cuda.synchronize()
    nv.nvmlGpmSampleGet(h, s2)
    elapsed = time.perf_counter() - t0
    try:
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.sample1, mg.sample2 = s1, s2
        mg.metrics[0].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        nv.nvmlGpmMetricsGet(mg)
        util = mg.metrics[0].value
    except Exception as exc:
        return {"error": f"GPM metrics failed: {type(exc).__name__}: {exc}"}
    own = calls * ws[0].numel() * 2 / elapsed / 1e12
    return {
        "peak_tbps": peak,
        "dram_bw_util_pct": util,
        "gpm_tbps": util / 100 * peak,
        "own_tbps": own,
        "calls": calls,
        "seconds": elapsed,
    }


def without_pdl(fn, a: torch.Tensor, b: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    mode, pdl.MODE = pdl.MODE, pdl.OFF
    try:
        return fn(a, b, config=cfg)
    finally:
        pdl.MODE = mode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default="", help="comma-separated SHAPES indices to tune at M=16")
    ap.add_argument("--compile-workers", type=int, default=12)
    ap.add_argument("--wide", action="store_true", help="the wider sweep space (SPACES)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--nvml", action="store_true")
    ap.add_argument("--shapes", default=None, help="comma-separated indices into SHAPES")
    ap.add_argument(
        "--no-pdl-too", action="store_true", help="also ours without programmatic dependent launch"
    )
    args = ap.parse_args()
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "copy_tbps": copy_tbps(),
    }
    dg, dg_reason = deepgemm_fn()
    info["deepgemm"] = dg_reason
    print(json.dumps(info), flush=True)
    backends = {"ours": matmul_batch_invariant, "cublas": F.linear}
    if dg is not None:
        backends["deepgemm"] = dg
    picked = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    swept = {SHAPES[int(i)][0] for i in args.sweep.split(",") if i}
    global SPACE
    SPACE = SPACES["wide" if args.wide else "default"]
    if swept:
        precompile([s for s in SHAPES if s[0] in swept], args.compile_workers)
    results = []
    for name, n, k in picked:
        ws = weight_copies(n, k)
        x16 = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
        entry = {"name": name, "N": n, "K": k, "copies": len(ws)}
        cfg = gemm_config(n, k, torch.bfloat16)
        if name in swept:
            t0 = time.time()
            cfg, rows = sweep(n, k, ws, x16)
            entry["sweep"] = rows
            entry["sweep_s"] = time.time() - t0
            top = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])[:4]
            print("   sweep top:", [(tuple(r["config"].values()), round(r["us"], 1)) for r in top])
        entry["config"] = cfg.__dict__
        fns = dict(backends)
        fns["ours"] = lambda a, b, c=cfg: matmul_batch_invariant(a, b, config=c)
        if args.no_pdl_too:
            fns["ours, no PDL"] = lambda a, b, c=cfg: without_pdl(matmul_batch_invariant, a, b, c)
        entry["rows_ours"] = rows_check(fns["ours"], ws[0])
        entry["rows_cublas"] = rows_check(F.linear, ws[0])
        per_m = {}
        for m in MS:
            x = x16[:m].contiguous()
            per_m[m] = {}
            for bname, fn in fns.items():
                try:
                    t = time_us(fn, ws, x)
                    g = graph_time_us(fn, ws, x)
                except Exception as exc:
                    per_m[m][bname] = {"error": str(exc)[:160]}
                    continue
                per_m[m][bname] = {
                    "us": t,
                    "tbps": n * k * 2 / t / 1e6,
                    "graph_us": g,
                    "graph_tbps": n * k * 2 / g / 1e6,
                }
        entry["per_m"] = per_m
        if args.nvml and name == "mlp gate_up fused":
            entry["nvml"] = nvml_during(fns["ours"], ws, x16[:1].contiguous())
        results.append(entry)
        line = " | ".join(
            f"M{m}: " + " ".join(f"{b}={v.get('tbps', float('nan')):.2f}" for b, v in d.items())
            for m, d in per_m.items()
        )
        print(
            f"{name} {n}x{k} cfg={cfg} rows_ours={entry['rows_ours']} "
            f"cublas_bad={entry['rows_cublas']['prefix_bad_M']}/{entry['rows_cublas']['alone_bad_rows']}"
            f"\n   {line}",
            flush=True,
        )
        if "nvml" in entry:
            print("   nvml:", entry["nvml"], flush=True)
        del ws
        torch.cuda.empty_cache()
        if args.json:  # after every shape, so a cut-off run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"info": info, "results": results}, f, indent=1)
    names = list(results[-1]["per_m"][MS[0]]) if results else []
    print("\nTB/s (weight bytes / CUDA-graph time per call), " + " / ".join(names))
    header = " | ".join(f"M={m}" for m in MS)
    print(f"| shape | N x K | BN,BK,split,warps,stages,loads | {header} |")
    for e in results:
        c = e["config"]
        cfg = f"{c['block_n']},{c['block_k']},{c['split_k']},{c['num_warps']},{c['num_stages']},"
        cfg += "tma" if c["tma"] else "ptr"
        cells = [
            " / ".join(f"{e['per_m'][m][b].get('graph_tbps', 0):.2f}" for b in names) for m in MS
        ]
        print(f"| {e['name']} | {e['N']}x{e['K']} | {cfg} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
