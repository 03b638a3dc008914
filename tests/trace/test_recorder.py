"""The trace recorder without a UI: recording from the header or from mid-session (backlog),
closing at the session's end, an unwritable export directory, a full disk."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

from synthetic_trace import FullDisk, Plan, session

from specdash.cli import main
from specdash.errors import EXIT_ENVIRONMENT
from specdash.events import EngineError, Summary, TelemetrySample
from specdash.trace.event_log import EventLog
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.trace.recorder import TraceRecorder


def _events() -> list:
    events = session(Plan(prompts=3))
    assert isinstance(events[-1], Summary)
    return events


def _stripped(header):
    return header.model_copy(update={"git_revision": "0123456789ab"})


def test_recording_from_the_header_holds_the_session_and_closes_at_the_summary(tmp_path):
    events = _events()
    early = TelemetrySample(t_ns=1, window_s=0.0, source="none", note="no NVIDIA GPU")
    path = tmp_path / "run.jsonl"
    recorder = TraceRecorder(TraceWriter(path))
    assert recorder.note == f"recording {path}"
    for event in [early, *events]:
        assert recorder.consume(event) is None
    assert recorder.writer is None  # the summary closed it
    assert recorder.note.startswith(f"trace closed after the session finished: {path}")
    assert "complete" in recorder.note and recorder.finished_trace == path
    assert recorder.stopped is None and recorder.failure is None and recorder.exit_code == 0
    header, recorded, warnings = read_trace(path)
    assert _stripped(header) == events[0] and not warnings
    # held until the header came, and written at its time: a trace's times never go back
    assert recorded[0] == early.model_copy(update={"t_ns": header.t_ns})
    assert recorded[1:] == events[1:]


def test_export_mid_session_writes_the_backlog_then_keeps_recording(tmp_path):
    events = _events()
    recorder = TraceRecorder()
    middle = len(events) // 2
    for event in events[:middle]:
        recorder.consume(event)
    notice, announce = recorder.export(tmp_path, applied_step=7)
    assert notice.severity == "information" and "recording continues" in notice.text
    assert announce is not None and announce.name == "trace" and announce.applied_step == 7
    path = recorder.writer.path
    assert announce.new == str(path)
    again, none = recorder.export(tmp_path, applied_step=8)
    assert again.text == f"already recording to {path}" and none is None
    announce = announce.model_copy(update={"t_ns": events[middle - 1].t_ns})  # the session's clock
    recorder.consume(announce)  # the caller sends it down the stream
    for event in events[middle:]:
        recorder.consume(event)
    assert recorder.writer is None
    header, recorded, _ = read_trace(path)
    assert _stripped(header) == events[0]
    assert recorded == [*events[1:middle], announce, *events[middle:]]


def test_export_before_the_header_waits_for_it(tmp_path):
    events = _events()
    recorder = TraceRecorder()
    recorder.export(tmp_path, applied_step=0)
    path = recorder.writer.path
    for event in events:
        recorder.consume(event)
    header, recorded, _ = read_trace(path)
    assert _stripped(header) == events[0] and recorded == events[1:]


def test_a_backlog_that_lost_events_says_so(tmp_path):
    events = _events()
    recorder = TraceRecorder(log=EventLog(window=20, max_landmarks=1_000))
    for event in events[:-1]:
        recorder.consume(event)
    notice, _ = recorder.export(tmp_path, applied_step=0)
    assert notice.severity == "warning" and "no longer in memory" in notice.text
    assert "incomplete" in recorder.note
    path = recorder.writer.path
    recorder.consume(events[-1])
    assert "incomplete" in recorder.note and recorder.finished_trace is None
    header, _, _ = read_trace(path)
    assert "export_gap" in header.config


def test_unwritable_export_directory_is_a_clear_error_and_loses_nothing(tmp_path):
    events = _events()
    recorder = TraceRecorder()
    for event in events[:10]:
        recorder.consume(event)
    notice, announce = recorder.export(tmp_path / "missing", applied_step=0)
    assert notice.severity == "error" and notice.text.startswith("cannot export trace: ")
    assert "cannot write trace" in notice.text and announce is None
    assert recorder.writer is None and recorder.failure is None
    for event in events[10:-1]:
        recorder.consume(event)
    recorder.export(tmp_path, applied_step=0)  # a writable directory: everything is there
    path = recorder.writer.path
    recorder.consume(events[-1])
    header, recorded, _ = read_trace(path)
    assert _stripped(header) == events[0] and recorded[:-1] == events[1:-1]


def test_export_after_a_complete_recording_copies_it(tmp_path):
    events = _events()
    path = tmp_path / "run.jsonl"
    recorder = TraceRecorder(TraceWriter(path))
    for event in events:
        recorder.consume(event)
    copies = tmp_path / "copies"
    copies.mkdir()
    notice, announce = recorder.export(copies, applied_step=0)
    assert "a copy of the complete recording" in notice.text and announce is None
    (copy,) = copies.glob("specdash-*.jsonl")
    assert copy.read_bytes() == path.read_bytes()


def test_a_fatal_engine_error_closes_the_trace_a_non_fatal_one_does_not(tmp_path):
    events = _events()[:20]
    recorder = TraceRecorder(TraceWriter(tmp_path / "t.jsonl"))
    for event in events:
        recorder.consume(event)
    recorder.consume(EngineError(message="typed prompt is empty", fatal=False))
    assert recorder.writer is not None
    recorder.consume(EngineError(message="CUDA error: out of memory"))
    assert recorder.writer is None and "after an engine error" in recorder.note
    _, recorded, _ = read_trace(tmp_path / "t.jsonl")
    assert recorded[-1].kind == "error" and recorded[-1].fatal


def test_close_flushes_what_was_recorded(tmp_path):
    events = _events()[:30]
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(TraceWriter(path))
    for event in events:
        recorder.consume(event)
    recorder.close("quit")
    recorder.close("quit")  # idempotent
    assert recorder.writer is None and recorder.note.startswith(f"trace closed after quit: {path}")
    assert "30 lines" in recorder.note
    header, recorded, warnings = read_trace(path)
    assert [_stripped(header), *recorded] == events and not warnings


def test_full_disk_stops_recording_with_an_error_and_the_exit_code_says_so():
    events = _events()
    writer = TraceWriter(FullDisk(room=4000))
    writer.path = Path("t.jsonl")
    recorder = TraceRecorder(writer)
    notices = [n for e in events if (n := recorder.consume(e)) is not None]
    assert [(n.text, n.severity) for n in notices] == [
        ("recording stopped: No space left on device", "error")
    ]  # once; later events are held, not written
    assert recorder.writer is None
    assert (
        recorder.failure
        == recorder.stopped
        == ("recording stopped: No space left on device; t.jsonl holds the session up to then")
    )
    assert "incomplete" in recorder.note and recorder.finished_trace is None
    assert recorder.exit_code == EXIT_ENVIRONMENT == 4  # the README's code for it


def test_a_failed_last_flush_on_close_is_an_io_stop_too():
    """Closing flushes; a disk that fails then cut the trace short as surely as a write."""

    class FailsOnClose(io.StringIO):
        def close(self) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    writer = TraceWriter(FailsOnClose())
    writer.path = Path("t.jsonl")
    recorder = TraceRecorder(writer)
    for event in _events()[:5]:
        recorder.consume(event)
    recorder.close("quit")
    assert (
        recorder.failure
        == "recording stopped: Input/output error; t.jsonl holds the session up to then"
    )
    assert recorder.exit_code == EXIT_ENVIRONMENT


def test_headless_records_through_the_recorder(capsys, pair, tmp_path) -> None:
    """`run --headless --trace`: the same recorder; the trace ends with the summary."""
    path = tmp_path / "t.jsonl"
    argv = ["run", "--headless", "--max-new-tokens", "4", "--drafter", "ngram",
            "--model", str(pair[0]), "--prompts", str(pair[2]), "--trace", str(path)]  # fmt: skip
    assert main(argv) == 0
    header, events, warnings = read_trace(path)
    assert header.kind == "session_start" and events[-1].kind == "summary" and not warnings
    assert capsys.readouterr().err == ""
