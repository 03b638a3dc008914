"""The embedded tiny pair against its goals (docs/PERF.md: exact spec / no-spec and mean
accepted length), on its 24 held-out prompts, greedy.

One run reports, per prompt length (short / 2k / long) and overall:
  * mean accepted length (tokens emitted per verify step, bonus included) of the draft
    model and of the n-gram drafter at k, each with the shadow on, so every prompt is
    also checked bit for bit (ids and logprob bits) against plain greedy decoding;
  * CPU decode t/s of no-spec, exact spec, fast spec and exact spec with the n-gram
    drafter (no draft model cost), interleaved round-robin for
    `--repeats` rounds after a warm-up round (shadow off), median and ratio to no-spec;
  * where a step's time goes: median draft / verify / rollback ms per step, and decode
    ms per generated token.

    python benchmarks/bench_tiny.py [--model DIR --draft DIR --prompts FILE] [-k 4]
    python benchmarks/bench_tiny.py --compare-draft DIR --configs no-spec,"exact spec"
        # a second draft side by side: its acceptance (shadow on) and an "exact spec,
        # compare draft" speed row interleaved in the same rounds
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from specdash.engine.loader import load_models
from specdash.events import Event, Prefill, Summary, VerifyStep
from specdash.prompts import default_prompts_path
from specdash.runs.native import native_session
from specdash.settings import SessionSettings

SPEED_CONFIGS = {
    "no-spec": {"speculation": False},
    "exact spec": {"verify_mode": "exact"},
    "fast spec": {"verify_mode": "fast"},
    "exact spec, n-gram drafter": {"verify_mode": "exact", "drafter": "ngram"},
}


def run(base: SessionSettings, update: dict, loaded) -> tuple[Summary, list[VerifyStep], float]:
    """One session; returns its summary, its verify steps and its total prefill seconds."""
    steps: list[VerifyStep] = []
    prefill = [0.0]

    def sink(e: Event) -> None:
        if isinstance(e, VerifyStep):
            steps.append(e)
        elif isinstance(e, Prefill):
            prefill[0] += e.seconds

    summary = native_session(base.model_copy(update=update), sink, loaded=loaded).run()
    return summary, steps, prefill[0]


def accepted_by_length(steps: list[VerifyStep], lengths: list[str]) -> dict[str, float]:
    emitted: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for s in steps:
        for key in (lengths[s.prompt_index], "all"):
            emitted[key] += len(s.emitted_tokens)
            count[key] += 1
    return {key: emitted[key] / count[key] for key in count}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--draft", type=Path)
    p.add_argument("--prompts", type=Path)
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--speed-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--compare-draft", type=Path, help="a second draft, measured side by side")
    p.add_argument("--configs", help="comma-separated subset of the speed configs (default: all)")
    p.add_argument("--drafters", default="model,ngram", help="acceptance rows (model, ngram)")
    args = p.parse_args()
    configs = {
        name: (update, "main")
        for name, update in SPEED_CONFIGS.items()
        if not args.configs or name in args.configs.split(",")
    }
    if args.compare_draft:
        configs["exact spec, compare draft"] = ({"verify_mode": "exact"}, "compare")

    prompts_path = args.prompts or default_prompts_path()
    rows = [json.loads(line) for line in prompts_path.read_text().splitlines() if line.strip()]
    lengths = [r.get("length", "?") for r in rows]
    base = SessionSettings(
        model=args.model,
        draft=args.draft,
        prompts=prompts_path,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        shadow=True,
        root_cause=False,
    )
    loaded = load_models(base)
    models = {"main": loaded}
    if args.compare_draft:
        models["compare"] = load_models(base.model_copy(update={"draft": args.compare_draft}))
    t0 = time.monotonic()

    quality = {}
    rows_q = [(d, d, "main") for d in args.drafters.split(",")]
    if args.compare_draft:
        rows_q.append(("model (compare draft)", "model", "compare"))
    for label, drafter, which in rows_q:
        summary, steps, _ = run(base, {"drafter": drafter, "verify_mode": "exact"}, models[which])
        quality[label] = {
            "mean_accepted_length": accepted_by_length(steps, lengths),
            "exact": f"{summary.exact_prompts}/{summary.prompts}",
            "divergences": summary.divergences,
        }

    speed_base = base.model_copy(update={"shadow": False, "max_new_tokens": args.speed_new_tokens})
    tps: dict[str, list[float]] = defaultdict(list)
    accepted: dict[str, float] = {}
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rnd in range(args.repeats + 1):
        for name, (update, which) in configs.items():
            summary, steps, prefill_s = run(speed_base, update, models[which])
            if rnd == 0:
                continue  # warm-up
            tps[name].append(summary.tokens_per_s)
            accepted[name] = summary.mean_accepted_length
            for key in ("draft", "verify", "rollback"):
                phases[name][key].append(
                    1e3 * statistics.median(getattr(s, f"{key}_s") for s in steps)
                )
            phases[name]["ms/token"].append(1e3 / summary.tokens_per_s)
            phases[name]["prefill s (all prompts)"].append(prefill_s)

    base_tps = statistics.median(tps["no-spec"])
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        f"thread(s), torch {torch.__version__}, {time.monotonic() - t0:.0f} s"
    )
    print(f"# {loaded.description}, k={args.k}, greedy, {len(rows)} prompts")
    if args.compare_draft:
        print(f"# compare draft: {models['compare'].description}")
    print(f"\n## Acceptance ({args.max_new_tokens} new tokens, exact verify, shadow on)\n")
    buckets = ["short", "2k", "long", "all"]
    print("| drafter | " + " | ".join(f"mean accepted ({b})" for b in buckets) + " | exact |")
    print("|---" * (len(buckets) + 2) + "|")
    for drafter, q in quality.items():
        acc = q["mean_accepted_length"]
        cells = " | ".join(f"{acc[b]:.2f}" if b in acc else "-" for b in buckets)
        print(f"| {drafter} | {cells} | {q['exact']} |")
    print(
        f"\n## Speed ({args.speed_new_tokens} new tokens, model drafter unless named, shadow off, "
        f"median of {args.repeats} after 1 warm-up)\n"
    )
    print(
        "| config | t/s | vs no-spec | mean accepted | ms/token | draft ms/step | "
        "verify ms/step | rollback ms/step | prefill s (all prompts) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    speed = {}
    for name in configs:
        t = statistics.median(tps[name])
        ph = {key: statistics.median(v) for key, v in phases[name].items()}
        speed[name] = {
            "tokens_per_s": t,
            "ratio": t / base_tps,
            "mean_accepted_length": accepted[name],
            "phases": ph,
        }
        print(
            f"| {name} | {t:.1f} | {t / base_tps:.2f}x | {accepted[name]:.2f} | "
            f"{ph['ms/token']:.2f} | "
            f"{ph['draft']:.2f} | {ph['verify']:.2f} | {ph['rollback']:.3f} | "
            f"{ph['prefill s (all prompts)']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"quality": quality, "speed": speed}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
