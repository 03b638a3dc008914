"""The dashboard's bounded memory of a session, for exporting a trace mid-session.

A dashboard can stay open for hours, so it cannot keep every event. It keeps the
`SessionStart` header, the most recent `WINDOW_EVENTS` events in full, and of the older ones
only the landmarks (prompt starts and ends, divergences, control changes, errors, the
summary), up to `MAX_LANDMARKS`. What it no longer holds is counted by kind, and an export
built from it says so in its header (`config["export_gap"]`), so a partial trace never passes
for a complete one. A session recorded from its header on (`--trace`, or `e` early enough)
does not need this: its trace file is the complete session.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from specdash.events import Event, SessionStart

WINDOW_EVENTS = 50_000
"""Recent events kept in full: about 60 MB of pydantic events (a token is ~1.2 kB), minutes
of decoding on a GPU, tens of minutes for the tiny CPU model."""
MAX_LANDMARKS = 20_000
LANDMARK_KINDS = frozenset(
    {"prompt_start", "prompt_done", "divergence", "control", "error", "summary"}
)
"""Rare events that say what happened when: kept after their neighbours are dropped."""


class EventLog:
    """`append` every event in stream order; `export` yields what a trace can hold."""

    def __init__(self, window: int = WINDOW_EVENTS, max_landmarks: int = MAX_LANDMARKS) -> None:
        self.header: SessionStart | None = None
        self._recent: deque[Event] = deque()
        self._landmarks: deque[Event] = deque()
        self._window = window
        self._max_landmarks = max_landmarks
        self.dropped: Counter[str] = Counter()
        """Events no longer held, by kind."""
        self.dropped_until_ns: int | None = None
        """Event time of the newest dropped event: the export is complete after it."""

    def append(self, event: Event) -> None:
        if isinstance(event, SessionStart):
            self.header = event
            return
        self._recent.append(event)
        if len(self._recent) > self._window:
            old = self._recent.popleft()
            if old.kind in LANDMARK_KINDS:
                self._landmarks.append(old)
                if len(self._landmarks) > self._max_landmarks:
                    self._drop(self._landmarks.popleft())
            else:
                self._drop(old)

    def _drop(self, event: Event) -> None:
        self.dropped[event.kind] += 1
        self.dropped_until_ns = max(self.dropped_until_ns or event.t_ns, event.t_ns)

    def __len__(self) -> int:
        """Events held (header included)."""
        return (self.header is not None) + len(self._landmarks) + len(self._recent)

    @property
    def complete(self) -> bool:
        return not self.dropped

    def gap_note(self) -> str:
        """One line on what an export from this log lacks; empty when it lacks nothing."""
        if self.complete:
            return ""
        total = sum(self.dropped.values())
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.dropped.most_common())
        since = self._seconds(self.dropped_until_ns)
        return (
            f"{total} events before {since:.1f} s were no longer in memory ({kinds}); "
            "landmarks (prompts, divergences, controls, errors) are kept"
        )

    def _seconds(self, t_ns: int | None) -> float:
        if t_ns is None or self.header is None:
            return 0.0
        return (t_ns - self.header.t_ns) / 1e9

    def export(self) -> Iterator[Event]:
        """The header (with `export_gap` when events were dropped), then every held event in
        stream order. Nothing without a header: a trace starts with one."""
        if self.header is None:
            return
        header = self.header
        if not self.complete:
            gap = {
                "dropped_events": dict(self.dropped),
                "complete_after_t_ns": self.dropped_until_ns,
                "note": self.gap_note(),
            }
            header = header.model_copy(update={"config": header.config | {"export_gap": gap}})
        yield header
        yield from self._landmarks
        yield from self._recent
