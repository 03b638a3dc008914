"""The dashboard's engine in its own process (`specdash.runs.engine_process`): the events that
cross are the events the session emitted, byte for byte and bit for bit; controls reach the
engine; the child's death is a fatal error with its exit code; `q` and Ctrl-C stop it and keep
the session's end in the trace."""

from __future__ import annotations

import json
import time
from pathlib import Path

import engine_standins
import pytest
from fake_events import fake_session
from test_app import SIZE, settle, wait_until

from specdash.errors import EXIT_ENVIRONMENT, EXIT_INTERRUPTED
from specdash.events import ControlChange, Event, VerifyStep
from specdash.prompts import default_prompts_path
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.ui.app import SpecdashApp
from specdash.ui.sources import EventBuffer, LiveSession

TIMES = {
    "t_ns",
    "wall_time",
    "seconds",
    "shadow_seconds",
    "draft_s",
    "verify_s",
    "shadow_s",
    "rollback_s",
}
"""Fields that differ between two runs of one session: clocks and durations."""
TIMED = {"summary": {"tokens_per_s", "shadow_tokens_per_s", "wall_seconds"}}


@pytest.fixture
def short_prompts(tmp_path) -> Path:
    """The first three shipped prompts: short, so a session is mostly decode."""
    path = tmp_path / "short.jsonl"
    lines = default_prompts_path().read_text().splitlines(keepends=True)[:3]
    path.write_text("".join(lines))
    return path


def collect_until(session: LiveSession, kind: str, timeout: float = 60) -> list[Event]:
    buffer, events = EventBuffer(), []
    session.start(buffer.put)
    deadline = time.monotonic() + timeout
    while not any(e.kind == kind for e in events) and time.monotonic() < deadline:
        time.sleep(0.05)
        events += buffer.drain()
    session.stop()
    return events + buffer.drain()


def test_events_cross_byte_identical():
    """What the child's session emitted (fixed times) arrives as the same JSON bytes, in order."""
    session = LiveSession(
        SessionSettings(), telemetry=False, run=engine_standins.fake_session_then_wait
    )
    sent = fake_session()
    received = collect_until(session, "prompt_done")  # `stop` returns once the rest is in
    assert [e.model_dump_json() for e in received] == [e.model_dump_json() for e in sent]


def untimed(event: Event) -> dict:
    data = json.loads(event.model_dump_json())
    return {k: v for k, v in data.items() if k not in TIMES | TIMED.get(event.kind, set())}


def test_a_real_session_in_the_child_is_the_in_process_one(short_prompts):
    """The embedded pair in the engine process and in this one: the same events, every token id
    and fp32 logprob bit, every verify step and verdict (clocks and durations aside); the
    dashboard's session then waits for a typed prompt (`Idle`), which headless does not."""
    settings = SessionSettings(prompts=short_prompts, max_new_tokens=12)
    here: list[Event] = []
    run_engine(settings, here.append)
    child = collect_until(LiveSession(settings, telemetry=False), "idle")
    child = [e for e in child if e.kind != "idle"]
    assert child[-1].kind == "summary" and here[-1].kind == "summary"
    assert [untimed(e) for e in child] == [untimed(e) for e in here]
    assert sum(e.kind == "token" for e in child) == 36


def live_app(settings: SessionSettings, trace: Path, **source) -> SpecdashApp:
    return SpecdashApp(
        LiveSession(settings, telemetry=False, **source), trace.parent, TraceWriter(trace)
    )


async def test_a_key_mid_session_reaches_the_engine_in_its_process(tmp_path, short_prompts):
    """`+` while the engine decodes: the engine applies k 5 at a step boundary, every verify
    step before it ran at k 4 and every one after at 5; `q` then ends the session with its
    summary in the trace."""
    trace = tmp_path / "t.jsonl"
    app = live_app(SessionSettings(prompts=short_prompts, max_new_tokens=200), trace)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: (app.refresh_numbers(), app.model.steps >= 3)[1])
        await pilot.press("plus")
        await wait_until(pilot, lambda: (app.refresh_numbers(), app.model.k == 5)[1])
        await pilot.press("q")
    assert app.return_value == 0
    _, events, warnings = read_trace(trace)
    assert not warnings
    (change,) = [e for e in events if isinstance(e, ControlChange)]
    assert (change.name, change.old, change.new) == ("k", "4", "5") and change.applied_step > 0
    steps = [e for e in events if isinstance(e, VerifyStep)]
    assert {s.k for s in steps if s.step < change.applied_step} == {4}
    assert {s.k for s in steps if s.step >= change.applied_step} == {5}
    assert events[-1].kind == "summary"
    assert not app.source._engine._process.is_alive()


async def test_q_mid_prompt_writes_the_summary(tmp_path, short_prompts):
    trace = tmp_path / "t.jsonl"
    app = live_app(SessionSettings(prompts=short_prompts, max_new_tokens=200), trace)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: (app.refresh_numbers(), app.model.steps >= 3)[1])
        await pilot.press("q")
    _, events, _ = read_trace(trace)
    kinds = [e.kind for e in events]
    assert kinds[-2:] == ["prompt_done", "summary"]  # the running prompt's verdict, then totals
    assert events[-1].new_tokens == sum(e.new_tokens for e in events if e.kind == "prompt_done")
    assert events[-1].prompts == kinds.count("prompt_done") < 3  # it stopped mid-set


async def test_ctrl_c_stops_the_engine_process(tmp_path, short_prompts):
    trace = tmp_path / "t.jsonl"
    app = live_app(SessionSettings(prompts=short_prompts, max_new_tokens=200), trace)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: (app.refresh_numbers(), app.model.steps >= 1)[1])
        await pilot.press("ctrl+c")
    assert app.return_value == EXIT_INTERRUPTED
    assert not app.source._engine._process.is_alive()
    _, events, _ = read_trace(trace)
    assert events[-1].kind == "summary"


async def test_the_engine_process_dying_is_a_fatal_error(tmp_path):
    """SIGKILL (no exception reports it): the events it sent are kept, the error panel says
    how it died with its last line of output, and `q` exits 4 with that line."""
    trace = tmp_path / "t.jsonl"
    app = live_app(SessionSettings(), trace, run=engine_standins.killed_mid_session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.source.running)
        await settle(pilot)
        (error,) = app.model.errors
        assert error.message.startswith(
            "the engine process was killed by SIGKILL before the session ended: "
            "engine: about to be killed (its output: "
        )
        assert error.fatal and error.exit_code == EXIT_ENVIRONMENT
        assert "killed by SIGKILL" in str(app.query_one("#error").render())
        # its last events may not have crossed: not "complete"
        assert app.recorder.note == (
            f"trace closed after an engine error: {trace} (41 lines, incomplete: the session "
            "up to then, readable)"
        )
        await pilot.press("q")
    assert app.return_value == EXIT_ENVIRONMENT and app.exit_message == error.message
    output = Path(error.message.rsplit("(its output: ", 1)[1].rstrip(")"))
    assert output.read_text().strip() == "engine: about to be killed"  # kept: it is named
    output.unlink()
    _, events, _ = read_trace(trace)
    assert [e.model_dump_json() for e in events[:39]] == [
        e.model_dump_json() for e in fake_session()[1:40]
    ]


async def test_an_engine_dying_while_replacing_a_trace_keeps_the_old_one(tmp_path):
    """`--trace OLD --overwrite` and the engine process is killed: its death ends the session
    but was no report of the engine's, so the recording is not whole. OLD stays as it was,
    the partial recording (the death included) is kept beside it and named."""
    trace = tmp_path / "t.jsonl"
    old = "".join(e.model_dump_json() + "\n" for e in fake_session())
    trace.write_text(old)
    app = SpecdashApp(
        LiveSession(SessionSettings(), telemetry=False, run=engine_standins.killed_mid_session),
        tmp_path,
        TraceWriter(trace, overwrite=True),
    )
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.source.running)
        await settle(pilot)
        assert app.recorder.writer is None  # closed by the death
        await pilot.press("q")
    assert app.return_value == EXIT_ENVIRONMENT
    assert trace.read_text() == old
    (partial,) = (p for p in tmp_path.iterdir() if p != trace)
    kept = f"{trace} kept as it was; the partial recording is {partial}"
    assert app.recorder.stopped == f"recording cut short (an engine error); {kept}"
    assert app.recorder.note == f"trace closed after an engine error: {kept}"
    _, events, _ = read_trace(partial)
    assert events[-1].kind == "error" and "killed by SIGKILL" in events[-1].message
    Path(events[-1].message.rsplit("(its output: ", 1)[1].rstrip(")")).unlink()
