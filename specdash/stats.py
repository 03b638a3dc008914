"""Session totals from the event stream: the headless summary and the dashboard's session column."""

from __future__ import annotations

from specdash import metrics
from specdash.events import Divergence, Event, PromptDone, SessionStart, Summary, VerifyStep


class SessionStats:
    def __init__(self) -> None:
        self.prompts = self.exact_prompts = self.new_tokens = 0
        self.same_text_prompts: int | None = None
        self.seconds = 0.0
        self.verify_steps = self.accepted = self.proposed = self.emitted = 0
        self.divergences = self.unreproduced_root_causes = 0
        self.checked = True  # a shadow decode compares the output (not --no-shadow)

    def consume(self, event: Event) -> None:
        if isinstance(event, VerifyStep) and not event.plain:
            self.verify_steps += 1
            self.accepted += event.accepted
            self.proposed += event.proposed
            self.emitted += len(event.emitted_tokens)
        elif isinstance(event, SessionStart):
            self.checked = bool(event.config.get("shadow", True))
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

    def summary(self) -> Summary:
        return Summary(
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
            unreproduced_root_causes=self.unreproduced_root_causes,
        )
