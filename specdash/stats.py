"""Session totals from the event stream: the headless summary and the dashboard's session column."""

from __future__ import annotations

from specdash import metrics
from specdash.events import (
    ControlChange,
    Divergence,
    Event,
    Idle,
    PromptDone,
    PromptStart,
    SessionStart,
    Summary,
    VerifyStep,
    now_ns,
)


class BusyClock:
    """The session's wall clock in event time: it runs from the header on and stops while the
    engine is paused or idle (waiting for a typed prompt) and once the session is over, so a
    rate over it does not fall while nothing runs."""

    def __init__(self) -> None:
        self.busy_ns = 0
        self._since: int | None = None
        """Event time the current busy span began; None while stopped."""
        self._started = self._paused = self._idle = False

    def consume(self, event: Event) -> None:
        if isinstance(event, SessionStart):
            self._started = True
        elif isinstance(event, ControlChange) and event.name == "paused":
            self._paused = event.new.lower() in ("true", "on", "1")
        elif isinstance(event, Idle):
            self._idle = True
        elif isinstance(event, PromptStart):
            self._idle = False
        elif isinstance(event, Summary):
            self._idle = True
        else:
            return
        running = self._started and not (self._paused or self._idle)
        if running and self._since is None:
            self._since = event.t_ns
        elif not running and self._since is not None:
            self.busy_ns += max(0, event.t_ns - self._since)
            self._since = None

    @property
    def running(self) -> bool:
        """The engine is at work now: started, and not paused, idle or over."""
        return self._since is not None

    def seconds(self, at_ns: int) -> float:
        """Busy seconds up to event time `at_ns`."""
        running = 0 if self._since is None else max(0, at_ns - self._since)
        return (self.busy_ns + running) / 1e9


class SessionStats:
    def __init__(self) -> None:
        self.prompts = self.exact_prompts = self.new_tokens = 0
        self.same_text_prompts: int | None = None
        self.seconds = 0.0
        self.shadow_seconds = 0.0
        self.verify_steps = self.accepted = self.proposed = self.emitted = 0
        self.divergences = self.unreproduced_root_causes = 0
        self.checked = True  # a shadow decode compares the output (not --no-shadow)
        self.rate_includes_prefill = False
        self.clock = BusyClock()

    def consume(self, event: Event) -> None:
        self.clock.consume(event)
        if isinstance(event, VerifyStep):
            if not event.plain:
                self.verify_steps += 1
                self.accepted += event.accepted
                self.proposed += event.proposed
                self.emitted += len(event.emitted_tokens)
        elif isinstance(event, SessionStart):
            self.checked = event.shadow
            self.rate_includes_prefill = event.rate_includes_prefill
        elif isinstance(event, Divergence):
            self.divergences += 1
            cause = event.root_cause
            self.unreproduced_root_causes += cause is not None and cause.reproduced is False
        elif isinstance(event, PromptDone):
            self.prompts += 1
            self.exact_prompts += event.exact
            if event.same_text is not None:
                self.same_text_prompts = (self.same_text_prompts or 0) + event.same_text
            self.new_tokens += event.new_tokens
            self.seconds += event.seconds
            self.shadow_seconds += event.shadow_seconds

    def summary(self, at_ns: int | None = None) -> Summary:
        """The totals as of event time `at_ns` (default: now), which the summary carries."""
        t_ns = now_ns() if at_ns is None else at_ns
        return Summary(
            t_ns=t_ns,
            prompts=self.prompts,
            exact_prompts=self.exact_prompts if self.checked else None,
            checked=self.checked,
            new_tokens=self.new_tokens,
            seconds=self.seconds,
            tokens_per_s=metrics.tokens_per_s(self.new_tokens, self.seconds) or 0.0,
            mean_accepted_length=metrics.mean_accepted_length(self.emitted, self.verify_steps)
            or 0.0,
            acceptance_rate=metrics.acceptance_rate(self.accepted, self.proposed) or 0.0,
            verify_steps=self.verify_steps,
            divergences=self.divergences,
            same_text_prompts=self.same_text_prompts if self.checked else None,
            shadow_tokens_per_s=metrics.tokens_per_s(self.new_tokens, self.shadow_seconds)
            if self.checked
            else None,
            wall_seconds=self.clock.seconds(t_ns),
            unreproduced_root_causes=self.unreproduced_root_causes,
            rate_includes_prefill=self.rate_includes_prefill,
        )
