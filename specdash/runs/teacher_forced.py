"""Teacher-forced scoring: the setting each trace ran, run again along the reference's tokens.

A free-running comparison of two settings stops at their first flip: after it they read
different contexts. Scored along A's recorded path, every position stays comparable. Each
setting's engine is rebuilt from its trace's header and fed A's tokens through its own prefill
and exact verify rows (`Engine.teacher_forced`), the path its sessions decode by, so where the
two paths agree a score equals the trace's recorded logprob bit for bit, which
`specdash.trace.compare` checks before it reports anything.
"""

from __future__ import annotations

import dataclasses

import torch
from pydantic import ValidationError

from specdash.engine import ops
from specdash.engine.drafters import NgramDrafter
from specdash.engine.engine import Engine
from specdash.engine.loader import load_models
from specdash.engine.tokenizer import TextTokenizer
from specdash.errors import UsageError
from specdash.events import MANTISSA_BITS, Event, Margin, PromptStart, SessionStart, Token
from specdash.settings import MAX_K, SessionSettings
from specdash.trace.compare import PathScore, Scored, TeacherForced

ROWS = MAX_K + 1
"""Rows per teacher-forced forward: the most a session's verify step runs (exact mode gives
every row decode's bits at any count)."""


def unscorable(header: SessionStart) -> str | None:
    """Why a trace's setting cannot be re-scored here, or None."""
    if header.engine != "native":
        engine = header.engine
        return f"a {engine} session is not re-scored: teacher forcing runs the native engine only"
    return None


def settings_of(header: SessionStart, name: str) -> SessionSettings:
    """The setting a trace's session ran (checkpoint, preset, device, dtype, the GEMM backend
    it resolved), as one plain decode: scoring needs no draft and no shadow."""
    config = {k: v for k, v in header.config.items() if k in SessionSettings.model_fields}
    config |= {"gemm_backend": header.gemm_backend, "speculation": False, "shadow": False,
               "trace": None, "prompts": None}  # fmt: skip
    try:
        return SessionSettings.model_validate(config)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{name}'s header: config.{where}: {err['msg']}") from None


def _paths(events: list[Event]) -> dict[int, tuple[PromptStart, list[Token]]]:
    """Each prompt's start and its generated tokens in order, by prompt index."""
    starts = {e.prompt_index: e for e in events if isinstance(e, PromptStart)}
    tokens: dict[int, list[Token]] = {p: [] for p in starts}
    for e in events:
        if isinstance(e, Token) and e.prompt_index in tokens:
            tokens[e.prompt_index].append(e)
    return {p: (starts[p], sorted(t, key=lambda t: t.position)) for p, t in tokens.items()}


def _check_tokenizer(name: str, tokenizer: TextTokenizer, p: int, start: PromptStart,
                     prompt: list[int], path: list[Token]) -> None:  # fmt: skip
    """A's ids mean the same to this setting: the prompt encodes to as many tokens, and every
    token of A's path decodes to the text A's trace holds."""
    if len(prompt) != start.prompt_tokens:
        raise UsageError(
            f"prompt {p} is {len(prompt)} tokens to {name}'s tokenizer, {start.prompt_tokens} "
            "in A's trace: compare needs one tokenizer"
        )
    for t in path:
        if (text := tokenizer.decode([t.token_id])) != t.text:
            raise UsageError(
                f"{name}'s tokenizer reads token {t.token_id} as {text!r}, A's trace as "
                f"{t.text!r}: compare needs one tokenizer"
            )


def _score_path(
    engine: Engine, prompt: list[int], path: list[int], top_k: int, support: PathScore | None
) -> PathScore:
    """One prompt's rows along `path`, each reduced on the device to what `Scored` holds: the
    support is the model's own top-k where `support` is None, else `support`'s ids."""
    device = engine.target.device
    positions: list[Scored] = []
    ids: list[tuple[int, ...]] = []
    vocab = 0
    for rows in engine.teacher_forced(prompt, path, ROWS) if path else ():
        j, n, vocab = len(positions), rows.shape[0], rows.shape[-1]  # rows: [n, V]
        targets = torch.tensor(path[j : j + n], device=device)[:, None]  # [n, 1]
        if support is None:
            values, index = rows.topk(min(top_k, vocab), dim=-1)  # [n, k] each
        else:
            index = torch.tensor(support.support[j : j + n], device=device)
            values = rows.gather(-1, index)
        argmax, argmax_lp = ops.greedy(rows)
        outside = rows.scatter(-1, index, -torch.inf).logsumexp(-1)  # [n]
        host = (rows.gather(-1, targets)[:, 0], argmax, argmax_lp, values, outside)
        for lp, top, top_lp, vals, rest in zip(*(t.tolist() for t in host), strict=True):
            positions.append(Scored(lp, top, top_lp, tuple(vals), rest))
        ids += [tuple(i) for i in index.tolist()]
    return PathScore(positions, ids if support is None else support.support, vocab)


def _score(
    settings: SessionSettings,
    name: str,
    paths: dict[int, tuple[PromptStart, list[Token]]],
    top_k: int,
    support: dict[int, PathScore] | None,
) -> tuple[dict[int, PathScore], str]:
    """One setting along every prompt's path (`_score_path`), and the dtype it computes in."""
    loaded = load_models(settings)
    engine = Engine(loaded.target, NgramDrafter, loaded.eos_ids)
    longest = max((len(path) for _, path in paths.values()), default=0)
    prompts = {p: loaded.tokenizer.encode(start.text) for p, (start, _) in paths.items()}
    engine.reserve(max(map(len, prompts.values()), default=1), longest, MAX_K, 1, False)
    out: dict[int, PathScore] = {}
    with torch.inference_mode():
        for p, (start, recorded) in paths.items():
            _check_tokenizer(name, loaded.tokenizer, p, start, prompts[p], recorded)
            path = [t.token_id for t in recorded]
            theirs = None if support is None else support[p]
            out[p] = _score_path(engine, prompts[p], path, top_k, theirs)
    return out, str(loaded.target.dtype).removeprefix("torch.")


def _with_margins(scores: dict[int, PathScore], dtype: str) -> dict[int, PathScore]:
    """A's top-1 / top-2 at every position, judged by `dtype`."""
    return {
        p: dataclasses.replace(
            s,
            positions=[
                dataclasses.replace(
                    x, margin=Margin.between((i[0], x.support[0]), (i[1], x.support[1]), dtype)
                )
                for x, i in zip(s.positions, s.support, strict=True)
            ],
        )
        for p, s in scores.items()
    }


def teacher_forced(
    headers: tuple[SessionStart, SessionStart],
    events_a: list[Event],
    top_k: int,
) -> TeacherForced:
    """Both traces' settings scored along A's recorded path, A first (its `top_k`, at least
    2, is B's support); A's margins judged by the coarser of the two dtypes, whose rounding
    could flip a choice. Where a setting cannot be re-scored, a `TeacherForced` that says why."""
    for name, header in zip("AB", headers, strict=True):
        if (why := unscorable(header)) is not None:
            return TeacherForced(missing=f"{name} is not scored: {why}")
    settings = [settings_of(h, name) for h, name in zip(headers, "AB", strict=True)]
    paths = _paths(events_a)
    a, dtype_a = _score(settings[0], "A", paths, top_k, None)
    b, dtype_b = _score(settings[1], "B", paths, top_k, a)
    coarser = min(dtype_a, dtype_b, key=MANTISSA_BITS.__getitem__)
    return TeacherForced(a=_with_margins(a, coarser), b=b, top_k=top_k)
