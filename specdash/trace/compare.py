"""`specdash compare A B`: how far a quant (B) strays from its reference (A), prompt by prompt.

Two things are measured. Free-running, each session decodes its own greedy path: how many
tokens agree before the first flip, and whether the reference's choice there was a near-tie
(rounding decides it) or a wide gap (B computed another model). Teacher-forced, B is scored
along A's recorded path, so every position stays comparable after a flip: B's logprob of A's
token against A's own (|Δ logprob|), whether B's argmax is A's token, and KL(A ‖ B) over A's
top-k. Scoring runs the models (`specdash.runs.teacher_forced`); this module only reads
events and scores, so it needs no torch.

All of it is only meaningful because each run is deterministic: a trace whose speculative
output equals its plain shadow bit for bit, re-scored to the same bits, measures the setting,
not run-to-run noise. The comparison checks both and says so first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdash.events import Divergence, Event, Margin, Summary, Token
from specdash.metrics import same_fp32_bits
from specdash.trace.diff import diff_prompts


@dataclass(frozen=True, slots=True)
class Scored:
    """One setting's log-prob row at one position of A's path, reduced on its device."""

    token_logprob: float
    """Its logprob of A's token there."""
    argmax: int
    argmax_logprob: float
    support: tuple[float, ...]
    """Its logprobs of A's top-k tokens there (`PathScore.support`), in that order."""
    rest: float
    """The log of its probability mass outside them (-inf where they are the vocabulary),
    summed on the device (logsumexp), not 1 minus a sum that rounds to nothing."""
    margin: Margin | None = None
    """A's own top-1 / top-2 there (A's score only), judged by the coarser dtype of the two."""


@dataclass(frozen=True, slots=True)
class PathScore:
    """One setting scored along one prompt's A path: a `Scored` per generated position."""

    positions: list[Scored]
    support: list[tuple[int, ...]]
    """Per position, A's top-k token ids, the support the KL is taken over."""
    vocab: int


@dataclass(frozen=True, slots=True)
class TeacherForced:
    """Both settings scored along A's path, by prompt; `missing` says why not, when not."""

    a: dict[int, PathScore] = field(default_factory=dict)
    b: dict[int, PathScore] = field(default_factory=dict)
    top_k: int = 0
    missing: str = ""


@dataclass(frozen=True, slots=True)
class Agreement:
    """B along A's path: over `positions`, |Δ logprob| of A's tokens, B's argmax agreeing with
    A's token, and KL(A ‖ B) per position over A's top-k plus one bucket for the rest (a lower
    bound of the full KL; the full KL where `kl_exact`, the top-k being the whole vocabulary)."""

    positions: int
    mean_abs_delta: float
    max_abs_delta: float
    max_at: tuple[int, int]
    """(prompt, generated token) of the largest |Δ logprob|."""
    argmax_agree: int
    mean_kl: float
    max_kl: float
    kl_exact: bool


@dataclass(frozen=True, slots=True)
class PromptComparison:
    prompt_index: int
    tokens_a: int
    tokens_b: int
    agree: int
    """Tokens with equal ids before the first flip (all of the shorter when none)."""
    flip: int | None
    """The first generated position whose ids differ; None: none where both have tokens."""
    bits_at: int | None
    """The first position whose id or fp32 logprob bits differ (`diff`'s rule)."""
    margin: Margin | None
    """A's top-1 / top-2 at the flip: from the re-scoring, or a divergence A recorded there."""
    agreement: Agreement | None
    incomplete: str = ""
    """"A", "B" or "A and B": the recording stops mid-prompt (`diff`'s rule)."""

    @property
    def identical(self) -> bool:
        return self.bits_at is None and not self.incomplete and self.tokens_a == self.tokens_b

    def verdict(self) -> str:
        """The one line a person reads first."""
        if self.incomplete:
            return f"incomplete in {self.incomplete}: the recording stops mid-prompt"
        if self.identical:
            return f"identical: ids and fp32 logprob bits equal at all {self.tokens_a} tokens"
        if self.flip is None:
            ends = (
                ""
                if self.tokens_a == self.tokens_b
                else f" (A has {self.tokens_a}, B {self.tokens_b})"
            )
            return f"same text for the {self.agree} tokens both hold{ends}, logprobs differ"
        at = f"{self.agree} tokens agree, then a flip at token {self.flip}"
        m = self.margin
        if m is None:
            return f"{at}; A's margin there is not known"
        gap = f"A's top-1 − top-2 {m.gap:.3g} nats, {m.ulps:,} fp32 ulps"
        if m.near_tie:
            return f"{at}, across a near-tie ({gap}): rounding decided it"
        return f"{at}, across a wide gap ({gap}): B computed materially different values"


@dataclass(frozen=True, slots=True)
class Determinism:
    """Whether each run is known deterministic: its speculative output equals its plain
    shadow bit for bit (the trace's summary), and re-scoring reproduced its recorded bits (A
    at every token, B up to its first flip, where it still reads A's context)."""

    exact: tuple[str, str]
    """Per trace: "24/24", or why not known ("not checked (--no-shadow)", "no summary")."""
    reproduced: tuple[int, int]
    """Recorded tokens the re-scoring gave back bit for bit, A and B."""
    mismatches: list[str]
    """Where a check failed, one line each."""
    checked: bool
    """Both traces' exactness was checked (a shadow ran, the summary is there)."""

    @property
    def failed(self) -> bool:
        return bool(self.mismatches)

    def text(self, rescored: bool) -> str:
        a, b = self.exact
        runs = f"A {a} and B {b} prompts equal their plain greedy shadow bit for bit"
        if rescored:
            ra, rb = self.reproduced
            runs += (
                f"; re-scoring reproduced A's {ra} recorded tokens and B's {rb} (to each first "
                "flip, inclusive) bit for bit"
            )
        if self.failed:
            failed = "; ".join(self.mismatches)
            return f"NOT deterministic: {runs}; {failed}: what follows may be noise"
        if not self.checked:
            return f"determinism not checked: {runs}: what follows may hold run-to-run noise"
        return (
            f"deterministic: {runs}. Only because each run is deterministic do the differences "
            "below measure the two settings, not run-to-run noise"
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    prompts: list[PromptComparison]
    determinism: Determinism
    teacher_forced: TeacherForced

    @property
    def missing(self) -> list[str]:
        """The metrics not computed, each with why."""
        tf = self.teacher_forced
        if tf.missing:
            return [
                f"teacher-forced agreement (|Δ logprob|, argmax agreement, KL) and A's margin at "
                f"a flip: {tf.missing}"
            ]
        return []


def _tokens(events: list[Event]) -> dict[int, list[Token]]:
    by: dict[int, list[Token]] = {}
    for e in events:
        if isinstance(e, Token):
            by.setdefault(e.prompt_index, []).append(e)
    return {p: sorted(t, key=lambda x: x.position) for p, t in by.items()}


def _exact(events: list[Event]) -> tuple[str, bool, bool]:
    """A trace's speculative == shadow verdict: its text, whether it was checked, whether it
    held for every prompt."""
    summary = next((e for e in reversed(events) if isinstance(e, Summary)), None)
    if summary is None:
        return "unknown (no summary: the recording stops early)", False, True
    if not summary.checked or summary.exact_prompts is None:
        return "not checked (--no-shadow)", False, True
    exact, prompts = summary.exact_prompts, summary.prompts
    return f"{exact}/{prompts}", True, exact == prompts


def kl_over_support(a: Scored, b: Scored) -> float:
    """KL(A ‖ B) in nats over A's top-k and one bucket for the rest of the vocabulary: the
    full KL coarse-grained, so never above it (equal where the rest is empty)."""
    terms = [(x, y) for x, y in zip(a.support, b.support, strict=True)]
    if a.rest != -math.inf:
        terms.append((a.rest, b.rest))
    return max(math.fsum(math.exp(x) * (x - y) for x, y in terms), 0.0)


def _agreement(prompt: int, a: PathScore, b: PathScore, path: list[int]) -> Agreement:
    """`path`: A's recorded ids, the tokens both were scored on."""
    pairs = list(zip(a.positions, b.positions, strict=True))
    deltas = [abs(y.token_logprob - x.token_logprob) for x, y in pairs]
    exact = len(a.support[0]) >= a.vocab if a.support else False
    kls = [kl_over_support(x, y) for x, y in pairs]
    worst = max(range(len(deltas)), key=deltas.__getitem__)
    return Agreement(
        positions=len(deltas),
        mean_abs_delta=math.fsum(deltas) / len(deltas),
        max_abs_delta=deltas[worst],
        max_at=(prompt, worst),
        argmax_agree=sum(y.argmax == t for y, t in zip(b.positions, path, strict=True)),
        mean_kl=math.fsum(kls) / len(kls),
        max_kl=max(kls),
        kl_exact=exact,
    )


def _reproduced(
    name: str, score: PathScore, tokens: list[Token], upto: int, mismatches: list[str], p: int
) -> int:
    """Recorded tokens 0..upto-1 the score gives back (id and fp32 logprob bits)."""
    for j, (s, t) in enumerate(zip(score.positions[:upto], tokens[:upto], strict=False)):
        if s.argmax != t.token_id or not same_fp32_bits(s.argmax_logprob, t.logprob):
            mismatches.append(
                f"prompt {p}: re-scoring {name} gave token {s.argmax} logprob "
                f"{s.argmax_logprob!r} at generated token {j}, its trace has {t.token_id} "
                f"{t.logprob!r}"
            )
            return j
    return min(upto, len(score.positions), len(tokens))


def compare(
    events_a: list[Event], events_b: list[Event], scores: TeacherForced | None = None
) -> Comparison:
    """Per prompt of A and B (the same prompts: `diff`'s check), free-running and, where
    `scores` holds it, teacher-forced agreement; then the determinism checks."""
    scores = scores or TeacherForced(missing="not scored")
    diffs = diff_prompts(events_a, events_b)
    tokens_a, tokens_b = _tokens(events_a), _tokens(events_b)
    recorded = {
        (e.prompt_index, e.position): e.shadow_margin
        for e in events_a
        if isinstance(e, Divergence) and e.shadow_margin is not None
    }
    mismatches: list[str] = []
    (exact_a, checked_a, held_a), (exact_b, checked_b, held_b) = _exact(events_a), _exact(events_b)
    for name, exact, held in (("A", exact_a, held_a), ("B", exact_b, held_b)):
        if not held:
            mismatches.append(f"{name}'s speculative output differs from its shadow ({exact})")
    reproduced = [0, 0]
    result = []
    for d in diffs:
        p = d.prompt_index
        ta, tb = tokens_a.get(p, []), tokens_b.get(p, [])
        flip = next(
            (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x.token_id != y.token_id),
            None,
        )
        agree = min(len(ta), len(tb)) if flip is None else flip
        sa, sb = scores.a.get(p), scores.b.get(p)
        margin = recorded.get((p, flip)) if flip is not None else None
        agreement = None
        if sa is not None and sb is not None and sa.positions:
            if flip is not None:
                margin = sa.positions[flip].margin
            agreement = _agreement(p, sa, sb, [t.token_id for t in ta])
            reproduced[0] += _reproduced("A", sa, ta, len(ta), mismatches, p)
            reproduced[1] += _reproduced("B", sb, tb, agree + 1, mismatches, p)
        result.append(
            PromptComparison(
                prompt_index=p,
                tokens_a=len(ta),
                tokens_b=len(tb),
                agree=agree,
                flip=flip,
                bits_at=d.index,
                margin=margin,
                agreement=agreement,
                incomplete=d.incomplete,
            )
        )
    determinism = Determinism(
        exact=(exact_a, exact_b),
        reproduced=(reproduced[0], reproduced[1]),
        mismatches=mismatches,
        checked=checked_a and checked_b and not any(c.incomplete for c in result),
    )
    return Comparison(result, determinism, scores)


def _agreement_text(g: Agreement, whole: bool = False) -> str:
    """`whole`: over every prompt, so the largest |Δ| says which prompt it is in."""
    kl = "KL(A‖B)" if g.kl_exact else "KL(A‖B) over A's top-k + rest (a lower bound)"
    prompt, token = g.max_at
    at = f"prompt {prompt} token {token}" if whole else f"token {token}"
    return (
        f"teacher-forced along A's {g.positions} tokens: |Δ logprob| mean {g.mean_abs_delta:.3g} "
        f"max {g.max_abs_delta:.3g} ({at}), B's argmax = A's token "
        f"{g.argmax_agree}/{g.positions}, {kl} mean {g.mean_kl:.3g} max {g.max_kl:.3g}"
    )


def format_prompt(c: PromptComparison) -> str:
    line = f"prompt {c.prompt_index}: {c.verdict()}"
    if c.agreement is not None:
        line += f" | {_agreement_text(c.agreement)}"
    return line


@dataclass(frozen=True, slots=True)
class Totals:
    prompts: int
    identical: int
    same_text: int
    flips: int
    near_tie_flips: int
    wide_flips: int
    agree_tokens: int
    tokens_a: int
    agreement: Agreement | None
    """Over every teacher-forced position of every prompt; None where none was scored."""


def totals(cmp: Comparison) -> Totals:
    ps = cmp.prompts
    flips = [c for c in ps if c.flip is not None]
    scored = [c.agreement for c in ps if c.agreement is not None]
    overall = None
    if scored:
        n = sum(g.positions for g in scored)
        worst = max(scored, key=lambda g: g.max_abs_delta)
        overall = Agreement(
            positions=n,
            mean_abs_delta=math.fsum(g.mean_abs_delta * g.positions for g in scored) / n,
            max_abs_delta=worst.max_abs_delta,
            max_at=worst.max_at,
            argmax_agree=sum(g.argmax_agree for g in scored),
            mean_kl=math.fsum(g.mean_kl * g.positions for g in scored) / n,
            max_kl=max(g.max_kl for g in scored),
            kl_exact=all(g.kl_exact for g in scored),
        )
    return Totals(
        prompts=len(ps),
        identical=sum(c.identical for c in ps),
        same_text=sum(c.flip is None and not c.incomplete for c in ps),
        flips=len(flips),
        near_tie_flips=sum(c.margin is not None and c.margin.near_tie for c in flips),
        wide_flips=sum(c.margin is not None and not c.margin.near_tie for c in flips),
        agree_tokens=sum(c.agree for c in ps),
        tokens_a=sum(c.tokens_a for c in ps),
        agreement=overall,
    )


def format_totals(t: Totals) -> str:
    unknown = t.flips - t.near_tie_flips - t.wide_flips
    flips = f"{t.flips} with a flip ({t.near_tie_flips} near-tie, {t.wide_flips} wide"
    flips += f", {unknown} margin unknown)" if unknown else ")"
    line = (
        f"totals: {t.identical}/{t.prompts} identical, {t.same_text}/{t.prompts} same text, "
        f"{flips}; {t.agree_tokens} of A's {t.tokens_a} tokens agree before the first flip"
    )
    if t.agreement is not None:
        line += f" | {_agreement_text(t.agreement, whole=True)}"
    return line


def format_comparison(cmp: Comparison, label_a: str, label_b: str) -> list[str]:
    """What `specdash compare` prints: who is who, the determinism line, a line per prompt,
    what is missing, the totals."""
    rescored = not cmp.teacher_forced.missing
    lines = [f"A (reference) = {label_a}", f"B = {label_b}", cmp.determinism.text(rescored)]
    lines += [format_prompt(c) for c in cmp.prompts]
    lines += [f"missing: {m}" for m in cmp.missing]
    lines.append(format_totals(totals(cmp)))
    return lines


def _agreement_record(g: Agreement | None) -> dict[str, object] | None:
    if g is None:
        return None
    return {
        "positions": g.positions,
        "mean_abs_delta_logprob": g.mean_abs_delta,
        "max_abs_delta_logprob": g.max_abs_delta,
        "max_at": {"prompt": g.max_at[0], "token": g.max_at[1]},
        "argmax_agree": g.argmax_agree,
        "mean_kl": g.mean_kl,
        "max_kl": g.max_kl,
        "kl_exact": g.kl_exact,
    }


def comparison_record(cmp: Comparison, label_a: str, label_b: str) -> dict[str, object]:
    """`compare --json`: the same content as the text, as one object."""
    det, t = cmp.determinism, totals(cmp)
    rescored = not cmp.teacher_forced.missing
    return {
        "a": label_a,
        "b": label_b,
        "determinism": {
            "deterministic": det.checked and not det.failed,
            "exact": {"a": det.exact[0], "b": det.exact[1]},
            "rescored": rescored,
            "reproduced_tokens": {"a": det.reproduced[0], "b": det.reproduced[1]}
            if rescored
            else None,
            "mismatches": det.mismatches,
            "note": det.text(rescored),
        },
        "top_k": cmp.teacher_forced.top_k if rescored else None,
        "prompts": [
            {
                "prompt": c.prompt_index,
                "tokens_a": c.tokens_a,
                "tokens_b": c.tokens_b,
                "agree": c.agree,
                "flip": c.flip,
                "first_bits_difference": c.bits_at,
                "incomplete": c.incomplete or None,
                "margin_at_flip": None if c.margin is None else c.margin.model_dump(),
                "teacher_forced": _agreement_record(c.agreement),
                "verdict": c.verdict(),
            }
            for c in cmp.prompts
        ],
        "missing": cmp.missing,
        "totals": {
            "prompts": t.prompts,
            "identical": t.identical,
            "same_text": t.same_text,
            "flips": t.flips,
            "near_tie_flips": t.near_tie_flips,
            "wide_flips": t.wide_flips,
            "agree_tokens": t.agree_tokens,
            "tokens_a": t.tokens_a,
            "teacher_forced": _agreement_record(t.agreement),
        },
    }
