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

`LiveSession` runs the session's runner (`specdash.runs.runner.run_engine`: native or SGLang)
on a worker thread next to the GPU sampler. The engine never waits on the UI: its sink is
`EventBuffer.put`, a short locked append that the dashboard drains on a timer.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections import deque
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from specdash.controls import Controls
from specdash.errors import EXIT_ENVIRONMENT, SpecdashError
from specdash.events import EngineError, Event, Sink
from specdash.runs.nvml_sampler import GpuSampler, device_index
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from specdash.runs.sglang import SGLangOptions


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
    is over) instead of a traceback on a thread nobody watches.

    `--engine sglang` runs with the options headless gets (`sglang_options`) and the same
    scheduler-failure handling. Headless, `sglang.Engine` installs
    `specdash.runs.sglang.scheduler_failed` for SIGQUIT (a dying scheduler sends it to its parent),
    which raises `SchedulerFailed` in the session's thread. SGLang only installs it from the
    main thread, and here the engine runs on a worker; unhandled, SIGQUIT would kill the
    dashboard with a core dump and leave the terminal in raw mode. So `start` (called on the
    main thread) installs it, and the `SchedulerFailed` it raises is passed on to the engine
    thread, which unwinds (shutting the engines down) and reports it like any engine error.
    """

    def __init__(
        self,
        settings: SessionSettings,
        telemetry: bool = True,
        sglang_options: SGLangOptions | None = None,
    ) -> None:
        self.settings = settings
        self.sglang_options = sglang_options
        # the dashboard's session stays open after its prompts, for typed ones, until `q`
        self.controls: Controls | None = Controls.from_settings(settings, stay_open=True)
        self._telemetry = telemetry
        self._stop = threading.Event()
        self._engine: threading.Thread | None = None
        self._sampler: GpuSampler | None = None
        self._scheduler_failure: Exception | None = None
        self._previous_sigquit: object = None

    def start(self, sink: Sink) -> None:
        self._engine = threading.Thread(
            target=self._run_engine, args=(sink,), name="specdash-engine", daemon=True
        )
        if self.settings.engine == "sglang":
            self._previous_sigquit = signal.signal(signal.SIGQUIT, self._on_sigquit)
        self._engine.start()
        if self._telemetry:
            self._sampler = GpuSampler(sink, index=device_index(self.settings.device) or 0)
            self._sampler.start()

    def _run_engine(self, sink: Sink) -> None:
        from specdash.runs.runner import run_engine

        try:
            run_engine(self.settings, sink, self.controls, self._stop, self.sglang_options)
        except BaseException as e:  # the dashboard is this thread's only reporter, and a
            # SystemExit would otherwise end the thread without a word (threading ignores it)
            # a scheduler failure is relayed from the main thread without its message
            e = self._scheduler_failure or e
            known = isinstance(e, SpecdashError) and e is not self._scheduler_failure
            code = e.exit_code if known else EXIT_ENVIRONMENT if self._scheduler_failure else None
            sink(
                EngineError(message=str(e) if known else f"{type(e).__name__}: {e}", exit_code=code)
            )

    def _on_sigquit(self, signum: int, frame: FrameType | None) -> None:
        """SIGQUIT on the main thread: SGLang's handler, its exception raised in the engine."""
        from specdash.runs.sglang import SchedulerFailed, scheduler_failed

        try:
            scheduler_failed(signum, frame)
        except SchedulerFailed as e:
            self._scheduler_failure = e
            if self.running:
                raise_in_thread(self._engine, SchedulerFailed)  # type: ignore[arg-type]

    @property
    def running(self) -> bool:
        return self._engine is not None and self._engine.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._previous_sigquit is not None:
            signal.signal(signal.SIGQUIT, self._previous_sigquit)  # type: ignore[arg-type]
            self._previous_sigquit = None
        if self._sampler is not None:
            self._sampler.stop()
        if self._engine is not None and self._engine is not threading.current_thread():
            self._engine.join(timeout=5)


def raise_in_thread(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` in `thread` at its next Python instruction (CPython's async exception:
    a thread blocked in C sees it once the call returns; SGLang's request wait wakes every
    few seconds)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
    )
