"""One session, whichever engine runs it: `Session` is the skeleton, a `Backend` the engine.

The skeleton owns what a session means: the settings become the header, prompts are queued
(typed ones from the dashboard first) and taken `batch` at a time, controls are applied between
steps (each change an event, a pause recorded both ways), every token is compared with the
shadow's as soon as both exist (ids and fp32 logprob bits, the first divergence and the first
change of text reported), each prompt gets its verdict, and the summary comes last.

A backend only runs its engine: it opens (loads weights or starts engines, encodes the prompt
set, says what the header adds), prefills a prompt, steps the prompts in flight, runs the
shadow, and applies or refuses a control change. The native engine's step is one verify step
of every prompt in flight, its shadow advancing in the same step; SGLang's step is a whole batch
of requests run to the end, its shadow a second engine, either beside it or after it has shut
down (`late_shadows`). Both give the same events (`specdash.events`) and the same `Summary`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from specdash.controls import CONTROLS, Control, Controls, ControlState
from specdash.errors import UsageError
from specdash.events import (
    ControlChange,
    Divergence,
    EngineError,
    Event,
    Idle,
    Margin,
    PromptDone,
    PromptStart,
    RootCause,
    SessionStart,
    Sink,
    Summary,
)
from specdash.metrics import fp32_ulps, same_fp32_bits
from specdash.prompts import Prompt, load_prompts
from specdash.runs.heap import trim_heap
from specdash.settings import SessionSettings, VerifyMode
from specdash.stats import SessionStats


@dataclass(slots=True, eq=False)
class Flight:
    """One prompt in flight: what both runs produced so far (the backend appends), and what its
    `PromptDone` will say."""

    index: int
    text: str
    prompt: list[int]
    ids: Sequence[int] = ()
    logprobs: Sequence[float | None] = ()
    """Per generated token; None where the engine returned none (never equal to a number)."""
    shadow_ids: Sequence[int] = ()
    shadow_logprobs: Sequence[float | None] = ()
    shadow_later: bool = False
    """The shadow runs after the speculative engine has shut down (`Backend.late_shadows`)."""
    done: bool = False
    decode_s: float = 0.0
    """Seconds of speculative decoding (prefill and the shadow excluded)."""
    shadow_s: float = 0.0
    """Seconds of the shadow's plain decode of the same tokens, timed as `decode_s` is."""
    verify_steps: int = 0
    accepted_drafts: int = 0
    proposed_drafts: int = 0
    compared: int = 0
    """Positions compared with the shadow so far."""
    bits_at: int | None = None
    """The first position whose id or fp32 logprob bits differ from the shadow's."""
    text_at: int | None = None
    """The first position whose token id differs."""
    skipped: bool = False
    """`n` cut it short."""

    def compare(self) -> list[int]:
        """Compare the positions both runs have produced since the last call; the positions
        to report: the first bit divergence, and the first id divergence when it comes later
        (the text changed too). Nothing is left to find once the text has diverged."""
        found = []
        end = min(len(self.ids), len(self.shadow_ids))
        for pos in range(self.compared, end):
            if self.text_at is not None:
                break
            same_id = self.ids[pos] == self.shadow_ids[pos]
            if self.bits_at is None and not (
                same_id and same_fp32_bits(self.logprobs[pos], self.shadow_logprobs[pos])
            ):
                self.bits_at = pos
                found.append(pos)
            if not same_id:
                self.text_at = pos
                if pos != self.bits_at:
                    found.append(pos)
        self.compared = max(self.compared, end)
        return found


@dataclass(slots=True)
class Header:
    """What an opened backend adds to the session's header."""

    config: dict[str, Any]
    """Merged over the settings in `SessionStart.config`."""
    versions: dict[str, str]
    device: str
    gemm_backend: str
    checked: bool
    """A shadow compares the output (the settings ask for one and the engine runs it)."""


class Backend(Protocol):
    """An engine as `Session` drives it. Every call comes from the session's thread, between
    steps; `emit` (given to `open`) takes the events only the backend knows of."""

    def open(
        self, prompts: list[Prompt], emit: Sink, stack: contextlib.ExitStack
    ) -> tuple[Header, list[list[int]]]:
        """Load or start the engine (what must be undone goes on `stack`), encode `prompts`
        (a bad one raises `UsageError` before anything runs); the header and the ids."""
        ...

    def encode(self, name: str, text: str) -> list[int]:
        """A prompt typed in the dashboard (`UsageError` when it cannot run)."""
        ...

    def prefill(self, flight: Flight, step: int) -> None:
        """Start `flight` before session step `step`: its prefill, and the events of it."""
        ...

    def step(self, flights: list[Flight], controls: ControlState, step: int) -> Iterator[Flight]:
        """Session step `step` of `flights` under `controls`; each flight is yielded after its
        events, with its shadow as far as the backend runs it alongside (`shadow_later`: not at
        all)."""
        ...

    def late_shadows(self, flights: list[Flight]) -> Iterator[Flight]:
        """The speculative engine is done: run the shadows left for now, yielding each flight
        once its shadow is complete."""
        ...

    def divergence(self, flight: Flight, position: int, first: bool) -> Divergence:
        """Generated token `position` of `flight` differs from the shadow's (`first`: its first
        bit divergence; a later one is the first change of text)."""
        ...

    def apply(self, name: str, value: object) -> bool:
        """Control `name` changed to `value` between steps: apply it, or refuse it (False) with
        an `EngineError` event saying why."""
        ...

    def release(self, flight: Flight) -> None:
        """`flight` has its verdict; what it held serves the next one."""
        ...


class Session:
    """One session of `backend`; `run()` blocks, calls `sink` from the calling thread (and
    from the backend's telemetry thread), ends early when `stop` is set, and returns the
    `Summary` it emitted last."""

    def __init__(
        self,
        settings: SessionSettings,
        backend: Backend,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
        prompts: list[Prompt] | None = None,
    ) -> None:
        self.settings, self.backend = settings, backend
        self.prompts = prompts
        """The prompt set, when the caller has read it already (a FIFO or a pipe can be read
        only once); else it is read from `settings.prompts` when the session runs."""
        self.stats = SessionStats()
        self._sink = sink
        self.controls = controls or Controls.from_settings(settings)
        self.stop = stop or threading.Event()
        self.applied = self.controls.snapshot()
        self.step_no = 0
        self.checked = settings.shadow
        self._typed = 0
        """The index the next prompt typed in the dashboard gets (after the prompt set's)."""

    def emit(self, event: Event) -> None:
        """Count `event` into the session's totals, then send it on."""
        self.stats.consume(event)
        self._sink(event)

    def run(self) -> Summary:
        prompts = self.prompts if self.prompts is not None else load_prompts(self.settings.prompts)
        with contextlib.ExitStack() as stack:
            header, encoded = self.backend.open(prompts, self.emit, stack)
            self.checked = header.checked
            if self.controls.snapshot().gemm_backend != header.gemm_backend:
                self.controls.update(gemm_backend=header.gemm_backend)  # "auto", resolved
            self.applied = self.controls.snapshot()
            self._session_start(header)
            queue = deque(
                Flight(i, p.text, ids)
                for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True))
            )
            self._typed = len(prompts)
            later: list[Flight] = []
            while not self.stop.is_set():
                if group := self._next_group(queue):
                    later += self._run_group(group)
                elif self.controls.stay_open and not later:  # the dashboard: wait for a prompt
                    self.emit(Idle())
                    trim_heap()  # the last group's caches, while nothing runs
                    self.controls.wait_for_prompt(self.stop)
                else:
                    break
            for flight in self.backend.late_shadows(later):
                self._compare(flight)
                self._done(flight)
                self.backend.release(flight)
        trim_heap()  # the last group's caches: the dashboard stays open after the session
        summary = self.stats.summary()
        self.emit(summary)
        return summary

    def _session_start(self, header: Header) -> None:
        # "shadow": whether a shadow compares this session's output (SGLang runs none with
        # speculation off), which is what every reader of the header takes it for
        config = self.settings.model_dump(mode="json") | header.config | {"shadow": header.checked}
        self.emit(
            SessionStart(
                config=config,
                versions=header.versions,
                device=header.device,
                gemm_backend=header.gemm_backend,
            )
        )

    def _next_group(self, queue: deque[Flight]) -> list[Flight]:
        """Up to `batch` prompts: typed ones (dashboard) first, then the prompt set's."""
        group: list[Flight] = []
        while len(group) < self.settings.batch:
            typed = self.controls.take_user_prompt()
            if typed is not None:
                index, self._typed = self._typed, self._typed + 1
                try:
                    group.append(Flight(index, typed, self.backend.encode(f"typed-{index}", typed)))
                except UsageError as e:  # a bad typed prompt must not end the session
                    self.emit(EngineError(message=str(e), fatal=False))
            elif queue:
                group.append(queue.popleft())
            else:
                break
        return group

    def _run_group(self, flights: list[Flight]) -> list[Flight]:
        """Prefill `flights`, step them until every one is done (or the dashboard asks for the
        next prompt, or the session stops), then give each its verdict; the flights whose
        shadow runs later are returned."""
        for flight in flights:
            self.emit(
                PromptStart(
                    prompt_index=flight.index, prompt_tokens=len(flight.prompt), text=flight.text
                )
            )
            self.backend.prefill(flight, self.step_no)
        trim_heap()  # the prefills' freed activations back to the OS, or RSS keeps them
        while active := self._active(flights):
            for flight in self.backend.step(active, self.applied, self.step_no):
                self._compare(flight)
            self.step_no += 1
        for flight in flights:
            if not flight.shadow_later:
                self._done(flight)
                self.backend.release(flight)
        return [f for f in flights if f.shadow_later]

    def _active(self, flights: list[Flight]) -> list[Flight]:
        """Between steps: apply the controls, then the flights still decoding (none when the
        session stops or the dashboard asks for the next prompt)."""
        if self.stop.is_set():
            return []
        self._apply_controls()
        if self.controls.take_next_prompt_request():
            for flight in flights:
                if not flight.done:
                    flight.skipped = True
                    self.emit(ControlChange(name="prompt", old=str(flight.index), new="skipped",
                                            applied_step=self.step_no))  # fmt: skip
            return []
        return [f for f in flights if not f.done]

    def _apply_controls(self) -> None:
        """Pick up control changes between steps; each change is itself an event.

        A pause is recorded before the session blocks on it and again on resume, so traces
        and replays show it.
        """
        new = self.controls.snapshot()
        if new.paused:
            self._take(new)
            self.controls.wait_while_paused(self.stop)
            new = self.controls.snapshot()
        self._take(new)

    def _take(self, new: ControlState) -> None:
        if new == self.applied:
            return
        for name in CONTROLS:
            old_v, new_v = getattr(self.applied, name), getattr(new, name)
            if old_v != new_v and not self.backend.apply(name, new_v):
                new = replace(new, **{name: old_v})
                self.controls.update(**{name: old_v})
        recorded: tuple[Control | Literal["paused"], ...] = (*CONTROLS, "paused")
        for setting in recorded:
            old_v, new_v = getattr(self.applied, setting), getattr(new, setting)
            if old_v != new_v:
                self.emit(
                    ControlChange(
                        name=setting, old=str(old_v), new=str(new_v), applied_step=self.step_no
                    )
                )
        self.applied = new

    def _compare(self, flight: Flight) -> None:
        for pos in flight.compare():
            self.emit(self.backend.divergence(flight, pos, first=pos == flight.bits_at))

    def _done(self, flight: Flight) -> None:
        """A prompt's totals and verdict: exact when a shadow was compared with every token
        and no bit differed (same text: no id differed)."""
        checked = self.checked
        compared_all = len(flight.shadow_ids) == len(flight.ids)
        self.emit(
            PromptDone(
                prompt_index=flight.index,
                new_tokens=len(flight.ids),
                seconds=flight.decode_s,
                shadow_seconds=flight.shadow_s,
                verify_steps=flight.verify_steps,
                accepted_drafts=flight.accepted_drafts,
                proposed_drafts=flight.proposed_drafts,
                exact=checked and flight.bits_at is None and compared_all,
                same_text=(flight.text_at is None and compared_all) if checked else None,
                skipped=flight.skipped,
            )
        )


CONTEXT_TOKENS = 24
"""How many tokens before a divergence its `context` shows."""


def context_ids(flight: Flight, position: int) -> list[int]:
    """The prompt and generated ids just before generated token `position` (a divergence's
    `context`, decoded by the backend's tokenizer)."""
    end = len(flight.prompt) + position
    return [*flight.prompt, *flight.ids][max(0, end - CONTEXT_TOKENS) : end]


def divergence_event(
    flight: Flight,
    position: int,
    *,
    step: int,
    k: int,
    verify_mode: VerifyMode,
    gemm_backend: str,
    texts: tuple[str, str],
    context: str = "",
    root_cause: RootCause | None = None,
    margin: Margin | None = None,
    prefix_cached: tuple[int, int] | None = None,
) -> Divergence:
    """The `Divergence` at generated token `position` of `flight`: `texts` are the spec and
    shadow token's text there; a missing logprob is NaN; `margin`: the shadow's top-1 / top-2
    there (`shadow_margin`), None where the engine does not report it; `prefix_cached`: the
    prompt tokens each engine read from its prefix cache, where it reports them."""
    a, b = flight.ids[position], flight.shadow_ids[position]
    la, lb = flight.logprobs[position], flight.shadow_logprobs[position]
    return Divergence(
        prompt_index=flight.index,
        position=position,
        step=step,
        k=k,
        verify_mode=verify_mode,
        gemm_backend=gemm_backend,
        what="token" if a != b else "logprob",
        spec_token=a,
        shadow_token=b,
        spec_logprob=la if la is not None else float("nan"),
        shadow_logprob=lb if lb is not None else float("nan"),
        spec_text=texts[0],
        shadow_text=texts[1],
        context=context,
        root_cause=root_cause,
        shadow_margin=margin,
        prefix_cached=prefix_cached,
    )


MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
NEAR_TIE_STEPS = 64
"""A gap within this many rounding steps of the compute dtype (a logit is rounded at its own
magnitude, up to ~2^6 times a logprob's) is a near-tie: the paths' last bits can decide it."""


def shadow_margin(top1: tuple[int, float], top2: tuple[int, float], dtype: str) -> Margin:
    """The shadow's margin at a divergence from its top two (token id, logprob) there, judged
    by the dtype the model computes in ("float32", "bfloat16", "float16"). Every backend builds
    it here: the native one from the shadow's logprob row, SGLang from the shadow request's top
    logprobs."""
    (id1, lp1), (id2, lp2) = top1, top2
    ulps = fp32_ulps(lp1, lp2)
    step = 2 ** (23 - MANTISSA_BITS[dtype])  # one rounding step of `dtype`, in fp32 ulps
    return Margin(
        top1_token=id1, top2_token=id2, gap=lp1 - lp2, ulps=ulps,
        near_tie=ulps <= NEAR_TIE_STEPS * step,
    )  # fmt: skip
