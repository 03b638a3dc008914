"""What both runners emit, built one way: `SessionEvents` counts each event into the session
totals and sends it on, and builds the header, the divergences, the per-prompt verdicts and the
summary with the same fields, the same rule for "exact", the same totals. `first_divergences`
and `divergences_to_report` are the shared rule for where a prompt's output left the shadow's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdash.events import (
    Divergence,
    Event,
    Margin,
    PromptDone,
    RootCause,
    SessionStart,
    Sink,
    Summary,
)
from specdash.metrics import fp32_ulps, same_fp32_bits
from specdash.settings import SessionSettings
from specdash.stats import SessionStats


def first_divergences(
    spec_ids: Sequence[int],
    spec_logprobs: Sequence[float | None],
    shadow_ids: Sequence[int],
    shadow_logprobs: Sequence[float | None],
) -> tuple[int | None, int | None]:
    """The first position where the id or the fp32 logprob bits differ, and the first where the
    id does, over the positions both runs produced. A logprob past its list's end is missing
    (None), which equals only another missing one."""

    def logprob(logprobs: Sequence[float | None], pos: int) -> float | None:
        return logprobs[pos] if pos < len(logprobs) else None

    bits_at = text_at = None
    for pos, (a, b) in enumerate(zip(spec_ids, shadow_ids, strict=False)):
        if text_at is None and a != b:
            text_at = pos
        if bits_at is None and not (
            a == b and same_fp32_bits(logprob(spec_logprobs, pos), logprob(shadow_logprobs, pos))
        ):
            bits_at = pos
        if text_at is not None:
            break  # bits_at <= text_at: both found
    return bits_at, text_at


MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
NEAR_TIE_STEPS = 64
"""A gap within this many rounding steps of the compute dtype (a logit is rounded at its own
magnitude, up to ~2^6 times a logprob's) is a near-tie: the paths' last bits can decide it."""


def shadow_margin(top1: tuple[int, float], top2: tuple[int, float], dtype: str) -> Margin:
    """The shadow's margin at a divergence from its top two (token id, logprob) there, judged
    by the dtype the model computes in ("float32", "bfloat16", "float16"). Both runners build it
    here: the native one from the shadow's logprob row, SGLang from its top logprobs."""
    (id1, lp1), (id2, lp2) = top1, top2
    ulps = fp32_ulps(lp1, lp2)
    step = 2 ** (23 - MANTISSA_BITS[dtype])  # one rounding step of `dtype`, in fp32 ulps
    return Margin(
        top1_token=id1, top2_token=id2, gap=lp1 - lp2, ulps=ulps,
        near_tie=ulps <= NEAR_TIE_STEPS * step,
    )  # fmt: skip


def divergences_to_report(bits_at: int | None, text_at: int | None) -> list[int]:
    """Where a prompt gets a `Divergence`: its first bit divergence, and its first token-id
    divergence when that comes later (the text changes too)."""
    return sorted({bits_at, text_at} - {None})  # type: ignore[type-var]


class SessionEvents:
    """One session's outgoing events: each is counted into the session totals, then sunk."""

    def __init__(self, settings: SessionSettings, sink: Sink) -> None:
        self.settings = settings
        self.stats = SessionStats()
        self._sink = sink

    def emit(self, event: Event) -> None:
        self.stats.consume(event)
        self._sink(event)

    def session_start(
        self, extra_config: dict[str, Any], versions: dict[str, str], device: str, gemm: str
    ) -> None:
        """The header: the settings, what the engine adds to them, where it runs."""
        config = self.settings.model_dump(mode="json") | extra_config
        self.emit(SessionStart(config=config, versions=versions, device=device, gemm_backend=gemm))

    def divergence(
        self,
        prompt_index: int,
        position: int,
        *,
        step: int,
        k: int,
        verify_mode: str,
        gemm_backend: str,
        spec: tuple[int, float | None, str],
        shadow: tuple[int, float | None, str],
        context: str = "",
        root_cause: RootCause | None = None,
        margin: Margin | None = None,
    ) -> None:
        """Generated token `position` differs from the shadow's: `spec` and `shadow` are each
        run's (token id, logprob or None, text) there; `margin`: the shadow's top-1 / top-2
        there (`shadow_margin`), None where the engine does not report it."""
        (a, la, ta), (b, lb, tb) = spec, shadow
        self.emit(
            Divergence(
                prompt_index=prompt_index,
                position=position,
                step=step,
                k=k,
                verify_mode=verify_mode,  # type: ignore[arg-type]
                gemm_backend=gemm_backend,
                what="token" if a != b else "logprob",
                spec_token=a,
                shadow_token=b,
                spec_logprob=la if la is not None else float("nan"),
                shadow_logprob=lb if lb is not None else float("nan"),
                spec_text=ta,
                shadow_text=tb,
                context=context,
                root_cause=root_cause,
                shadow_margin=margin,
            )
        )

    def prompt_done(
        self,
        prompt_index: int,
        *,
        new_tokens: int,
        seconds: float,
        verify_steps: int,
        accepted_drafts: int,
        proposed_drafts: int,
        checked: bool,
        bits_at: int | None,
        text_at: int | None,
        compared_all: bool,
        skipped: bool = False,
    ) -> None:
        """A prompt's totals and verdict. `checked`: a shadow was compared with it; exact when
        no bit differed and the shadow covered every token (same text: no id differed)."""
        self.emit(
            PromptDone(
                prompt_index=prompt_index,
                new_tokens=new_tokens,
                seconds=seconds,
                verify_steps=verify_steps,
                accepted_drafts=accepted_drafts,
                proposed_drafts=proposed_drafts,
                exact=checked and bits_at is None and compared_all,
                same_text=(text_at is None and compared_all) if checked else None,
                skipped=skipped,
            )
        )

    def finish(self) -> Summary:
        """The session's totals, emitted last and returned."""
        summary = self.stats.summary()
        self.emit(summary)
        return summary
