"""Stand-ins for `run_engine` that the dashboard's engine process runs (`LiveSession(run=...)`):
module-level, so a spawned child imports them by name. Each has `run_engine`'s signature."""

from __future__ import annotations

import os
import signal
import threading

from fake_events import fake_session

from specdash.controls import Controls
from specdash.events import EngineError, Sink
from specdash.settings import SessionSettings


def raise_runtime_error(settings, sink, controls, stop, options):
    raise RuntimeError("weights on fire")


def exit_3(settings, sink, controls, stop, options):
    raise SystemExit(3)


def five_events_then_return(settings, sink, controls, stop, options):
    """Ends without a summary or an error."""
    for event in fake_session()[:5]:
        sink(event)


def fake_session_then_wait(settings, sink, controls, stop, options):
    """The whole fake session (fixed times), then waits for the stop."""
    for event in fake_session():
        sink(event)
    stop.wait(30)


def wait_for_stop(settings, sink, controls, stop, options):
    sink(EngineError(message="waiting", fatal=False))
    stop.wait(30)


def report_arguments(
    settings: SessionSettings, sink: Sink, controls: Controls, stop: threading.Event, options
) -> None:
    """What the child was given, as a non-fatal error's message."""
    state = controls.snapshot()
    sink(EngineError(message=repr((settings.engine, options, state)), fatal=False))


def killed_mid_session(settings, sink, controls, stop, options):
    """Some of a session, a line of output, then SIGKILL: a crash no exception reports."""
    for event in fake_session()[:40]:
        sink(event)
    print("engine: about to be killed", flush=True)
    threading.Event().wait(0.3)  # the events reach the parent first
    os.kill(os.getpid(), signal.SIGKILL)
