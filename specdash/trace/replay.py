"""A recorded session played back as an event source: play, pause, step and seek.

`TraceReplay` is a cursor over a trace with a virtual clock in trace time, so the dashboard
shows the session at its recorded pace (or `speed` times it). It is read-only
(`controls is None`). Its owner calls `tick()` on a timer; every due event goes to the sink,
exactly as a live engine would have sent it, at most `max_per_tick` a tick: where more are
due (a dense trace at a high speed) the clock waits for them, so playback slows to what the
consumer takes instead of flooding it. A seek returns the whole history up to the new
position, because the dashboard's windows and totals can only be rebuilt from the start.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from specdash.errors import UsageError
from specdash.events import Event, PromptStart, SessionStart, Sink, VerifyStep

if TYPE_CHECKING:
    from specdash.controls import Controls


class TraceReplay:
    """Event source over a recorded session. `clock` returns seconds (tests pass a fake)."""

    controls: Controls | None = None  # a recording takes no controls

    def __init__(
        self,
        header: SessionStart,
        events: list[Event],
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_per_tick: int | None = None,
    ) -> None:
        if not speed > 0:
            raise UsageError(f"replay speed must be above 0, got {speed}")
        self.events: list[Event] = [header, *events]
        self._offsets = [max(0.0, (e.t_ns - header.t_ns) / 1e9) for e in self.events]
        for i in range(1, len(self._offsets)):  # threads emit slightly out of order
            self._offsets[i] = max(self._offsets[i], self._offsets[i - 1])
        self.duration_s = self._offsets[-1]
        self.speed = speed
        self._clock = clock
        self.max_per_tick = max_per_tick
        """The most events one `tick` sends (None: every due one)."""
        self._sink: Sink | None = None
        self.cursor = 0
        """Index of the next event to emit; everything before it has been sent."""
        self._position_s = 0.0
        self._playing_since: float | None = None

    # -- EventSource -------------------------------------------------------------------

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self.play()
        self.tick()

    def stop(self) -> None:
        self.pause()
        self._sink = None

    # -- playback ----------------------------------------------------------------------

    @property
    def playing(self) -> bool:
        return self._playing_since is not None

    @property
    def finished(self) -> bool:
        return self.cursor == len(self.events)

    @property
    def position_s(self) -> float:
        """Trace time shown so far, in seconds since the session header."""
        if self._playing_since is None:
            return self._position_s
        elapsed = (self._clock() - self._playing_since) * self.speed
        return min(self.duration_s, self._position_s + elapsed)

    def play(self) -> None:
        if not self.playing and not self.finished:
            self._playing_since = self._clock()

    def pause(self) -> None:
        self._position_s = self.position_s
        self._playing_since = None

    def toggle(self) -> None:
        (self.pause if self.playing else self.play)()

    def set_speed(self, speed: float) -> None:
        if not speed > 0:
            raise UsageError(f"replay speed must be above 0, got {speed}")
        self._position_s, self.speed = self.position_s, speed
        if self.playing:
            self._playing_since = self._clock()

    def tick(self) -> int:
        """Send every event due at the current position; returns how many were sent."""
        if self._sink is None:
            return 0
        end = bisect.bisect_right(self._offsets, self.position_s)
        if self.max_per_tick is not None and end - self.cursor > self.max_per_tick:
            end = self.cursor + self.max_per_tick
            self._position_s = self._offsets[end - 1]  # the clock waits for the rest
            if self.playing:
                self._playing_since = self._clock()
        sent = self._emit(end)
        if self.finished:
            self.pause()
        return sent

    def step(self) -> int:
        """Pause and send events up to and including the next verify step."""
        self.pause()
        end = next(
            (i + 1 for i in range(self.cursor, len(self.events))
             if isinstance(self.events[i], VerifyStep)),
            len(self.events),
        )  # fmt: skip
        self._position_s = self._offsets[end - 1]
        return self._emit(end)

    def seek(self, t_s: float) -> list[Event]:
        """Move to trace time `t_s`; returns every event up to it (header first) for the
        consumer to rebuild its view from. Those events are not also sent to the sink."""
        self._position_s = min(max(0.0, t_s), self.duration_s)
        if self.playing:
            self._playing_since = self._clock()
        self.cursor = bisect.bisect_right(self._offsets, self._position_s)
        return self.events[: self.cursor]

    def step_back(self) -> list[Event]:
        """Pause and seek to just after the verify step before the last one shown."""
        self.pause()
        shown = [i for i in range(self.cursor) if isinstance(self.events[i], VerifyStep)]
        target = self._offsets[shown[-2]] if len(shown) >= 2 else 0.0
        return self.seek(target)

    def next_prompt_s(self) -> float:
        """Trace time where the next prompt starts (the end if there is none)."""
        return next(
            (self._offsets[i] for i in range(self.cursor, len(self.events))
             if isinstance(self.events[i], PromptStart)),
            self.duration_s,
        )  # fmt: skip

    def _emit(self, end: int) -> int:
        start, self.cursor = self.cursor, max(self.cursor, end)
        if self._sink is not None:
            for event in self.events[start : self.cursor]:
                self._sink(event)
        return self.cursor - start
