"""Native engine on a GPU, CUDA graphs on: decode t/s, verify/decode step time, spec envelope.

Random weights of `--preset` (default qwen3.5-27b-shape, bf16), Triton GEMM backend, exact
mode, all through `specdash.engine.engine.Engine` (the code `specdash run` uses). In one run:

1. prefill time of a `--long-prefill`-token prompt (first, before any graph pool exists), and
   side by side the same prefill with torch's flash attention instead of the Triton prefill
   attention shipped on Hopper (`--prefill-sdpa-too`) and with torch's row-wise ops instead of
   the fused row kernels (`--prefill-torch-too`) (`--prefill-only` stops there);
2. plain greedy decode (the shadow's path) at each `--contexts` length: t/s and the weight
   bytes / step time, next to NVML GPM DRAM bandwidth sampled during the decode;
3. plain-decode t/s, all graphed, interleaved repeats, each configuration on its own engine:
   exact mode (Triton tile) as shipped (the conv inside the GDN step, SwiGLU in the gate_up
   epilogue, early PDL) against the conv and SwiGLU in launches of their own, SwiGLU alone
   apart, late PDL, PDL off, the tile with the row ops before down_proj / o_proj / out_proj in
   its loads (`triton-fused`), and fast mode (cuBLAS); each exact variant's ids and logprob
   bits are compared with the shipped path's (all but `triton-fused`, whose in-tile gated norm
   may round differently, must match); then the device time by kernel of one eager decode
   step (shipped, and with the conv and SwiGLU apart) and of a verify step;
4. a verify step of k+1 rows vs a decode step (graph replay, median of repeats);
5. speculative decoding at k with an oracle drafter (replays the plain run's tokens of the
   same mode: 100% acceptance in exact mode; fast verify is not fast decode, so less there)
   and a random drafter (~0%): t/s and exact prompts (ids + fp32 logprob bits vs the
   lockstep shadow), over `--prompts` prompts.

    python benchmarks/bench_spec_gpu.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import threading
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from specdash.engine.config import preset
from specdash.engine.drafters import RandomDrafter, ReplayDrafter
from specdash.engine.engine import Engine
from specdash.engine.graphs import CapturedForward
from specdash.engine.model import PREFILL_CHUNK, Model
from specdash.engine.rows import Rows, Run, prefill_rows, triton_prefill_rows
from specdash.engine.rows.gdn import TritonGdn
from specdash.engine.state import SeqState
from specdash.kernels import gemm_backends
from specdash.kernels.triton import pdl


class GpmSampler(threading.Thread):
    """DRAM_BW_UTIL (%) windows of ~200 ms while running; peak from bus width x max clock."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.error = ""
        self.peak_gbps = 0.0

    def run(self) -> None:
        try:
            import pynvml as n

            n.nvmlInit()
            h = n.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.peak_gbps = (
                n.nvmlDeviceGetMemoryBusWidth(h)
                / 8
                * n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)
                * 1e6
                * 2
                / 1e9
            )
            s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
            n.nvmlGpmSampleGet(h, s1)
            while not self.stop.wait(0.2):
                n.nvmlGpmSampleGet(h, s2)
                mg = n.c_nvmlGpmMetricsGet_t()
                mg.version = n.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = 1
                mg.sample1, mg.sample2 = s1, s2
                mg.metrics[0].metricId = n.NVML_GPM_METRIC_DRAM_BW_UTIL
                n.nvmlGpmMetricsGet(mg)
                if mg.metrics[0].nvmlReturn == n.NVML_SUCCESS:
                    self.samples.append(mg.metrics[0].value)
                s1, s2 = s2, s1
        except Exception as e:  # report, never break the benchmark
            self.error = f"{type(e).__name__}: {e}"


def plain_decode(
    engine: Engine, prompt: list[int], n: int, gpm: GpmSampler | None = None, mode: str = "exact"
) -> tuple[list[int], list[float], float]:
    seq, _ = engine.start(0, prompt, n, 16, shadow=False)
    torch.cuda.synchronize()
    engine.spec_step([seq], 0, mode, n)  # captures the decode graph on a new slot
    if gpm is not None:
        gpm.start()
        time.sleep(0.25)  # the first GPM window opens before the timed steps
    t0 = time.perf_counter()
    steps = 0
    while not seq.done:
        engine.spec_step([seq], 0, mode, n)
        steps += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if gpm is not None:
        gpm.stop.set()
        gpm.join()
    engine.release(seq)
    return seq.ids, seq.logprobs, steps / elapsed


class ConvApartGdn(TritonGdn):
    """The exact rows' GDN with the conv in its own launch before the GDN step: the fused
    kernel's side-by-side baseline."""

    def conv_in_gdn(self, run: Run) -> bool:
        return False


def profile_step(model: Model, prompt: list[int], rows: int) -> dict:
    """Device time of one eager exact step of `rows` rows by kernel (the graphs replay these):
    rows=1 is decode, rows=k+1 a verify step, so the two tables show where verify's extra
    time goes."""
    state = SeqState.empty(model.cfg, len(prompt) + rows + 8, model.dtype, model.device)
    model.forward(torch.tensor(prompt, device=model.device), state, "prefill")
    state.in_place = True  # as on an engine slot: a decode row moves the state on in place
    tokens = torch.tensor(prompt[-rows:], device=model.device)
    for _ in range(3):
        model.forward(tokens, state, "exact")
        state.pending = {}
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward(tokens, state, "exact")
        torch.cuda.synchronize()
    state.pending = {}
    return {"rows": rows, **kernel_table(prof, 15)}


def long_prefill(model: Model, prompt: torch.Tensor) -> dict:
    """Seconds (and the kernel table) of one prefill of `prompt`, after a warm-up of two full
    chunks (the first causal, the next after cached keys: FLA autotunes per chunk shape, so a
    shorter warm-up leaves that tuning inside the timed run)."""
    try:
        torch.cuda.reset_peak_memory_stats()  # the prefill's peak, not the model build's
        state = SeqState.empty(model.cfg, len(prompt) + 8, model.dtype, model.device)
        model.forward(prompt[: 2 * PREFILL_CHUNK], state, "prefill")
        state.reset()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.forward(prompt, state, "prefill")
            torch.cuda.synchronize()
        return {
            "tokens": len(prompt),
            "s": time.perf_counter() - t1,
            "peak_GB": torch.cuda.max_memory_allocated() / 1e9,
            "profile": kernel_table(prof, 12),
        }
    except torch.OutOfMemoryError as e:
        return {"tokens": len(prompt), "error": str(e)[:200]}
    finally:
        state = None
        torch.cuda.empty_cache()


def kernel_table(prof: profile, top_n: int) -> dict:
    """Device time by kernel name from a torch profiler run."""
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            kernels.setdefault(e.name[:60], []).append(e.device_time)
    total = sum(sum(t) for t in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top_n]
    return {
        "kernels": sum(len(t) for t in kernels.values()),
        "kernel_ms": total / 1e3,
        "top": [{"name": n, "count": len(t), "ms": sum(t) / 1e3} for n, t in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-27b-shape")
    ap.add_argument("-k", type=int, default=9)
    ap.add_argument("--contexts", default="2048,32768")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--spec-tokens", type=int, default=40)
    ap.add_argument("--long-prefill", type=int, default=131072)
    ap.add_argument("--prefill-torch-too", action="store_true", help="and with torch row ops")
    ap.add_argument("--prefill-sdpa-too", action="store_true", help="and with torch's SDPA")
    ap.add_argument("--prefill-only", action="store_true", help="stop after the long prefill")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = preset(args.preset)
    t0 = time.perf_counter()
    model = Model.random(cfg, 0, torch.bfloat16, dev, gemm_backends.resolve("triton", dev))
    weight_bytes = model.step_weight_bytes
    out: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "build_s": round(time.perf_counter() - t0, 1),
        "weights_read_per_step_GB": weight_bytes / 1e9,
    }
    print(out, flush=True)
    gen = torch.Generator().manual_seed(1)

    def rand_prompt(n: int) -> list[int]:
        return torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()

    if args.long_prefill:
        torch.cuda.empty_cache()
        shipped = model.rows["prefill"]
        variants = {"long_prefill": shipped}
        if args.prefill_sdpa_too:  # side by side: the same prefill with torch's flash attention
            sdpa = triton_prefill_rows(cfg, model.rope, attention_kernel=False)
            variants["long_prefill_sdpa_attention"] = sdpa
        if args.prefill_torch_too:  # side by side: the same prefill with torch's row-wise ops
            variants["long_prefill_torch_rows"] = prefill_rows(cfg, model.rope, gdn_kernel=True)
        p = torch.tensor(rand_prompt(args.long_prefill), device=dev)
        for key, rows in variants.items():
            model.rows["prefill"] = rows
            out[key] = long_prefill(model, p)
            print(key, out[key], flush=True)
        model.rows["prefill"] = shipped
        p = None
        torch.cuda.empty_cache()
    if args.prefill_only:
        return finish(out, args.json)
    plain = Engine(model, lambda: RandomDrafter(cfg.vocab_size), [])  # k=0: never asked
    out["decode"] = []
    for ctx in [int(c) for c in args.contexts.split(",")]:
        gpm = GpmSampler()
        _, _, tps = plain_decode(plain, rand_prompt(ctx), args.decode_tokens, gpm)
        kv_bytes = ctx * 64 * 1024  # 16 attention layers x 4 KiB/token x K and V, bf16
        row = {
            "context": ctx,
            "tokens_per_s": tps,
            "step_ms": 1e3 / tps,
            "own_count_TBps": (weight_bytes + kv_bytes) * tps / 1e12,
            "gpm_dram_bw_util_pct_median": statistics.median(gpm.samples) if gpm.samples else None,
            "gpm_peak_TBps": gpm.peak_gbps / 1e3,
            "gpm_error": gpm.error,
        }
        if gpm.samples:
            row["gpm_TBps"] = row["gpm_dram_bw_util_pct_median"] / 100 * gpm.peak_gbps / 1e3
        out["decode"].append(row)
        print(row, flush=True)

    # PDL modes (exact, Triton tile), and exact vs fast mode (cuBLAS, batched: the usual way);
    # each on its own engine, so each captures its own graphs
    exact_gemm, cublas = model.gemm, gemm_backends.resolve("cublas", dev)
    fused = gemm_backends.resolve("triton-fused", dev)
    swiglu_apart = replace(exact_gemm, gate_up_swiglu=None)  # the SwiGLU row kernel's launch
    fused_rows = model.rows["exact"]
    conv_apart = Rows(
        fused_rows.rowwise, fused_rows.attention, ConvApartGdn(cfg, fused_rows.rowwise)
    )
    variants = {  # name: (backend, exact rows, mode, PDL mode)
        "exact/triton": (exact_gemm, fused_rows, "exact", pdl.MODE),
        "exact/triton, conv and SwiGLU apart": (swiglu_apart, conv_apart, "exact", pdl.MODE),
        "exact/triton, SwiGLU apart": (swiglu_apart, fused_rows, "exact", pdl.MODE),
        "exact/triton, late PDL": (exact_gemm, fused_rows, "exact", pdl.LATE),
        "exact/triton-fused": (fused, fused_rows, "exact", pdl.MODE),  # row ops in loads
        "exact/triton, no PDL": (exact_gemm, fused_rows, "exact", pdl.OFF),
        "fast/cublas": (cublas, fused_rows, "fast", pdl.MODE),
    }
    shipped = pdl.MODE
    engines = {name: Engine(model, plain.make_drafter, []) for name in variants}
    ratio_prompt, runs = rand_prompt(2048), {name: [] for name in variants}
    outputs: dict[str, tuple[list[int], list[float]]] = {}
    for _ in range(3):
        for name, (backend, rows, mode, pdl_mode) in variants.items():
            model.gemm, model.rows["exact"], pdl.MODE = backend, rows, pdl_mode
            ids, lps, tps = plain_decode(engines[name], ratio_prompt, args.decode_tokens, mode=mode)
            runs[name].append(tps)
            outputs.setdefault(name, (ids, lps))
    model.gemm, model.rows["exact"], pdl.MODE = exact_gemm, fused_rows, shipped
    engines = None
    med = {name: statistics.median(r) for name, r in runs.items()}
    exact_names = [n for n in variants if n.startswith("exact")]
    out["exact_over_fast_decode"] = {
        "tokens_per_s": med,
        "runs": runs,
        "ratio": med["exact/triton"] / med["fast/cublas"],
        "pdl_on_over_off": med["exact/triton"] / med["exact/triton, no PDL"],
        "shipped_over_late_pdl": med["exact/triton"] / med["exact/triton, late PDL"],
        "conv_swiglu_fused_over_apart": med["exact/triton"]
        / med["exact/triton, conv and SwiGLU apart"],
        "conv_fused_over_apart": med["exact/triton, SwiGLU apart"]
        / med["exact/triton, conv and SwiGLU apart"],
        "prologues_over_shipped": med["exact/triton-fused"] / med["exact/triton"],
        "same_ids_and_logprob_bits_as_shipped": {
            n: outputs[n][0] == outputs["exact/triton"][0]
            and torch.equal(torch.tensor(outputs[n][1]), torch.tensor(outputs["exact/triton"][1]))
            for n in exact_names
        },
    }
    print(out["exact_over_fast_decode"], flush=True)
    torch.cuda.empty_cache()
    profile_prompt = rand_prompt(2048)
    out["step_profiles"] = [profile_step(model, profile_prompt, r) for r in (1, args.k + 1)]
    model.gemm, model.rows["exact"] = swiglu_apart, conv_apart  # launches and time, side by side
    out["step_profile_conv_swiglu_apart_decode"] = profile_step(model, profile_prompt, 1)
    model.gemm, model.rows["exact"] = exact_gemm, fused_rows
    for p in out["step_profiles"]:
        print(p, flush=True)

    # verify (k+1 rows) vs decode (1 row), graph replays from the same position
    state = SeqState.empty(cfg, 4096, model.dtype, dev)
    model.forward(torch.tensor(rand_prompt(2048), device=dev), state, "prefill")
    state.in_place = True  # from here on the graphs hold its buffers, as on an engine slot
    times: dict[int, list[float]] = {1: [], args.k + 1: []}
    rows = torch.tensor(rand_prompt(args.k + 1), device=dev)
    captured = {t: CapturedForward(model, state, t, "exact") for t in times}
    for t in times:
        captured[t].replay(rows[:t], [state])
        state.pending = {}
    for _ in range(20):
        for t in times:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            captured[t].replay(rows[:t], [state])
            torch.cuda.synchronize()
            times[t].append(time.perf_counter() - t1)
            state.pending = {}
    dec, ver = statistics.median(times[1]), statistics.median(times[args.k + 1])
    out["verify_over_decode"] = {
        "k": args.k,
        "decode_ms": dec * 1e3,
        "verify_ms": ver * 1e3,
        "ratio": ver / dec,
    }
    print(out["verify_over_decode"], flush=True)

    # spec envelope over many prompts, shadow on, exact mode
    prompts = [rand_prompt(args.prompt_len) for _ in range(args.prompts)]
    continuation = {}
    for mode, backend in (("exact", exact_gemm), ("fast", cublas)):
        model.gemm = backend
        continuation[mode] = {
            tuple(p): plain_decode(plain, p, args.spec_tokens + args.k + 1, mode=mode)[0]
            for p in prompts
        }
    out["spec"] = []
    for name, make, mode, backend in (
        ("oracle", lambda: ReplayDrafter(continuation["exact"]), "exact", exact_gemm),
        ("oracle", lambda: ReplayDrafter(continuation["fast"]), "fast", cublas),
        ("random", lambda: RandomDrafter(cfg.vocab_size), "exact", exact_gemm),
    ):
        model.gemm = backend
        eng = Engine(model, make, [])
        warm, _ = eng.start(0, prompts[0], args.spec_tokens, 16, shadow=True)
        while not warm.done:  # capture every graph this run will replay
            eng.spec_step([warm], args.k, mode, args.spec_tokens)
        eng.release(warm)
        exact, tokens, spent, steps, accepted = 0, 0, 0.0, 0, 0
        for i, p in enumerate(prompts):
            seq, _ = eng.start(i, p, args.spec_tokens, 16, shadow=True)
            while not seq.done:
                (r,) = eng.spec_step([seq], args.k, mode, args.spec_tokens)
                spent += r.draft_s + r.verify_s + r.rollback_s
                steps += 1
                accepted += r.accepted
            tokens += len(seq.ids)
            exact += seq.diverged_at is None and seq.compared == len(seq.ids)
            eng.release(seq)
        row = {
            "drafter": name,
            "verify": mode,
            "gemm": backend.name,
            "k": args.k,
            "prompts": len(prompts),
            "exact_prompts": exact,
            "tokens_per_s": tokens / spent,
            "mean_accepted_length": (accepted + steps) / steps,
        }
        out["spec"].append(row)
        print(row, flush=True)

    return finish(out, args.json)


def finish(out: dict, path: str | None) -> int:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
