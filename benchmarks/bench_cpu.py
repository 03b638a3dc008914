"""CPU decode throughput: no speculation vs exact spec vs fast spec, side by side in one run.

Each configuration runs the same prompts; configurations are interleaved round-robin for
`--repeats` rounds after one warm-up round and the median t/s is reported, with the
ratios to no-spec. t/s counts generated tokens over decode time (draft + verify +
rollback; prefill and the shadow excluded — the shadow is off while timing). A final
exactness pass with the shadow on reports exact prompts for each spec mode.

`no-spec` is the exact decode the shadow runs (the baseline spec must match bit for bit);
`no-spec, fast ops` is plain greedy decode through the batched non-exact ops, the fastest
decode this engine has, reported so the exact baseline is not mistaken for it. The load
average before and after is printed: the VM is shared, so numbers are only comparable
within one run.

    python benchmarks/bench_cpu.py [--model DIR --draft DIR] [--prompts FILE] [-k 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdash.engine.loader import load_models
from specdash.events import Event, VerifyStep
from specdash.runs.native import native_session
from specdash.settings import SessionSettings

CONFIGS = {
    "no-spec": {"speculation": False},
    "no-spec, fast ops": {"speculation": False, "verify_mode": "fast"},
    "exact spec": {"verify_mode": "exact"},
    "fast spec": {"verify_mode": "fast"},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--draft", type=Path)
    p.add_argument("--drafter", default="model", choices=["model", "ngram"])
    p.add_argument("--prompts", type=Path)
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    base = SessionSettings(
        model=args.model,
        draft=args.draft,
        drafter=args.drafter,
        prompts=args.prompts,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        shadow=False,
        root_cause=False,
    )
    loaded = load_models(base)
    load_before = os.getloadavg()
    if args.num_prompts:
        from specdash.prompts import load_prompts

        prompts = load_prompts(args.prompts)[: args.num_prompts]
        tmp = Path(f"/tmp/specdash-bench-{int(time.time())}.jsonl")
        tmp.write_text("".join(json.dumps({"prompt": q.text}) + "\n" for q in prompts))
        base = base.model_copy(update={"prompts": tmp})

    phase = {name: {"draft": [], "verify": [], "rollback": []} for name in CONFIGS}
    tps: dict[str, list[float]] = {name: [] for name in CONFIGS}
    mean_acc: dict[str, float] = {}
    for rnd in range(args.repeats + 1):
        for name, update in CONFIGS.items():
            steps: list[VerifyStep] = []

            def sink(e: Event, out: list[VerifyStep] = steps) -> None:
                if isinstance(e, VerifyStep):
                    out.append(e)

            summary = native_session(base.model_copy(update=update), sink, loaded=loaded).run()
            if rnd == 0:
                continue  # warm-up
            tps[name].append(summary.tokens_per_s)
            mean_acc[name] = summary.mean_accepted_length
            for key in phase[name]:
                phase[name][key].append(sum(getattr(s, f"{key}_s") for s in steps) / len(steps))

    exact = {}
    for name in ("exact spec", "fast spec"):
        s = native_session(
            base.model_copy(update=CONFIGS[name] | {"shadow": True}), lambda e: None, loaded=loaded
        ).run()
        exact[name] = f"{s.exact_prompts}/{s.prompts}"

    base_tps = statistics.median(tps["no-spec"])
    load_after = os.getloadavg()
    print(
        f"# load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after {'/'.join(f'{x:.2f}' for x in load_after)}"
    )
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}"
    )
    print(
        f"# model {loaded.description}, k={args.k}, {args.max_new_tokens} new tokens, "
        f"median of {args.repeats} after 1 warm-up"
    )
    print(
        "| config | t/s | vs no-spec | mean accepted | draft ms/step | verify ms/step | "
        "rollback ms/step | exact prompts |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for name in CONFIGS:
        t = statistics.median(tps[name])
        ph = {k: 1e3 * statistics.median(v) for k, v in phase[name].items()}
        rows[name] = {
            "tokens_per_s": t,
            "ratio": t / base_tps,
            "phases_ms": ph,
            "mean_accepted_length": mean_acc[name],
            "exact": exact.get(name, "-"),
        }
        print(
            f"| {name} | {t:.1f} | {t / base_tps:.2f}x | {mean_acc[name]:.2f} | "
            f"{ph['draft']:.2f} | {ph['verify']:.2f} | {ph['rollback']:.3f} | "
            f"{exact.get(name, '-')} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
