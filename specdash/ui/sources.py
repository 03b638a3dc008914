"""Where the dashboard's events come from, and the buffer they cross threads through.

An event source is any object with this tiny protocol (`EventSource`):

    controls: Controls | None
        Live settings the dashboard keys write and the engine reads between steps.
        None means read-only (a trace replay): control keys say so instead of acting.
    start(sink) -> None
        Begin producing. `sink(event)` is thread-safe and never blocks; call it from any
        thread, or synchronously inside `start` (a replay or a test may push everything at once).
    stop() -> None
        Finish promptly and release threads; idempotent.

`LiveSession` runs the session (`specdash.runs.runner.run_engine`, whichever engine) in a
process of its own (`specdash.runs.engine_process`: the UI's Python never holds the engine's
GIL), the GPU sampler on a thread here. The engine never waits on the UI: its events arrive in
batches on a pump thread whose sink is `EventBuffer.put`, a short locked append that the
dashboard drains on a timer.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from specdash.controls import Controls
from specdash.errors import SpecdashError
from specdash.events import Event, Sink
from specdash.runs.engine_process import EngineProcess, Run
from specdash.runs.nvml_sampler import GpuSampler, device_index
from specdash.runs.runner import loading_label, run_engine
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from specdash.runs.runner import EngineOptions


class EventSource(Protocol):
    controls: Controls | None

    def start(self, sink: Sink) -> None: ...

    def stop(self) -> None: ...


class EventBuffer:
    """Bounded, thread-safe hand-off from producer threads to the UI timer.

    When the UI falls `capacity` events behind, the oldest are dropped and counted rather
    than blocking the engine.
    """

    def __init__(self, capacity: int = 65536) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.dropped = 0

    @property
    def capacity(self) -> int:
        return self._events.maxlen or 0

    def put(self, event: Event) -> None:
        with self._lock:
            if len(self._events) == self._events.maxlen:
                self.dropped += 1
            self._events.append(event)

    def drain(self) -> list[Event]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events


class LiveSession:
    """A live session: the engine in a child process (`EngineProcess`), the GPU sampler on a
    thread of this one.

    An engine exception becomes an `EngineError` event (the dashboard shows it; the session
    is over) instead of a traceback nobody sees; `describe` words a known error (the command
    line names the flag of the setting it is about). The engine process dying before its
    session ended is one too. The engine runs with the options headless gets
    (`engine_options`: SGLang's flags); `run` is what the child runs (tests: a stand-in,
    importable by name).
    """

    def __init__(
        self,
        settings: SessionSettings,
        telemetry: bool = True,
        engine_options: EngineOptions | None = None,
        describe: Callable[[SpecdashError], str] = str,
        run: Run = run_engine,
    ) -> None:
        self.settings = settings
        self.engine_options = engine_options
        self.loading = loading_label(settings)
        """What the session loads, for the dashboard's loading line."""
        self._telemetry = telemetry
        self._engine = EngineProcess(settings, engine_options, describe, run)
        # the dashboard's session stays open after its prompts, for typed ones, until `q`
        self.controls: Controls | None = self._engine.controls
        self._sampler: GpuSampler | None = None

    def start(self, sink: Sink) -> None:
        self._engine.start(sink)
        if self._telemetry:
            self._sampler = GpuSampler(sink, index=device_index(self.settings.device) or 0)
            self._sampler.start()

    @property
    def running(self) -> bool:
        return self._engine.running

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self._engine.stop()
