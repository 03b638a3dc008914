"""Continue distilling the shipped draft toward the fixed shipped target (target untouched).

    python -m training.distill_draft --data specdash/data --out /tmp/draft2 --minutes 8

Loads target and draft from `--data`, regenerates the tokenizer-identical corpus stream,
builds distillation data (target greedy continuations of train windows, the text speculation
verifies, plus corpus windows), trains only the draft on KL(target || draft) for `--steps`
or until `--minutes` of training wall time, and writes the new draft to `--out` with the
held-out eval of `train_tiny.evaluate`. The draft's architecture and size are unchanged.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdash.engine.checkpoint import load_checkpoint, save_checkpoint
from training.corpus import collect_corpus
from training.train_tiny import (
    Schedule,
    distill_draft,
    distillation_data,
    evaluate,
    heldout_sequences,
    token_stream,
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("specdash/data"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--minutes", type=float, default=None, help="stop training after this")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--continuations", type=int, default=12)
    p.add_argument("--continuation-len", type=int, default=128)
    p.add_argument("--windows", type=int, default=48)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.monotonic()

    tcfg, target, tok = load_checkpoint(args.data / "target", torch.float32, "cpu")
    dcfg, draft, _ = load_checkpoint(args.data / "draft", torch.float32, "cpu")
    corpus = collect_corpus()
    train_stream = token_stream(tok, [f.text for f in corpus.train])
    heldout_stream = token_stream(tok, [f.text for f in corpus.heldout])

    gen = torch.Generator().manual_seed(args.seed + 3)
    data = distillation_data(
        tcfg,
        target,
        train_stream,
        args.continuations,
        args.continuation_len,
        args.windows,
        args.seq_len,
        gen,
    )
    print(f"[{time.monotonic() - t0:6.1f}s] {len(data)} sequences", flush=True)
    eval_seqs = heldout_sequences(heldout_stream, 1024)
    sched = Schedule(args.steps, args.lr, warmup=max(1, args.steps // 20))
    draft, losses = distill_draft(
        tcfg, target, dcfg, data, sched, 1, args.seed, init=draft, gen=gen, minutes=args.minutes
    )
    metrics = evaluate(tcfg, target, dcfg, draft, eval_seqs)
    save_checkpoint(args.out, dcfg, draft, tok)
    record = {
        "command": "python -m training.distill_draft "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "steps_done": len(losses),
        "seconds": round(time.monotonic() - t0, 1),
        "draft_final_kl": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "heldout_eval": metrics,
    }
    (args.out / "distill.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
