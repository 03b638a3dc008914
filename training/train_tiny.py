"""Train the embedded tiny hybrid target and its draft on the CPU, deterministically.

    python -m training.train_tiny --out specdash/data            # the shipped pair
    python -m training.train_tiny --steps 2 --draft-steps 2 --max-files 40 --out /tmp/x  # CI

The target is a Qwen3.5-shaped hybrid (Gated DeltaNet layers, every 4th layer gated full
attention); the draft is a 2-layer [GDN, attention] model of the same width and tokenizer,
started from the target's embedding, head and one layer of each kind, then distilled
toward the target's next-token distribution on corpus text and on the target's own greedy
continuations (the text speculative decoding will actually verify). Both train through
`specdash.engine.model.Model` itself, so the shipped weights are exactly what the engine runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from specdash.engine.checkpoint import save_checkpoint
from specdash.engine.config import LayerType, ModelConfig, hybrid_layer_types
from specdash.engine.model import Model, random_tensors
from specdash.engine.state import SeqState
from training.corpus import EOS, Corpus, collect_corpus, train_tokenizer
from training.prompts import heldout_prompts

Tensors = dict[str, torch.Tensor]


def model_config(
    vocab: int, hidden: int, layer_types: list[LayerType], eos: int, max_pos: int
) -> ModelConfig:
    """Qwen3.5 shape at `hidden` width: 4 heads of hidden/4 for attention and GDN values."""
    d = hidden // 4
    return ModelConfig(
        family="qwen3_5",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=d,
        partial_rotary_factor=0.25,
        max_position_embeddings=max_pos,
        layer_types=layer_types,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=d,
        linear_value_head_dim=d,
        eos_token_ids=[eos],
    )


def token_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents back to back, each followed by <|endoftext|>."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def log_probs(cfg: ModelConfig, tensors: Tensors, tokens: torch.Tensor) -> torch.Tensor:
    """[T, V] next-token log-probs for one sequence, through the engine's own forward."""
    model = Model.from_tensors(cfg, tensors)
    state = SeqState.empty(cfg, tokens.shape[0], torch.float32, torch.device("cpu"))
    return model.forward(tokens, state, "prefill", all_logits=True)


@dataclass(slots=True)
class Schedule:
    steps: int
    lr: float
    warmup: int

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine down to a tenth."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def optimizer(tensors: Tensors, lr: float) -> torch.optim.Optimizer:
    matrices = [t for t in tensors.values() if t.dim() >= 2]
    vectors = [t for t in tensors.values() if t.dim() < 2]
    return torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.01}, {"params": vectors, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


def windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> list[torch.Tensor]:
    starts = torch.randint(0, stream.shape[0] - length - 1, (n,), generator=gen)
    return [stream[s : s + length + 1] for s in starts.tolist()]


def distillation_data(
    cfg: ModelConfig,
    target: Tensors,
    stream: torch.Tensor,
    continuations: int,
    continuation_len: int,
    n_windows: int,
    seq_len: int,
    gen: torch.Generator,
) -> list[torch.Tensor]:
    """What the draft learns from: the target's greedy continuations of corpus prefixes (the
    text speculation verifies), then plain corpus windows."""
    prompt_len = max(1, seq_len - continuation_len)
    data = [
        greedy_continuation(cfg, target, w[:prompt_len], continuation_len)
        for w in windows(stream, continuations, prompt_len, gen)
    ]
    return data + windows(stream, n_windows, seq_len, gen)


def heldout_sequences(stream: torch.Tensor, length: int, n: int = 8) -> list[torch.Tensor]:
    """`n` evenly spaced held-out sequences of `length` + 1 tokens."""
    length = min(length, stream.shape[0] - 1)
    stride = max(1, (stream.shape[0] - length - 1) // n)
    return [stream[i * stride : i * stride + length + 1] for i in range(n)]


def train_target(
    cfg: ModelConfig, stream: torch.Tensor, sched: Schedule, batch: int, seq: int, seed: int
) -> tuple[Tensors, list[float]]:
    tensors = {n: t.requires_grad_() for n, t in random_tensors(cfg, seed).items()}
    opt = optimizer(tensors, sched.lr)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for step in range(sched.steps):
        for g in opt.param_groups:
            g["lr"] = sched.lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for w in windows(stream, batch, seq, gen):
            loss = F.nll_loss(log_probs(cfg, tensors, w[:-1]), w[1:]) / batch
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(list(tensors.values()), 1.0)
        opt.step()
        losses.append(total)
        _progress("target", step, sched.steps, total)
    return {n: t.detach() for n, t in tensors.items()}, losses


def draft_from_target(target_cfg: ModelConfig, draft_cfg: ModelConfig, target: Tensors) -> Tensors:
    """Embedding, final norm, head, first GDN and first attention layer copied from the target."""
    first_of = {lt: target_cfg.layer_types.index(lt) for lt in set(target_cfg.layer_types)}
    out = {}
    for name in random_tensors(draft_cfg, 0):
        src = name
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            j = first_of[draft_cfg.layer_types[i]]
            src = name.replace(f"model.layers.{i}.", f"model.layers.{j}.", 1)
        out[name] = target[src].clone()
    return out


@torch.no_grad()
def greedy_continuation(
    cfg: ModelConfig, tensors: Tensors, prompt: torch.Tensor, n: int
) -> torch.Tensor:
    """Prompt followed by `n` greedy tokens of the model (decode one token at a time)."""
    model = Model.from_tensors(cfg, tensors)
    state = SeqState.empty(cfg, prompt.shape[0] + n, torch.float32, torch.device("cpu"))
    lp = model.forward(prompt, state, "prefill")
    out = [prompt]
    for _ in range(n):
        nxt = lp[-1].argmax()[None]
        out.append(nxt)
        lp = model.forward(nxt, state, "exact")
        state.commit(1)
    return torch.cat(out)


def distill_draft(
    target_cfg: ModelConfig,
    target: Tensors,
    draft_cfg: ModelConfig,
    data: list[torch.Tensor],
    sched: Schedule,
    batch: int,
    seed: int,
    init: Tensors | None = None,
    gen: torch.Generator | None = None,
    minutes: float | None = None,
) -> tuple[Tensors, list[float]]:
    """Minimise KL(target || draft) per position over `data` sequences, `batch` per step,
    from `init` (default: layers copied from the target), drawing sequences with `gen`
    (default: seeded from `seed`), for `sched.steps` or `minutes` of training if sooner."""
    start = draft_from_target(target_cfg, draft_cfg, target) if init is None else init
    draft = {n: t.requires_grad_() for n, t in start.items()}
    with torch.no_grad():
        teacher = [log_probs(target_cfg, target, s[:-1]) for s in data]
    opt = optimizer(draft, sched.lr)
    gen = gen or torch.Generator().manual_seed(seed + 2)
    losses = []
    t_train = time.monotonic()
    for step in range(sched.steps):
        if minutes and time.monotonic() - t_train > 60 * minutes:
            break
        for g in opt.param_groups:
            g["lr"] = sched.lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in torch.randint(0, len(data), (batch,), generator=gen).tolist():
            student = log_probs(draft_cfg, draft, data[i][:-1])
            loss = F.kl_div(student, teacher[i], log_target=True, reduction="batchmean") / batch
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(list(draft.values()), 1.0)
        opt.step()
        losses.append(total)
        _progress("draft", step, sched.steps, total)
    return {n: t.detach() for n, t in draft.items()}, losses


@torch.no_grad()
def evaluate(
    target_cfg: ModelConfig, target: Tensors, draft_cfg: ModelConfig, draft: Tensors, seqs: list
) -> dict[str, float]:
    """Held-out loss of both models and how often their top-1 tokens agree."""
    t_nll = d_nll = agree = n = 0.0
    for s in seqs:
        tl = log_probs(target_cfg, target, s[:-1])
        dl = log_probs(draft_cfg, draft, s[:-1])
        t_nll += F.nll_loss(tl, s[1:], reduction="sum").item()
        d_nll += F.nll_loss(dl, s[1:], reduction="sum").item()
        agree += (tl.argmax(-1) == dl.argmax(-1)).sum().item()
        n += s.shape[0] - 1
    return {
        "heldout_tokens": int(n),
        "target_nll_per_token": t_nll / n,
        "draft_nll_per_token": d_nll / n,
        "draft_target_top1_agreement": agree / n,
    }


_T0 = time.monotonic()


def _progress(what: str, step: int, steps: int, loss: float) -> None:
    if step % 10 == 0 or step == steps - 1:
        print(
            f"[{time.monotonic() - _T0:7.1f}s] {what} step {step + 1}/{steps} loss {loss:.4f}",
            flush=True,
        )


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(out: Path, corpus: Corpus, record: dict) -> None:
    """MANIFEST.json: what was trained how, and the sha256 of every shipped file."""
    (out / "corpus_manifest.json").write_text(json.dumps(corpus.manifest(), indent=1) + "\n")
    shipped = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    record["files"] = {p.relative_to(out).as_posix(): sha256_file(p) for p in shipped}
    (out / "MANIFEST.json").write_text(json.dumps(record, indent=1) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("specdash/data"))
    p.add_argument("--steps", type=int, default=1500, help="target optimizer steps")
    p.add_argument("--draft-steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=8, help="target layers (every 4th attention)")
    p.add_argument("--max-pos", type=int, default=8192)
    p.add_argument("--continuations", type=int, default=24, help="target greedy runs for the draft")
    p.add_argument("--continuation-len", type=int, default=192)
    p.add_argument("--max-files", type=int, default=None, help="corpus subset (CI)")
    p.add_argument("--prompts", type=int, default=24, help="held-out prompts to write (0: none)")
    p.add_argument("--seed", type=int, default=0)
    # one thread: on a shared 2-core machine two OpenMP threads ran a step 5x slower
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # 4x slower decode otherwise

    corpus = collect_corpus(max_files=args.max_files)
    tok = train_tokenizer([f.text for f in corpus.train], args.vocab)
    eos = tok.token_to_id(EOS)
    train_stream = token_stream(tok, [f.text for f in corpus.train])
    heldout_stream = token_stream(tok, [f.text for f in corpus.heldout])
    print(
        f"corpus: {len(corpus.train)} train files ({train_stream.shape[0]} tokens), "
        f"{len(corpus.heldout)} held out ({heldout_stream.shape[0]} tokens)",
        flush=True,
    )

    vocab = tok.get_vocab_size()
    target_cfg = model_config(
        vocab, args.hidden, hybrid_layer_types(args.layers), eos, args.max_pos
    )
    draft_cfg = model_config(
        vocab, args.hidden, ["linear_attention", "full_attention"], eos, args.max_pos
    )
    sched = Schedule(args.steps, args.lr, warmup=max(1, args.steps // 20))
    target, target_losses = train_target(
        target_cfg, train_stream, sched, args.batch, args.seq_len, args.seed
    )

    gen = torch.Generator().manual_seed(args.seed + 3)
    seq = args.seq_len
    draft_data = distillation_data(
        target_cfg,
        target,
        train_stream,
        args.continuations,
        args.continuation_len,
        2 * args.continuations,
        seq,
        gen,
    )
    print(f"[{time.monotonic() - _T0:7.1f}s] {len(draft_data)} distillation sequences", flush=True)
    draft_sched = Schedule(args.draft_steps, args.lr, warmup=max(1, args.draft_steps // 20))
    draft, draft_losses = distill_draft(
        target_cfg, target, draft_cfg, draft_data, draft_sched, args.batch, args.seed
    )

    eval_seqs = heldout_sequences(heldout_stream, seq)
    metrics = evaluate(target_cfg, target, draft_cfg, draft, eval_seqs)
    print(json.dumps(metrics), flush=True)

    out = args.out
    save_checkpoint(out / "target", target_cfg, target, tok)
    save_checkpoint(out / "draft", draft_cfg, draft, tok)
    if args.prompts:
        prompts = heldout_prompts(corpus.heldout, tok, args.prompts)
        with (out / "prompts.jsonl").open("w") as f:
            for p in prompts:
                f.write(json.dumps(p) + "\n")
    record = {
        "command": "python -m training.train_tiny "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "torch": torch.__version__,
        "target_params": target_cfg.num_params(),
        "draft_params": draft_cfg.num_params(),
        "storage_dtype": "float32",
        "train_seconds": round(time.monotonic() - _T0, 1),
        "target_final_loss": sum(target_losses[-10:]) / len(target_losses[-10:]),
        "draft_final_kl": sum(draft_losses[-10:]) / len(draft_losses[-10:]),
        "heldout_eval": metrics,
    }
    write_manifest(out, corpus, record)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
