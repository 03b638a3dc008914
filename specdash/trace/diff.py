"""`specdash diff A B`: where two recordings of the same prompts first disagree.

Two engines, quants or verify modes are only comparable token for token; this finds, per
prompt, the first generated token whose id or logprob bits differ, so "same output" is
checked with the same bit-exact rule the shadow decode uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdash.errors import UsageError
from specdash.events import (
    Divergence,
    Event,
    Margin,
    PromptDone,
    PromptStart,
    SessionStart,
    Summary,
    Token,
)
from specdash.metrics import token_difference


@dataclass(frozen=True, slots=True)
class PromptDiff:
    """First difference of one prompt; `index` counts generated tokens from 0, like every
    event's `position`.

    `a`/`b` is None where that trace has no token at `index` (it stopped earlier or never
    ran the prompt); `index` is None when the prompt's tokens are identical.
    """

    prompt_index: int
    index: int | None
    a: Token | None
    b: Token | None
    tokens_a: int
    tokens_b: int
    ids_differ: bool = False
    """Some token id differs (or one trace has tokens the other lacks); False with only
    logprob bits differing."""
    margins: tuple[Margin | None, Margin | None] = (None, None)
    """A's and B's shadow margin at `index`, where that trace flagged a divergence from its own
    shadow there: how close the choice was (a near-tie, or a wide gap)."""
    incomplete: str = ""
    """"A", "B" or "A and B": the traces whose recording of this prompt stops before the
    prompt ended (killed mid-run), every token both hold being identical. Such a prompt is
    not a difference (`index` is None): it is unknown what the recording would have said."""
    capped: str = ""
    """"A" or "B": the trace whose prompt is shorter because it reached its session's
    `max_new_tokens`, every token both hold being identical: the lengths differ, the output
    does not (`index` is None)."""


def _tokens_by_prompt(events: list[Event]) -> dict[int, list[Token]]:
    prompts: dict[int, list[Token]] = {}
    for e in events:
        if isinstance(e, PromptStart):
            prompts.setdefault(e.prompt_index, [])
        elif isinstance(e, Token):
            prompts.setdefault(e.prompt_index, []).append(e)
    return {p: sorted(toks, key=lambda t: t.position) for p, toks in prompts.items()}


def _margins(events: list[Event]) -> dict[tuple[int, int], Margin]:
    return {
        (e.prompt_index, e.position): e.shadow_margin
        for e in events
        if isinstance(e, Divergence) and e.shadow_margin is not None
    }


def _unfinished(events: list[Event]) -> Callable[[int], bool]:
    """Whether a trace's recording stops before a prompt ended: it has no `prompt_done` for
    it, and no `summary` either (a finished session that never ran a prompt just lacks it)."""
    if any(isinstance(e, Summary) for e in events):
        return lambda p: False
    done = {e.prompt_index for e in events if isinstance(e, PromptDone)}
    return lambda p: p not in done


def _prompt_texts(events: list[Event]) -> dict[int, str]:
    return {e.prompt_index: e.text for e in events if isinstance(e, PromptStart)}


def diff_prompts(
    events_a: list[Event],
    events_b: list[Event],
    max_new_tokens: tuple[int | None, int | None] = (None, None),
) -> list[PromptDiff]:
    """Per prompt index in either trace, the first token where A and B differ;
    `max_new_tokens`: each session's limit (its header says), where a prompt stops without
    that being a difference."""
    texts_a, texts_b = _prompt_texts(events_a), _prompt_texts(events_b)
    for p in texts_a.keys() & texts_b.keys():
        if texts_a[p] != texts_b[p]:
            raise UsageError(
                f"the traces ran different prompts (prompt {p}: {texts_a[p][:40]!r} vs "
                f"{texts_b[p][:40]!r}); diff compares recordings of the same prompts"
            )
    tokens_a, tokens_b = _tokens_by_prompt(events_a), _tokens_by_prompt(events_b)
    margins_a, margins_b = _margins(events_a), _margins(events_b)
    cut_a, cut_b = _unfinished(events_a), _unfinished(events_b)
    result = []
    for p in sorted(tokens_a.keys() | tokens_b.keys()):
        ta, tb = tokens_a.get(p, []), tokens_b.get(p, [])
        first = next(
            (
                i
                for i, (x, y) in enumerate(zip(ta, tb, strict=False))
                if token_difference(x.token_id, x.logprob, y.token_id, y.logprob) is not None
            ),
            None,
        )
        incomplete = capped = ""
        if first is None:
            # Where the shorter ends is a difference if it finished there by itself (an end of
            # text); if its recording stopped there, what came next is unknown, and if its
            # session's max_new_tokens stopped it, nothing differs but the limit. An equal
            # length's unfinished recording is unknown too.
            shortest = min(len(ta), len(tb))
            sides = (("A", ta, cut_a, max_new_tokens[0]), ("B", tb, cut_b, max_new_tokens[1]))
            stopped = [side for side, toks, cut, _ in sides if len(toks) == shortest and cut(p)]
            limited = [
                side
                for side, toks, _, limit in sides
                if len(toks) == shortest and limit is not None and shortest >= limit
            ]
            if len(ta) != len(tb) and not stopped:
                if limited:
                    capped = limited[0]
                else:
                    first = shortest
            incomplete = " and ".join(stopped)
        result.append(
            PromptDiff(
                prompt_index=p,
                index=first,
                a=ta[first] if first is not None and first < len(ta) else None,
                b=tb[first] if first is not None and first < len(tb) else None,
                tokens_a=len(ta),
                tokens_b=len(tb),
                ids_differ=first is not None
                and [x.token_id for x in ta] != [y.token_id for y in tb],
                incomplete=incomplete,
                capped=capped,
                margins=(margins_a.get((p, first)), margins_b.get((p, first)))
                if first is not None
                else (None, None),
            )
        )
    return result


def _side(name: str, t: Token | None, total: int) -> str:
    if t is None:
        return f"{name}: (ends after {total} tokens)"
    return f"{name}: {t.token_id} {t.text!r} logprob {t.logprob!r}"


def format_diff(d: PromptDiff) -> str:
    if d.incomplete:
        held = min(d.tokens_a, d.tokens_b)
        same = f"the {held} tokens both hold are identical" if held else "no token to compare"
        counts = {"A": d.tokens_a, "B": d.tokens_b}
        never = all(counts[side] == 0 for side in d.incomplete.split(" and "))
        where = "before this prompt's first token" if never else "mid-prompt"
        return (
            f"prompt {d.prompt_index}: incomplete in {d.incomplete}: the recording stops "
            f"{where} (A {d.tokens_a} tokens, B {d.tokens_b}); {same}"
        )
    if d.capped:
        return (
            f"prompt {d.prompt_index}: identical for the {min(d.tokens_a, d.tokens_b)} tokens "
            f"both hold; the lengths differ (A {d.tokens_a} tokens, B {d.tokens_b}): "
            f"{d.capped} reached its --max-new-tokens"
        )
    if d.index is None:
        return f"prompt {d.prompt_index}: identical ({d.tokens_a} tokens)"
    what = "logprob bits" if d.a and d.b and d.a.token_id == d.b.token_id else "token"
    flipped = what == "token"
    margins = "".join(
        f" | {name}'s {m.text(flipped)}"
        for name, m in zip("AB", d.margins, strict=True)
        if m is not None
    )
    return (
        f"prompt {d.prompt_index}: first {what} difference at generated token {d.index}: "
        f"{_side('A', d.a, d.tokens_a)} | {_side('B', d.b, d.tokens_b)}{margins}"
    )


def verdict(diffs: list[PromptDiff]) -> str:
    """Which of the two differ: token ids, or only logprob bits (ids identical)."""
    ids = sum(d.ids_differ for d in diffs)
    bits_only = sum(d.index is not None and not d.ids_differ for d in diffs)
    if ids and bits_only:
        return f"token ids differ in {ids} prompt(s), only logprob bits in {bits_only}"
    if ids:
        return f"token ids differ in {ids} prompt(s)"
    if bits_only:
        return f"token ids are identical; logprob bits differ in {bits_only} prompt(s)"
    if any(d.incomplete for d in diffs):
        return "token ids and logprob bits are identical as far as both recordings go"
    if any(d.capped for d in diffs):
        return (
            "token ids and logprob bits are identical in every token both hold; "
            "the lengths differ where one reached its --max-new-tokens"
        )
    return "token ids and logprob bits are identical"


def label(path: str, header: SessionStart) -> str:
    c = header.config
    keys = ("dtype", "verify_mode", "verify")  # `verify`: before it had one name
    parts = [header.engine, *(str(c.get(key)) for key in keys if c.get(key))]
    return f"{Path(path).name} ({', '.join([*parts, header.gemm_backend])})"
