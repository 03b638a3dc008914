"""Resident memory of the native engine over mixed prompt lengths, with and without
`Engine.reserve` (without it, RSS peaks follow each prompt's KV working set).

Decodes a cycle of prompts of mixed lengths (default ~120 to 8k tokens: the embedded pair has
8192 positions) with the embedded pair, exact speculation and the shadow on, sampling the
process RSS every 0.1 s on a thread. Prints, after the warm-up (the first cycle), the min /
max RSS and max/min - 1, over everything and over the decode phases only (prefill's
activations are transient).

    python benchmarks/bench_slots_rss.py [--reserve] [--lengths 120 15000 ...] [--cycles 3]
        [--max-new-tokens 32] [--trim-after-prefill]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import threading
import time

import torch

from specdash.engine.drafters import ModelDrafter
from specdash.engine.engine import Engine
from specdash.engine.loader import load_models
from specdash.prompts import load_prompts
from specdash.runs.heap import trim_heap
from specdash.settings import SessionSettings


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reserve", action="store_true")
    ap.add_argument("--lengths", type=int, nargs="+", default=[120, 8000, 600, 5000, 2000, 300])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--trim-after-prefill", action="store_true")
    a = ap.parse_args()
    loaded = load_models(SessionSettings())
    text = " ".join(p.text for p in load_prompts(None))
    base = loaded.tokenizer.encode(text)
    prompts = [(base * (n // len(base) + 1))[:n] for n in a.lengths]
    draft = loaded.draft
    engine = Engine(loaded.target, lambda: ModelDrafter(draft), loaded.eos_ids)  # type: ignore[arg-type]
    if a.reserve:
        engine.reserve(max(a.lengths), a.max_new_tokens, a.k, sequences=1, shadow=True)
    samples: list[tuple[int, str, float]] = []  # (cycle, phase, rss)
    cycle, phase = [0], ["prefill"]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((cycle[0], phase[0], rss_mb()))
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for c in range(a.cycles):
            cycle[0] = c
            for i, p in enumerate(prompts):
                phase[0] = "prefill"
                seq, _ = engine.start(i, p, a.max_new_tokens, a.k, shadow=True)
                if a.trim_after_prefill:
                    trim_heap()  # prefill's activations back to the OS
                phase[0] = "decode"
                while not seq.done:
                    engine.spec_step([seq], a.k, "exact", a.max_new_tokens)
                assert seq.diverged_at is None
                engine.release(seq)
                del seq
                trim_heap()  # what the runner does between prompt groups
    stop.set()
    after = [r for c, _, r in samples if c >= 1]
    decode = [r for c, ph, r in samples if c >= 1 and ph == "decode"]
    lo, hi = min(after), max(after)
    print(f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, command: "
          f"python {' '.join(sys.argv)}")  # fmt: skip
    print(f"prompt lengths {a.lengths}, {a.cycles} cycles, {time.perf_counter() - t0:.0f} s")
    print(f"reserve={a.reserve}, trim after prefill={a.trim_after_prefill}: RSS after warm-up "
          f"min {lo:.1f} MB, max {hi:.1f} MB, "
          f"max/min - 1 = {100 * (hi / lo - 1):.1f} %; decode phases only: min "
          f"{min(decode):.1f}, max {max(decode):.1f} MB, "
          f"{100 * (max(decode) / min(decode) - 1):.1f} %")  # fmt: skip


if __name__ == "__main__":
    main()
