"""The runner protocol both engines implement, and the emitting code they share.

A runner turns an engine into the event stream: `run(settings, sink, controls, stop)` blocks,
calls `sink(event)` from the calling thread, applies `controls` between steps (native) or
prompts (SGLang), ends early when `stop` is set, and returns the `Summary` it emitted last.
`NativeRunner` (specdash.runs.native) and `SGLangRunner` (specdash.runs.sglang) implement it;
`run_engine` picks the one `settings.engine` names.

Both emit through `SessionEvents`, so a session's header, its divergences and its per-prompt
verdicts are built one way: the same fields, the same rule for "exact", the same totals.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from specdash.controls import Controls
from specdash.events import (
    Divergence,
    Event,
    PromptDone,
    RootCause,
    SessionStart,
    Sink,
    Summary,
)
from specdash.metrics import same_fp32_bits
from specdash.settings import SessionSettings
from specdash.stats import SessionStats

if TYPE_CHECKING:
    from specdash.runs.sglang import SGLangOptions


class Runner(Protocol):
    def run(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
    ) -> Summary: ...


def runner_for(settings: SessionSettings, sglang_options: SGLangOptions | None = None) -> Runner:
    """The runner of the engine `settings.engine` names (imported lazily: torch, SGLang)."""
    if settings.engine == "sglang":
        from specdash.runs.sglang import SGLangOptions, SGLangRunner

        return SGLangRunner(sglang_options or SGLangOptions())
    from specdash.runs.native import NativeRunner

    return NativeRunner()


def run_engine(
    settings: SessionSettings,
    sink: Sink,
    controls: Controls | None = None,
    stop: threading.Event | None = None,
    sglang_options: SGLangOptions | None = None,
) -> Summary:
    """The session on the engine `settings.engine` names (native, or SGLang in-process)."""
    return runner_for(settings, sglang_options).run(settings, sink, controls, stop)


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
    ) -> None:
        """Generated token `position` differs from the shadow's: `spec` and `shadow` are each
        run's (token id, logprob or None, text) there."""
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
            )
        )

    def finish(self) -> Summary:
        """The session's totals, emitted last and returned."""
        summary = self.stats.summary()
        self.emit(summary)
        return summary
