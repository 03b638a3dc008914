"""What the dashboard shows, folded from the event stream: windows, totals and ring buffers.

No Textual here, so a live session, a trace replay and the tests all compute the same
numbers. Windows are measured in event time (`t_ns`), never the wall clock, so replaying a
trace shows what the live run showed. Every series is bounded.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from specdash import metrics
from specdash.events import (
    ControlChange,
    Divergence,
    EngineError,
    Event,
    Idle,
    Prefill,
    PromptDone,
    PromptStart,
    SessionStart,
    StartPhase,
    Summary,
    TelemetrySample,
    Token,
    VerifyStep,
)
from specdash.stats import BusyClock

WINDOW_NS = 1_000_000_000
"""Windowed numbers cover the last second of event time (labelled "1 s")."""
HISTORY = 600
"""Points kept per plotted series: a longer one keeps every other point (`Series`)."""
STREAM_TOKENS = 4000
"""Tokens of the current prompt kept for the token stream."""
MAX_DIVERGENCES = 1000
MAX_REQUESTS = 1000
"""Verdicts kept for the requests line (it shows the latest that fit the terminal's width):
the oldest finished ones leave, those still running stay, so a day of prompts costs no more."""
Verdict = Literal["running", "exact", "diverged", "unchecked"]
"""A prompt's verdict: "diverged" from its first divergence on, the others once it is done
("unchecked": no shadow ran)."""


@dataclass(slots=True)
class StepTimes:
    """Tokens and seconds of the speculative path vs the shadow for one or more steps."""

    tokens: int = 0
    spec_s: float = 0.0
    shadow_s: float = 0.0

    def add(self, step: VerifyStep, sign: int = 1) -> None:
        self.tokens += sign * len(step.emitted_tokens)
        self.spec_s += sign * step.spec_s
        self.shadow_s += sign * step.shadow_s

    @property
    def spec_tps(self) -> float | None:
        return metrics.tokens_per_s(self.tokens, self.spec_s)

    @property
    def shadow_tps(self) -> float | None:
        return metrics.tokens_per_s(self.tokens, self.shadow_s)


class Series:
    """A plotted series of (x, *ys) points over the whole session, bounded: once it holds
    HISTORY points it keeps every other one and from then on samples half as often, so the
    chart still spans the session from its start (a deque of the latest points would show only
    the end of a long set, and after idle only the idle samples)."""

    def __init__(self) -> None:
        self.points: list[tuple[float, ...]] = []
        self._stride = 1
        self._offered = 0

    def append(self, point: tuple[float, ...]) -> None:
        self._offered += 1
        if self._offered % self._stride:
            return
        self.points.append(point)
        if len(self.points) >= HISTORY:
            del self.points[1::2]
            self._stride *= 2

    def __iter__(self):
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)


@dataclass(slots=True)
class StreamToken:
    position: int
    text: str
    source: str
    """"draft" (an accepted draft), "bonus" (the verifier's own token) or "decode"."""
    diverged: bool = False


@dataclass
class DashboardModel:
    """Everything the panels read. `consume` each event in order; `revision` moves on change."""

    revision: int = 0
    t0_ns: int | None = None
    now_ns: int = 0
    clock: BusyClock = field(default_factory=BusyClock)
    """The session's wall clock: stopped while paused or idle."""
    # status
    started: bool = False
    """SessionStart seen: the weights are loaded. Before it, the dashboard says it is loading."""
    start_phases: dict[str, StartPhase] = field(default_factory=dict)
    """Each starting engine's latest phase, until SessionStart (SGLang: weights, graph
    captures); the spec and shadow engines start at the same time."""
    prefill: str | None = None
    """What is being prefilled now ("prompt 3, 4,512 tokens"), None once its first token is out."""
    prefill_t_ns: int = 0
    """When that prefill began (event time)."""
    shadow: bool = True
    per_request: bool = False
    """The engine times whole requests, not verify steps (SGLang: the header's
    `rate_includes_prefill`): the spec and shadow rates come from each finished request."""
    engine: str = "?"
    model: str = "?"
    drafter: str = "?"
    device: str = "?"
    k: int = 0
    verify_mode: str = "?"
    gemm_backend: str = "?"
    gemm_backends: list[str] = field(default_factory=list)
    gemm_kernel: str | None = None
    """What the session's GEMM backend runs in exact mode where its name does not say it (the
    CPU's `torch` backend: the compiled C loop); None: its name says it."""
    speculation: bool = True
    paused: bool = False
    idle: bool = False
    """Every prompt decoded; the engine waits for a typed one (`Idle`)."""
    prompt_index: int | None = None
    requests: dict[int, Verdict] = field(default_factory=dict)
    """Each prompt's verdict by prompt index, in the order they started: several run at once
    in a batch, and the status line names only the latest."""
    prompts_done: int = 0
    exact_prompts: int = 0
    finished: bool = False
    summary: Summary | None = None
    errors: list[EngineError] = field(default_factory=list)
    # throughput
    session_tokens: int = 0
    session_steps: StepTimes = field(default_factory=StepTimes)
    window_steps: StepTimes = field(default_factory=StepTimes)
    session_requests: StepTimes = field(default_factory=StepTimes)
    """Every finished request's new tokens, seconds and shadow seconds (`PromptDone`)."""
    last_request: StepTimes = field(default_factory=StepTimes)
    tps_series: Series = field(default_factory=Series)
    """(busy seconds, spec t/s, shadow t/s): one point per verify step, over the last 1 s, or
    per finished request where the engine times requests (`per_request`)."""
    steps: int = 0
    """Every step, plain decode steps (speculation off) included."""
    next_step: int = 0
    """The engine's counter for its next step (a batch's sequences share one): where a change
    made now applies, as every `ControlChange.applied_step` counts."""
    # acceptance: verify steps only
    verify_steps: int = 0
    verify_tokens: int = 0
    accepted_drafts: int = 0
    proposed_drafts: int = 0
    accepted_series: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    histogram: Counter[int] = field(default_factory=Counter)
    position_tried: Counter[int] = field(default_factory=Counter)
    position_accepted: Counter[int] = field(default_factory=Counter)
    max_k: int = 0
    # gpu
    telemetry: TelemetrySample | None = None
    bandwidth_series: Series = field(default_factory=Series)
    """(busy seconds, DRAM GB/s or mem busy %), one point per sample taken while the engine
    worked: the samples of an idle or paused engine show in the numbers, not the chart."""
    # divergence and stream
    divergences: deque[Divergence] = field(default_factory=lambda: deque(maxlen=MAX_DIVERGENCES))
    divergence_count: int = 0
    first_divergence: Divergence | None = None
    prompt_text: str = ""
    stream: deque[StreamToken] = field(default_factory=lambda: deque(maxlen=STREAM_TOKENS))
    _diverged_positions: set[int] = field(default_factory=set)
    _window: deque[VerifyStep] = field(default_factory=deque)
    _token_times: deque[int] = field(default_factory=deque)

    def consume(self, event: Event) -> None:
        if event.t_ns < self.now_ns:  # a thread's event stamped before the last one seen: at
            event = event.model_copy(update={"t_ns": self.now_ns})  # its time, as traces have it
        if self.t0_ns is None:
            self.t0_ns = event.t_ns
        self.now_ns = event.t_ns
        self.clock.consume(event)
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)
        self._expire_window()
        self.revision += 1

    # -- derived numbers ---------------------------------------------------------------

    @property
    def tokens_per_s_window(self) -> float:
        """Emitted tokens per second of event time over the last 1 s (wall rate, all phases)."""
        return len(self._token_times) / (WINDOW_NS / 1e9)

    @property
    def idle_reason(self) -> str | None:
        """Why the engine is not stepping ("paused", "idle", "finished"), None while it runs:
        the last second's numbers then describe no current rate."""
        if self.finished:
            return "finished"
        if self.paused:
            return "paused"
        if self.idle:
            return "idle"
        return None

    @property
    def tokens_per_s_session(self) -> float | None:
        """Emitted tokens per second of the session's wall clock, which stops while the engine
        is paused or idle: a live session and its replay, however watched, say the same."""
        return metrics.tokens_per_s(self.session_tokens, self.clock.seconds(self.now_ns))

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.t0_ns is None else (self.now_ns - self.t0_ns) / 1e9

    @property
    def busy_s(self) -> float:
        """Seconds of session time: the clock the session numbers use, stopped while the engine
        is idle or paused, so the charts' x axis never stretches across time nothing ran."""
        return self.clock.seconds(self.now_ns)

    @property
    def rate_steps(self) -> tuple[StepTimes, StepTimes]:
        """(latest, session) spec vs shadow timings: the last second's verify steps and all of
        them, or the last finished request and all of them (`per_request`)."""
        if self.per_request:
            return self.last_request, self.session_requests
        return self.window_steps, self.session_steps

    @property
    def acceptance_rate(self) -> float | None:
        return metrics.acceptance_rate(self.accepted_drafts, self.proposed_drafts)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step including the bonus (session)."""
        return metrics.mean_accepted_length(self.verify_tokens, self.verify_steps)

    @property
    def mean_accepted_length_window(self) -> float | None:
        steps = [s for s in self._window if not s.plain]
        return metrics.mean_accepted_length(sum(len(s.emitted_tokens) for s in steps), len(steps))

    def acceptance_by_position(self) -> list[float | None]:
        """P(draft i accepted) for i in 0..max_k-1, over the session."""
        return [
            self.position_accepted[i] / self.position_tried[i] if self.position_tried[i] else None
            for i in range(self.max_k)
        ]

    @property
    def exactness(self) -> str:
        """The verdict, once there is one: a token is compared with the shadow at the verify
        step that emits it (a prompt's first token comes from the shared prefill)."""
        if self.first_divergence is not None:
            d = self.first_divergence
            return f"DIVERGED at token {d.position} (prompt {d.prompt_index})"
        if not self.shadow:
            return "NOT CHECKED (no shadow)"
        if self.steps == 0:
            return "NO VERDICT YET"
        return "EXACT so far"

    # -- event handlers ----------------------------------------------------------------

    def _on_start_phase(self, e: StartPhase) -> None:
        if not self.started:  # a trace holds them after its header: a replay starts there
            self.start_phases[e.engine] = e

    def _on_session_start(self, e: SessionStart) -> None:
        c = e.config
        self.started = True
        self.t0_ns = e.t_ns  # elapsed time counts from the header, live and in a trace alike
        self.shadow = e.shadow
        self.per_request = e.rate_includes_prefill
        self.engine = e.engine
        self.model = str(c.get("model") or c.get("preset") or "embedded")
        self.drafter = str(c.get("drafter", self.drafter))
        self.k = int(c.get("k", self.k))
        self.verify_mode = str(c.get("verify_mode", c.get("verify", self.verify_mode)))
        self.speculation = bool(c.get("speculation", True))
        self.gemm_backend = e.gemm_backend
        self.gemm_backends = e.usable_gemm_backends  # what `g` cycles
        kernel = c.get("gemm_kernel")
        self.gemm_kernel = None if kernel in (None, e.gemm_backend) else str(kernel)
        self.device = e.device

    def _on_idle(self, e: Idle) -> None:
        self.idle = True

    def _on_prompt_start(self, e: PromptStart) -> None:
        self.idle = False
        self.prefill = f"prompt {e.prompt_index}, {e.prompt_tokens:,} tokens"
        self.prefill_t_ns = e.t_ns
        self.prompt_index = e.prompt_index
        self.requests[e.prompt_index] = "running"
        if len(self.requests) > MAX_REQUESTS:
            done = [i for i, v in self.requests.items() if v != "running"]
            for i in done[: len(self.requests) - MAX_REQUESTS]:
                del self.requests[i]
        self.prompt_text = e.text
        self.stream.clear()
        self._diverged_positions.clear()

    def _on_prefill(self, e: Prefill) -> None:
        self.prefill = None

    def _on_verify_step(self, e: VerifyStep) -> None:
        if not self.shadow:  # no shadow decode ran: the µs the engine timed are no shadow rate
            e = e.model_copy(update={"shadow_s": 0.0})
        self.steps += 1
        self.next_step = max(self.next_step, e.step + 1)
        self.verify_mode, self.gemm_backend = e.verify_mode, e.gemm_backend
        if not e.plain:
            self.k = e.k
            self.verify_steps += 1
            self.verify_tokens += len(e.emitted_tokens)
            self.accepted_drafts += e.accepted
            self.proposed_drafts += e.proposed
            self.max_k = max(self.max_k, e.k)
            self.histogram[e.accepted] += 1
            for i in range(e.proposed):
                self.position_tried[i] += 1
                self.position_accepted[i] += i < e.accepted
            self.accepted_series.append(e.accepted)
        self.session_steps.add(e)
        self.window_steps.add(e)
        self._window.append(e)
        self._expire_window()
        if not self.per_request:
            self._plot_rates(self.window_steps)

    def _plot_rates(self, times: StepTimes) -> None:
        self.tps_series.append((self.busy_s, times.spec_tps or 0.0, times.shadow_tps or 0.0))

    def _on_token(self, e: Token) -> None:
        self.prefill = None  # a source without Prefill events: the first token ends it
        self.session_tokens += 1
        self._token_times.append(e.t_ns)
        if e.prompt_index == self.prompt_index:
            diverged = e.position in self._diverged_positions
            self.stream.append(StreamToken(e.position, e.text, e.source, diverged))

    def _on_divergence(self, e: Divergence) -> None:
        self.divergences.append(e)
        self.divergence_count += 1
        if self.first_divergence is None:
            self.first_divergence = e
        self.requests[e.prompt_index] = "diverged"
        if e.prompt_index != self.prompt_index:
            return
        self._diverged_positions.add(e.position)
        for token in reversed(self.stream):
            if token.position == e.position:
                token.diverged = True
                break

    def _on_prompt_done(self, e: PromptDone) -> None:
        self.prompts_done += 1
        self.exact_prompts += e.exact
        verdict: Verdict = "unchecked" if not self.shadow else "exact" if e.exact else "diverged"
        self.requests[e.prompt_index] = verdict
        shadow_s = e.shadow_seconds if self.shadow else 0.0
        self.last_request = StepTimes(e.new_tokens, e.seconds, shadow_s)
        self.session_requests.tokens += e.new_tokens
        self.session_requests.spec_s += e.seconds
        self.session_requests.shadow_s += shadow_s
        if self.per_request:
            self._plot_rates(self.last_request)

    def _on_telemetry(self, e: TelemetrySample) -> None:
        self.telemetry = e
        value = e.dram_gbps if e.source == "gpm" else e.mem_busy_pct
        if value is not None and self.clock.running:
            self.bandwidth_series.append((self.busy_s, value))

    def _on_control(self, e: ControlChange) -> None:
        if e.name == "k":
            self.k = int(e.new)
        elif e.name == "verify_mode":
            self.verify_mode = e.new
        elif e.name == "gemm_backend":
            self.gemm_backend, self.gemm_kernel = e.new, None  # the kernel was the old one's
        elif e.name == "speculation":
            self.speculation = e.new.lower() in ("true", "on", "1")
        elif e.name == "paused":
            self.paused = e.new.lower() in ("true", "on", "1")

    def _on_error(self, e: EngineError) -> None:
        self.errors.append(e)

    def _on_summary(self, e: Summary) -> None:
        self.summary = e
        self.finished = True

    def _expire_window(self) -> None:
        horizon = self.now_ns - WINDOW_NS
        while self._window and self._window[0].t_ns <= horizon:
            self.window_steps.add(self._window.popleft(), sign=-1)
        if not self._window:
            self.window_steps = StepTimes()  # drop float residue of add/subtract
        while self._token_times and self._token_times[0] <= horizon:
            self._token_times.popleft()
