"""Recording a session's event stream to traces, with no UI: the dashboard and headless share it.

`TraceRecorder.consume(event)` sees every event in stream order. It keeps the session's bounded
memory (`EventLog`) and, while a trace is recording, appends to it. A recording starts either
with the session (`--trace`: the writer is passed in before the header) or mid-session
(`export`, the dashboard's `e`): the events held so far are written first, once the
`SessionStart` header is known, then every new one. It closes itself when the session
finishes or a fatal engine error ends it, and stops when the disk fails; nothing raises into
the session. What happened is kept for the caller to show:

    note     one line on the recording (the status bar's text)
    brief    the same in a few words: the trace's file name and its state (what the status
             bar shows where the note does not fit)
    stopped  "recording stopped: <why>; <path> holds the session up to then" (or, when it was
             to replace an old trace: the old one kept, and where the partial one is), else
             None
    failure  the same line when an I/O error stopped it (disk full): `exit_code` 4 (README)

Methods that have something to tell a person return a `Notice`; the caller decides how to
show it (a dashboard notification, a line on stderr).
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdash.errors import EXIT_ENVIRONMENT, EXIT_OK, SpecdashError
from specdash.events import ControlChange, EngineError, Event, SessionStart, Summary
from specdash.output_files import Output
from specdash.trace.event_log import EventLog
from specdash.trace.jsonl import TraceWriter

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Notice:
    """Something a person should be told, and how loudly."""

    text: str
    severity: Severity = "information"


def _name(writer: TraceWriter) -> str:
    return "the trace" if writer.path is None else writer.path.name


class TraceRecorder:
    """The record/export/backlog/close state machine of one session's traces.

    `writer`: a trace recording from the session's start (its header not yet seen), or None.
    Thread-safe: headless sinks it from the engine and the GPU sampler threads.
    """

    def __init__(self, writer: TraceWriter | None = None, log: EventLog | None = None) -> None:
        self._lock = threading.RLock()
        self.log = log if log is not None else EventLog()
        """What a trace started mid-session is built from (bounded; says what it dropped)."""
        self.writer: TraceWriter | None = None
        self.note = ""
        self.brief = ""
        self.path: Path | None = None
        """The file of the latest recording, open or closed (the status bar names it)."""
        self.stopped: str | None = None
        self.failure: str | None = None
        self.finished_trace: Path | None = None
        """A closed trace that holds the whole session: a later export copies it."""
        self._has_header = False
        self._complete = False
        if writer is not None:
            self.attach(writer)

    @property
    def exit_code(self) -> int:
        """What the recording adds to the exit code: 4 (environment) when an I/O error cut a
        trace short, else 0."""
        return EXIT_ENVIRONMENT if self.failure else EXIT_OK

    # -- the stream --------------------------------------------------------------------

    def consume(self, event: Event) -> Notice | None:
        """Hold `event`, append it to the recording if there is one; the trace closes when the
        session ends. Returns a notice when the recording just stopped on an error."""
        with self._lock:
            self.log.append(event)
            writer = self.writer
            if writer is None:
                return None
            if self._has_header:
                writer(event)
            elif isinstance(event, SessionStart):
                self._write_backlog()
            if writer.stopped_reason:
                self.close(f"recording stopped ({writer.stopped_reason})")
                return Notice(f"recording stopped: {writer.stopped_reason}", "error")
            if isinstance(event, EngineError) and event.fatal:
                self.close("an engine error")
            elif isinstance(event, Summary):
                self.close("the session finished")
            return None

    __call__ = consume

    # -- starting and ending a recording ------------------------------------------------

    def attach(self, writer: TraceWriter) -> None:
        """Record from now on; everything held so far is written once the header is known."""
        with self._lock:
            self.writer = writer
            self.note = f"recording {writer.path}"
            self.brief = f"recording {_name(writer)}"
            self.path = writer.path
            self._has_header = False
            if self.log.header is not None:
                self._write_backlog()

    def export(self, directory: Path, applied_step: int) -> tuple[Notice, ControlChange | None]:
        """Record the session to a new trace in `directory`: the events held so far, then
        every new one. While a trace is recording, that file is the export; once a complete
        recording has closed, the export is a copy of it. Returns what to tell the user and,
        when a recording started, the `ControlChange` that announces it (the caller sends it
        down the stream, so the trace and every view see it)."""
        with self._lock:
            if self.writer is not None:
                return Notice(f"already recording to {self.writer.path}"), None
            path = directory / time.strftime("specdash-%Y%m%d-%H%M%S.jsonl")
            if self.finished_trace is not None:
                return self._copy_finished_trace(path), None
            try:
                writer = TraceWriter(path)
            except SpecdashError as e:  # unwritable, or already there: nothing is lost
                return Notice(f"cannot export trace: {e}", "error"), None
            self.attach(writer)
            announce = ControlChange(
                name="trace", old="off", new=str(path), applied_step=applied_step
            )
            if gap := self.log.gap_note():
                return Notice(f"trace: {path} (recording continues); {gap}", "warning"), announce
            return Notice(f"trace: {path} (recording continues)"), announce

    def close(self, why: str) -> None:
        """Flush and close the recording, if any; the note says what the file holds."""
        with self._lock:
            writer = self.writer
            if writer is None:
                return
            writer.close()
            if writer.stopped_reason:  # a write failed, or closing (the last flush) did
                self._note_stop(writer)
            elif writer.partial is not None:  # cut short (Ctrl-C, quit) while replacing a trace
                self.stopped = f"recording cut short ({why}); {writer.outcome()}"
            if writer.partial is not None:
                self.note = f"trace closed after {why}: {writer.outcome()}"
                self.brief = f"{_name(writer)} kept as it was"
                self.writer = None
                return
            if writer.whole and self._complete and self._has_header:
                self.finished_trace = writer.path
            self.note = f"trace closed after {why}: {self._held(writer)}"
            complete = writer.whole and self._complete
            stopped = "stopped" if writer.stopped_reason else "closed"
            self.brief = f"{_name(writer)} {stopped}{'' if complete else ', incomplete'}"
            self.writer = None

    def _held(self, writer: TraceWriter) -> str:
        """What a closed recording holds, in words: a file with no lines is not readable, and
        only one that recorded the session's end holds all of it."""
        if writer.lines_written == 0:
            return f"nothing was recorded, {writer.path} is empty"
        if not self._complete:
            held = "incomplete: events from before it started were no longer in memory"
        elif not writer.whole:
            held = "incomplete: the session up to then"
        else:
            held = "complete: the whole session"
        return f"{writer.path} ({writer.lines_written} lines, {held}, readable)"

    # -- internals ---------------------------------------------------------------------

    def _write_backlog(self) -> None:
        writer = self.writer
        assert writer is not None
        for event in self.log.export():
            writer(event)
        self._has_header = True
        self._complete = self.log.complete
        if not self._complete:
            self.note += f" (incomplete: {self.log.gap_note()})"
            self.brief += " (incomplete)"

    def _note_stop(self, writer: TraceWriter) -> None:
        self.stopped = f"recording stopped: {writer.stopped_reason}; {writer.outcome()}"
        if writer.io_error is not None:
            self.failure = self.stopped

    def _copy_finished_trace(self, path: Path) -> Notice:
        source = self.finished_trace
        assert source is not None
        try:
            output = Output(path, what="trace", inputs=[(source, "the recording")])
            with open(source, "rb") as src, output.replace("wb") as dst:
                shutil.copyfileobj(src, dst)
        except SpecdashError as e:
            return Notice(f"cannot export trace: {e}", "error")
        except OSError as e:  # reading the recording
            return Notice(f"cannot export trace: {e.strerror or e}", "error")
        return Notice(f"trace: {path} (a copy of the complete recording {source})")
