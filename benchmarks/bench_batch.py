"""Aggregate decode throughput with real batching: B sequences decoded and verified in one
forward, B = 1, 8, 32, plain (k = 0) and exact speculative.

Every cell decodes the same prompts (`--prompts`, default the largest B; the shipped prompt
set, cycled and cut or repeated to `--context` tokens), `--max-new-tokens` each, with up to B
sequences in flight (continuous batching), and times the decode steps only (prefill excluded,
shadow off). Aggregate tok/s = generated tokens of all prompts / step seconds. One warm-up
round, then `--repeats` rounds; the median is printed.
Exactness across B is what tests/engine/test_batch_exact.py proves; here the engine's shadow is off.

    python benchmarks/bench_batch.py [--device cpu|cuda] [--preset qwen3.5-27b-shape]
        [--model DIR --draft DIR] [--drafter model|ngram] [-k 4 (0: plain only)] [--batches 1 8 32]
        [--context 256] [--max-new-tokens 32] [--repeats 3] [--prompts N] [--json FILE]
        [--profile]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdash.engine.drafters import Drafter, ModelDrafter, NgramDrafter
from specdash.engine.engine import Engine
from specdash.engine.loader import Loaded, load_models
from specdash.prompts import load_prompts
from specdash.settings import SessionSettings


def prompt_ids(loaded: Loaded, n: int, context: int) -> list[list[int]]:
    texts = [p.text for p in load_prompts(None)]
    out = []
    for i in range(n):
        ids = loaded.tokenizer.encode(texts[i % len(texts)]) or [0]
        ids = (ids * (context // len(ids) + 1))[i // len(texts) :][:context]
        out.append(ids)
    return out


def make_engine(
    loaded: Loaded, drafter: str, prompts: list[list[int]], batch: int, k: int, new: int
) -> Engine:
    def make() -> Drafter:
        if drafter == "model" and loaded.draft is not None:
            return ModelDrafter(loaded.draft)
        return NgramDrafter()

    engine = Engine(loaded.target, make, [])  # no EOS: every sequence runs `new` tokens
    engine.reserve(max(map(len, prompts)), new, max(k, 1), batch, shadow=False)
    return engine


def profile_steps(
    loaded: Loaded, drafter: str, prompts: list[list[int]], batch: int, k: int, new: int
) -> None:
    """Where a batched step's time goes: `batch` sequences prefilled (not profiled), then their
    steps under torch.profiler: the summed kernel time per step (the GPU's busy time; compare
    with the timed cells' ms per step: the rest is the host) and the top kernels. The wall
    time printed is the profiler's (tracing CUDA graph replays costs it far more than the
    engine), not a step time."""
    from torch.profiler import ProfilerActivity, profile

    engine = make_engine(loaded, drafter, prompts, batch, k, new)
    with torch.inference_mode():
        flight = [
            engine.start(i, p, new, max(k, 1), shadow=False)[0]
            for i, p in enumerate(prompts[:batch])
        ]
        engine.spec_step(flight, k, "exact", new)  # warm-up (compiles)
        sync()
        cuda = torch.cuda.is_available()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        steps, t0 = 0, time.perf_counter()
        with profile(activities=acts) as prof:
            while not any(s.done for s in flight):
                engine.spec_step(flight, k, "exact", new)
                steps += 1
            sync()
        wall = (time.perf_counter() - t0) / max(steps, 1)
    events = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == cuda]
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, key) for e in events) / 1e3 / max(steps, 1)
    print(
        f"profile B={batch} k={k}: {steps} steps, profiled wall {wall * 1e3:.1f} ms/step, "
        f"kernels {busy:.1f} ms/step ({'GPU' if cuda else 'CPU self'} time)"
    )
    for e in sorted(events, key=lambda e: -getattr(e, key))[:10]:
        per = getattr(e, key) / 1e3 / max(steps, 1)
        print(f"  {per:7.2f} ms/step  {e.count / max(steps, 1):6.0f}/step  {e.key[:90]}")


def cell(engine: Engine, prompts: list[list[int]], batch: int, k: int, new: int) -> float:
    """Aggregate tok/s over the prompt set with up to `batch` sequences in flight (continuous
    batching: a finished sequence's slot takes the next prompt), one batched step at a time;
    only the steps are timed (prefill is not). The engine is the warm-up round's, so its CUDA
    graphs are captured before the timed rounds."""
    k_max = max(k, 1)
    queue, flight, tokens, seconds = list(enumerate(prompts)), [], 0, 0.0
    with torch.inference_mode():
        while queue or flight:
            while queue and len(flight) < batch:
                i, p = queue.pop(0)
                flight.append(engine.start(i, p, new, k_max, shadow=False)[0])
            sync()
            t0 = time.perf_counter()
            engine.spec_step(flight, k, "exact", new)
            sync()
            seconds += time.perf_counter() - t0
            for s in [s for s in flight if s.done]:
                flight.remove(s)
                engine.release(s)
                tokens += len(s.ids) - 1  # the prefill's token is not a decode token
    return tokens / seconds


def sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--drafter", choices=["model", "ngram"], default="model")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, help="prompts per cell (default: the largest B)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true", help="then profile steps at the largest B")
    a = ap.parse_args()
    settings = SessionSettings(
        model=a.model, draft=a.draft, preset=a.preset, drafter=a.drafter, device=a.device
    )
    loaded = load_models(settings)
    drafter = a.drafter if loaded.draft is not None else "ngram"
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor()
    device = device or platform.machine()
    print(f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"device: {a.device} ({device}, {torch.get_num_threads()} threads),",
        f"torch {torch.__version__}",
    )
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"model: {loaded.description}, drafter {drafter},",
        f"context {a.context}, new {a.max_new_tokens}",
    )
    prompts = prompt_ids(loaded, a.prompts or max(a.batches), a.context)
    configs = {"plain": 0, f"exact spec k={a.k}": a.k} if a.k else {"plain": 0}
    results: dict[str, dict[int, float]] = {}
    for name, k in configs.items():
        results[name] = {}
        for b in a.batches:
            engine = make_engine(loaded, drafter, prompts, b, k, a.max_new_tokens)
            cell(engine, prompts, b, k, a.max_new_tokens)  # warm-up: compiles, captures
            runs = [cell(engine, prompts, b, k, a.max_new_tokens) for _ in range(a.repeats)]
            del engine  # its slots and graphs
            results[name][b] = statistics.median(runs)
            print(f"  {name} B={b}: {results[name][b]:.1f} tok/s", flush=True)
    head = (
        " | ".join(f"B={b} tok/s" for b in a.batches)
        + " | "
        + " | ".join(f"B={b}/B=1" for b in a.batches[1:])
    )
    print(f"| config | {head} |")
    print("|---" * (1 + 2 * len(a.batches) - 1) + "|")
    for name, r in results.items():
        base = r[a.batches[0]]
        cells = [f"{r[b]:.1f}" for b in a.batches] + [f"{r[b] / base:.2f}x" for b in a.batches[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if a.profile:
        for k in configs.values():
            profile_steps(loaded, drafter, prompts, max(a.batches), k, a.max_new_tokens)
    if a.json:
        a.json.write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))


if __name__ == "__main__":
    main()
