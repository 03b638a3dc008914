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

`LiveSession` runs the session (`specdash.runs.runner.run_engine`, whichever engine)
on a worker thread next to the GPU sampler. The engine never waits on the UI: its sink is
`EventBuffer.put`, a short locked append that the dashboard drains on a timer.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from specdash.controls import Controls
from specdash.errors import SpecdashError
from specdash.events import EngineError, Event, Sink
from specdash.runs.nvml_sampler import GpuSampler, device_index
from specdash.runs.runner import fatal_watch, loading_label
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
    """A live session: the engine on a worker thread, the GPU sampler on another.

    An engine exception becomes an `EngineError` event (the dashboard shows it; the session
    is over) instead of a traceback on a thread nobody watches; `describe` words a known error
    (the command line names the flag of the setting it is about). An engine failure that
    happens outside the worker thread (an engine's child process dying) reaches it through the
    engine's `specdash.runs.runner.FatalWatch`, armed here on the main thread while the session
    runs.

    The engine runs with the options headless gets (`engine_options`: SGLang's flags).
    """

    def __init__(
        self,
        settings: SessionSettings,
        telemetry: bool = True,
        engine_options: EngineOptions | None = None,
        describe: Callable[[SpecdashError], str] = str,
    ) -> None:
        self.settings = settings
        self.engine_options = engine_options
        # the dashboard's session stays open after its prompts, for typed ones, until `q`
        self.controls: Controls | None = Controls.from_settings(settings, stay_open=True)
        self.loading = loading_label(settings)
        """What the session loads, for the dashboard's loading line."""
        self._describe = describe
        self._telemetry = telemetry
        self._stop = threading.Event()
        self._engine: threading.Thread | None = None
        self._sampler: GpuSampler | None = None
        self._fatal = fatal_watch(settings)

    def start(self, sink: Sink) -> None:
        self._engine = threading.Thread(
            target=self._run_engine, args=(sink,), name="specdash-engine", daemon=True
        )
        self._fatal.arm(self._engine)
        self._engine.start()
        if self._telemetry:
            self._sampler = GpuSampler(sink, index=device_index(self.settings.device) or 0)
            self._sampler.start()

    def _run_engine(self, sink: Sink) -> None:
        from specdash.runs.runner import run_engine

        try:
            run_engine(self.settings, sink, self.controls, self._stop, self.engine_options)
        except BaseException as e:  # the dashboard is this thread's only reporter, and a
            # SystemExit would otherwise end the thread without a word (threading ignores it)
            sink(self._engine_error(e))

    def _engine_error(self, e: BaseException) -> EngineError:
        failure = self._fatal.failure  # it arrived in this thread without its message
        if failure is not None:
            return EngineError(
                message=f"{type(failure).__name__}: {failure}", exit_code=failure.exit_code
            )
        if isinstance(e, SpecdashError):
            return EngineError(message=self._describe(e), exit_code=e.exit_code)
        return EngineError(message=f"{type(e).__name__}: {e}")

    @property
    def running(self) -> bool:
        return self._engine is not None and self._engine.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._fatal.disarm()
        if self._sampler is not None:
            self._sampler.stop()
        if self._engine is not None and self._engine is not threading.current_thread():
            self._engine.join(timeout=5)
