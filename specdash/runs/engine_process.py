"""A session in a process of its own: `EngineProcess`, what the dashboard runs its engine in.

Why a process: a UI in the engine's process shares its GIL, and every millisecond the UI runs
Python is one the engine waits (docs/PERF.md, the dashboard's cost). The child runs
`run_engine` on its main thread, as `run --headless` does (so an engine that installs signal
handlers, SGLang's for a scheduler's death, installs them as it does headless), and is started
with `spawn`: the parent has threads (a UI's), which a fork would copy mid-lock.

Two pipes:
  child -> parent  lists of items every `BATCH_S`: the events in the order the session emitted
                   them, and a `ControlState` wherever the session changed its own controls (an
                   "auto" GEMM backend resolved, a refused change undone); None once the session
                   has ended. An end without None is the child's death.
  parent -> child  ("update", changes), ("next_prompt",), ("prompt", text), ("stop",): what
                   the dashboard's keys asked; a closed pipe (the parent is gone) stops too.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdash.controls import Controls, ControlState
from specdash.errors import EXIT_ENVIRONMENT, SpecdashError
from specdash.events import EngineError, Sink
from specdash.runs.runner import pinned_options, run_engine
from specdash.runs.spawn import redirect_output, start_resource_tracker
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from specdash.runs.runner import EngineOptions

BATCH_S = 0.05
"""How often the child sends what the session emitted: one pipe write per 50 ms, not per event."""
STOP_WAIT_S = 10.0
"""How long `stop` waits for the session's last events (the running prompt's end, the summary)."""

Run = Callable[..., Any]
"""`run_engine`'s signature: (settings, sink, controls, stop, options)."""


class LinkedControls(Controls):
    """The parent's `Controls`: each change the dashboard makes also goes to the child's, which
    the session reads; what the session changes itself comes back through `adopt`."""

    def __init__(self, initial: ControlState, send: Callable[[tuple], None]) -> None:
        super().__init__(initial, stay_open=True)
        self._send = send

    def update(self, **changes: Any) -> ControlState:
        state = super().update(**changes)
        self._send(("update", changes))
        return state

    def request_next_prompt(self) -> None:
        self._send(("next_prompt",))

    def submit_prompt(self, text: str) -> None:
        self._send(("prompt", text))

    def adopt(self, state: ControlState) -> None:
        """The session changed its controls to `state` (not sent back)."""
        super().update(**asdict(state))


class _EchoControls(Controls):
    """The child's `Controls`: a change the session makes goes back to the parent, in order
    with its events; a change the parent asked for (`obey`) does not."""

    def __init__(self, initial: ControlState, outbox: _Outbox) -> None:
        super().__init__(initial, stay_open=True)
        self._outbox = outbox

    def update(self, **changes: Any) -> ControlState:
        state = super().update(**changes)
        self._outbox.put(state)
        return state

    def obey(self, command: tuple) -> None:
        match command:
            case ("update", changes):
                super().update(**changes)
            case ("next_prompt",):
                super().request_next_prompt()
            case ("prompt", text):
                super().submit_prompt(text)


class _Outbox:
    """The child's side of the events pipe: `put` appends (the engine never waits on a pipe),
    a thread sends what gathered every `BATCH_S`, `close` sends the rest and the end."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._items: list[Any] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specdash-outbox", daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: the session stops anyway
            while not self._closed.wait(BATCH_S):
                self._send()

    def _send(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items:
            self._conn.send(items)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        with contextlib.suppress(OSError):
            self._send()
            self._conn.send(None)
        self._conn.close()


def engine_error(e: BaseException, describe: Callable[[SpecdashError], str]) -> EngineError:
    """The `EngineError` a session's exception ends it with (`describe` words a known one)."""
    if isinstance(e, SpecdashError):
        return EngineError(message=describe(e), exit_code=e.exit_code)
    return EngineError(message=f"{type(e).__name__}: {e}")


def _obey(conn: Connection, controls: _EchoControls, stop: threading.Event) -> None:
    """The child's command thread: the parent's requests until it says stop or is gone."""
    try:
        while (command := conn.recv()) != ("stop",):
            controls.obey(command)
    except (EOFError, OSError):
        pass
    stop.set()


def _child_main(
    settings: SessionSettings,
    options: EngineOptions | None,
    describe: Callable[[SpecdashError], str],
    run: Run,
    events: Connection,
    commands: Connection,
    output: str,
) -> None:
    """The child: the session on this main thread, its output to `output` (the parent's
    terminal belongs to the dashboard), Ctrl-C left to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    redirect_output(output)
    outbox = _Outbox(events)
    controls = _EchoControls(Controls.from_settings(settings).snapshot(), outbox)
    stop = threading.Event()
    threading.Thread(target=_obey, args=(commands, controls, stop), daemon=True).start()
    try:
        run(settings, outbox.put, controls, stop, options)
    except BaseException as e:  # the parent shows it; a traceback would go to a file nobody reads
        outbox.put(engine_error(e, describe))
    finally:
        outbox.close()


class EngineProcess:
    """A session (`run`, default `run_engine`) in a spawned child process. `start(sink)` sends
    its events to `sink` from a pump thread; `controls` reach it between steps; `stop` ends it
    and returns once its last events are in `sink`. A child that dies without ending its
    session becomes a fatal `EngineError` (exit code 4) with its last line of output."""

    def __init__(
        self,
        settings: SessionSettings,
        options: EngineOptions | None = None,
        describe: Callable[[SpecdashError], str] = str,
        run: Run = run_engine,
    ) -> None:
        self.settings = settings
        self.options = pinned_options(settings, options)
        self._describe = describe
        self._run = run
        self.controls = LinkedControls(Controls.from_settings(settings).snapshot(), self._send)
        self._commands: Connection | None = None
        self._process: Any = None
        self._pump: threading.Thread | None = None
        self._ended = False
        self.output = ""
        """The child's stdout and stderr (a temp file): removed after a session that ended,
        named when it died."""

    def start(self, sink: Sink) -> None:
        fd, self.output = tempfile.mkstemp(prefix="specdash-engine-", suffix=".log")
        os.close(fd)
        start_resource_tracker()
        ctx = mp.get_context("spawn")
        events_in, events_out = ctx.Pipe(duplex=False)
        commands_in, commands_out = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_child_main,
            args=(self.settings, self.options, self._describe, self._run, events_out,
                  commands_in, self.output),
            name="specdash-engine",
        )  # fmt: skip
        self._process.start()  # not a daemon: a daemon may not start processes (SGLang's)
        events_out.close()
        commands_in.close()
        self._commands = commands_out
        self._pump = threading.Thread(
            target=self._pump_events, args=(events_in, sink), name="specdash-pump", daemon=True
        )
        self._pump.start()

    def _send(self, command: tuple) -> None:
        if self._commands is not None:
            with contextlib.suppress(OSError):  # the child is gone: its death is reported
                self._commands.send(command)

    def _pump_events(self, conn: Connection, sink: Sink) -> None:
        try:
            while (items := conn.recv()) is not None:
                for item in items:
                    if isinstance(item, ControlState):
                        self.controls.adopt(item)
                    else:
                        sink(item)
            self._ended = True
        except (EOFError, OSError):
            sink(self._death())
        finally:
            conn.close()

    def _death(self) -> EngineError:
        self._process.join(5)
        code = self._process.exitcode
        if code is None:
            how = "stopped sending"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        message = f"the engine process {how} before the session ended"
        last = _last_line(self.output)
        if last:
            message += f": {last}"
        message += f" (its output: {self.output})"
        return EngineError(message=message, exit_code=EXIT_ENVIRONMENT, engine_lost=True)

    @property
    def running(self) -> bool:
        return self._pump is not None and self._pump.is_alive()

    def stop(self) -> None:
        """Stop the session at its next step and wait for its last events; a child that does
        not end in time is killed."""
        self._send(("stop",))
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(STOP_WAIT_S)
        if self._process is not None:
            self._process.join(STOP_WAIT_S if self._ended else 1)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        if self._commands is not None:
            self._commands.close()
            self._commands = None
        if self._ended:
            with contextlib.suppress(OSError):
                os.unlink(self.output)


def _last_line(path: str) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""
