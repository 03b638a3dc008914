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
import torch.nn.functional as F

from specdash.engine.checkpoint import load_checkpoint, save_checkpoint
from training.corpus import collect_corpus
from training.train_tiny import (
    Schedule,
    distillation_data,
    evaluate,
    heldout_sequences,
    log_probs,
    optimizer,
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
    with torch.no_grad():
        teacher = [log_probs(tcfg, target, s[:-1]) for s in data]
    print(f"[{time.monotonic() - t0:6.1f}s] {len(data)} sequences, teacher done", flush=True)

    eval_seqs = heldout_sequences(heldout_stream, 1024)

    params = {n: t.requires_grad_() for n, t in draft.items()}
    opt = optimizer(params, args.lr)
    sched = Schedule(args.steps, args.lr, warmup=max(1, args.steps // 20))
    t_train = time.monotonic()
    losses: list[float] = []
    for step in range(args.steps):
        if args.minutes and time.monotonic() - t_train > 60 * args.minutes:
            break
        for g in opt.param_groups:
            g["lr"] = sched.lr_at(step)
        opt.zero_grad(set_to_none=True)
        i = int(torch.randint(0, len(data), (1,), generator=gen))
        student = log_probs(dcfg, params, data[i][:-1])
        loss = F.kl_div(student, teacher[i], log_target=True, reduction="batchmean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0:
            print(f"[{time.monotonic() - t0:6.1f}s] step {step} kl {loss.item():.4f}", flush=True)
    draft = {n: t.detach() for n, t in params.items()}
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
