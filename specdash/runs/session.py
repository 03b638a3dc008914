"""One session, whichever engine runs it: `Session` is the skeleton, a `Backend` the engine.

The skeleton owns what a session means: the settings become the header, prompts are queued
(typed ones from the dashboard first) and taken `batch` at a time, controls are applied between
steps (each change an event, a pause recorded both ways), every token is compared with the
shadow's as soon as both exist (ids and fp32 logprob bits, the first divergence and the first
change of text reported, each `Divergence` built here from the backend's `Evidence` by the one
comparison, `metrics.token_difference`), each prompt gets its verdict, and the summary comes
last.

A backend only runs its engine: it opens (loads weights or starts engines, encodes the prompt
set, says what the header holds), prefills a prompt, steps the prompts in flight, runs the
shadow, says what it knows of a divergence, and applies or refuses a control change; it never
calls back into the session. The native engine's step is one verify step
of every prompt in flight, its shadow advancing in the same step; SGLang's step is a whole batch
of requests run to the end, its shadow a second engine, either beside it or after it has shut
down (`late_shadows`). Both give the same events (`specdash.events`) and the same `Summary`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from specdash.controls import CONTROLS, Control, Controls, ControlState
from specdash.errors import UsageError
from specdash.events import (
    ControlChange,
    Divergence,
    EngineError,
    Event,
    GemmChoice,
    Idle,
    Margin,
    PromptDone,
    PromptStart,
    RootCause,
    SessionStart,
    Sink,
    Summary,
)
from specdash.metrics import Comparison, token_difference
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
    comparison: Comparison = field(default_factory=Comparison)
    """Its tokens against the shadow's, as far as both have them."""
    skipped: bool = False
    """`n` cut it short."""

    def compare(self) -> list[int]:
        """Compare the positions both runs have produced since the last call; the positions
        to report (`Comparison.advance`)."""
        return self.comparison.advance(
            self.ids, self.logprobs, self.shadow_ids, self.shadow_logprobs
        )

    def context(self, position: int) -> list[int]:
        """The prompt and generated ids just before generated token `position` (a
        divergence's `context`, decoded by the backend's tokenizer)."""
        end = len(self.prompt) + position
        return [*self.prompt, *self.ids][max(0, end - CONTEXT_TOKENS) : end]


CONTEXT_TOKENS = 24
"""How many tokens before a divergence its `context` shows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What a backend knows of a generated token where its two runs differ: both runs' token
    and logprob there (None: the engine returned none), their texts and the tokens before,
    the step that emitted it and what that step ran under, and what explains it (the root
    cause, the shadow's margin, the prefix-cache reads). The session judges it (`_compare`)."""

    spec: tuple[int, float | None]
    shadow: tuple[int, float | None]
    texts: tuple[str, str]
    context: str
    step: int
    k: int
    verify_mode: VerifyMode
    gemm_backend: str
    root_cause: RootCause | None = None
    margin: Margin | None = None
    """The shadow's top-1 / top-2 there; None where the engine does not report it."""
    prefix_cached: tuple[int, int] | None = None
    """The prompt tokens each engine read from its prefix cache, where it reports them."""


@dataclass(slots=True, kw_only=True)
class Header:
    """What an opened backend says of itself in the session's header (`SessionStart`)."""

    gemm_backend: str
    gemm_backends: list[GemmChoice]
    speculative_algorithm: str | None
    quantization: str | None = None
    checked: bool
    """A shadow compares the output (the settings ask for one and the engine runs it)."""
    rate_includes_prefill: bool = False
    versions: dict[str, str]
    device: str
    config: dict[str, Any]
    """What reproducing the session needs beyond the settings, merged over them in
    `SessionStart.config`."""


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

    def evidence(self, flight: Flight, position: int, first: bool) -> Evidence:
        """Generated token `position` of `flight` differs from the shadow's (`first`: its first
        bit divergence; a later one is the first change of text): what the backend knows of
        it."""
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
        self.emit(
            SessionStart(
                engine=self.settings.engine,
                gemm_backend=header.gemm_backend,
                gemm_backends=header.gemm_backends,
                speculative_algorithm=header.speculative_algorithm,
                quantization=header.quantization,
                shadow=header.checked,
                rate_includes_prefill=header.rate_includes_prefill,
                config=self.settings.model_dump(mode="json") | header.config,
                versions=header.versions,
                device=header.device,
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
        """Every new divergence of `flight` as a `Divergence`, judged from the backend's
        evidence by the one token comparison (`metrics.token_difference`); a missing logprob
        is NaN in the event."""
        for pos in flight.compare():
            ev = self.backend.evidence(flight, pos, first=pos == flight.comparison.bits_at)
            what = token_difference(*ev.spec, *ev.shadow)
            assert what is not None, f"the evidence at {pos} shows no difference"
            (spec_token, spec_lp), (shadow_token, shadow_lp) = ev.spec, ev.shadow
            self.emit(
                Divergence(
                    prompt_index=flight.index,
                    position=pos,
                    step=ev.step,
                    k=ev.k,
                    verify_mode=ev.verify_mode,
                    gemm_backend=ev.gemm_backend,
                    what=what,
                    spec_token=spec_token,
                    shadow_token=shadow_token,
                    spec_logprob=spec_lp if spec_lp is not None else float("nan"),
                    shadow_logprob=shadow_lp if shadow_lp is not None else float("nan"),
                    spec_text=ev.texts[0],
                    shadow_text=ev.texts[1],
                    context=ev.context,
                    root_cause=ev.root_cause,
                    shadow_margin=ev.margin,
                    prefix_cached=ev.prefix_cached,
                )
            )

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
                exact=checked and flight.comparison.bits_at is None and compared_all,
                same_text=(flight.comparison.text_at is None and compared_all) if checked else None,
                skipped=flight.skipped,
            )
        )
