"""The dashboard's export memory stays bounded over an arbitrarily long session, and an export
is complete when it can be and says what it lacks when it cannot."""

from __future__ import annotations

import math
import tracemalloc
from collections import Counter
from collections.abc import Iterator

from fake_events import ScriptedSource, fake_session

from specdash.events import Divergence, Event, PromptDone, PromptStart, SessionStart, Token
from specdash.trace.event_log import LANDMARK_KINDS, PACK, WINDOW_EVENTS, EventLog
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.ui.app import SpecdashApp

SIZE = (160, 48)


def long_session(prompts: int, tokens_per_prompt: int = 200) -> Iterator[Event]:
    """A session of `prompts` prompts, generated lazily so the test holds none of it."""
    yield SessionStart(t_ns=0, config={"k": 4}, versions={}, device="cpu", gemm_backend="torch")
    t = 0
    for p in range(prompts):
        t += 1
        yield PromptStart(t_ns=t, prompt_index=p, prompt_tokens=3, text=f"prompt {p}")
        for i in range(tokens_per_prompt):
            t += 1
            yield Token(
                t_ns=t,
                prompt_index=p,
                position=i,
                token_id=i,
                logprob=-0.5,
                text=" word",
                source="draft",
                step=i,
            )
        if p % 10 == 0:
            yield Divergence(
                t_ns=t,
                prompt_index=p,
                position=1,
                step=0,
                k=4,
                verify_mode="exact",
                gemm_backend="torch",
                what="logprob",
                spec_token=1,
                shadow_token=1,
                spec_logprob=-0.5,
                shadow_logprob=-0.25,
            )
        yield PromptDone(
            t_ns=t,
            prompt_index=p,
            new_tokens=tokens_per_prompt,
            seconds=1.0,
            verify_steps=1,
            accepted_drafts=0,
            proposed_drafts=0,
            exact=p % 10 != 0,
        )


def test_memory_stays_bounded_over_a_long_session():
    log = EventLog(window=2_000, max_landmarks=500)
    tracemalloc.start()
    try:
        sizes = []
        for n, event in enumerate(long_session(prompts=1_500), start=1):
            log.append(event)
            if n % 100_000 == 0:
                sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(log) == 1 + 500 + 2_000
    assert len(sizes) == 3  # 300k events seen
    # flat, not ~1 kB per event (100 MB): what moves is the newest < PACK events, kept as
    # objects until a block is packed
    assert max(sizes) - min(sizes) < PACK * 1_500, sizes


def test_a_full_window_is_packed_small():
    """A full window of pydantic objects would be ~65 MB, and the dashboard's RSS would grow
    until it filled; packed it is a few MB."""
    log = EventLog()
    tracemalloc.start()
    try:
        for event in long_session(prompts=WINDOW_EVENTS // 200 + 10):
            log.append(event)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert not log.complete and len(log) >= WINDOW_EVENTS
    assert held < 5 * 2**20, held  # ~100 B an event at most, vs ~1.3 kB as objects


def test_packed_events_export_unchanged_in_stream_order():
    events = list(long_session(prompts=30, tokens_per_prompt=150))
    nan = Token(
        t_ns=events[-1].t_ns + 1,
        prompt_index=29,
        position=150,
        token_id=1,
        logprob=float("nan"),
        text="\x00 é",
        source="bonus",
        step=150,
    )
    events.append(nan)
    window = 3 * PACK + 17
    log = EventLog(window=window, max_landmarks=10)
    for event in events:
        log.append(event)
    assert len(log) == 1 + 10 + window
    exported = list(log.export())
    assert exported[-window:-1] == events[-window:-1]
    assert math.isnan(exported[-1].logprob) and exported[-1].text == nan.text
    assert exported[1:11] == [e for e in events[:-window] if e.kind in LANDMARK_KINDS][-10:]
    kept = Counter(e.kind for e in exported[1:])
    assert log.dropped + kept == Counter(e.kind for e in events[1:])
    assert log.dropped_until_ns < events[-window].t_ns


def test_nothing_dropped_exports_everything_unchanged():
    events = list(long_session(prompts=3))
    log = EventLog(window=10_000)
    for event in events:
        log.append(event)
    assert log.complete and log.gap_note() == ""
    assert list(log.export()) == events


def test_dropped_events_are_counted_and_named_in_the_header():
    events = list(long_session(prompts=40, tokens_per_prompt=50))
    log = EventLog(window=300, max_landmarks=1_000)
    for event in events:
        log.append(event)
    exported = list(log.export())
    header, rest = exported[0], exported[1:]
    gap = header.config["export_gap"]
    kept = Counter(e.kind for e in rest)
    seen = Counter(e.kind for e in events[1:])
    assert Counter(gap["dropped_events"]) + kept == seen  # every event is kept or counted
    assert set(gap["dropped_events"]) == {"token"}  # landmarks survive the window
    assert kept["prompt_start"] == kept["prompt_done"] == 40 and kept["divergence"] == 4
    assert rest[-300:] == events[-300:]  # the recent window in full
    assert [e.t_ns for e in rest] == sorted(e.t_ns for e in rest)  # stream order
    assert gap["complete_after_t_ns"] < events[-300].t_ns
    assert "events before" in gap["note"] and "no longer in memory" in gap["note"]
    assert header.config["k"] == 4  # the rest of the header is the session's own


def test_landmarks_are_bounded_too():
    log = EventLog(window=100, max_landmarks=50)
    for event in long_session(prompts=200, tokens_per_prompt=5):
        log.append(event)
    assert len(log) == 1 + 50 + 100
    assert log.dropped["prompt_start"] > 0


async def test_export_mid_session_says_what_was_dropped(tmp_path):
    events = fake_session(prompts=4)
    app = SpecdashApp(ScriptedSource.live_like(events), trace_dir=tmp_path)
    app.event_log = EventLog(window=100, max_landmarks=1_000)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        await pilot.press("e")
        app.refresh_numbers()
        assert "incomplete" in app.recorder.note
        assert "no longer in memory" in app.recorder.note
    (path,) = tmp_path.glob("specdash-*.jsonl")
    header, recorded, warnings = read_trace(path)
    assert not warnings
    gap = header.config["export_gap"]
    dropped = sum(gap["dropped_events"].values())
    assert dropped + len(recorded) == len(events) - 1 + 1  # + the export's own control event
    assert recorded[-1].kind == "control" and recorded[-1].name == "trace"


async def test_trace_recorded_from_the_start_is_complete_however_long(tmp_path):
    """A tiny in-memory window does not limit a recording that began at the header."""
    events = fake_session(prompts=6)
    path = tmp_path / "run.jsonl"
    app = SpecdashApp(ScriptedSource.live_like(events), tmp_path, TraceWriter(path))
    app.event_log = EventLog(window=50, max_landmarks=5)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        await pilot.press("e")  # mid-session: the recording is the export
        assert app.trace_writer is not None and app.trace_writer.path == path
        assert not app.event_log.complete
    header, recorded, _ = read_trace(path)
    assert "export_gap" not in header.config
    assert recorded == events[1:]


async def test_export_after_a_complete_recording_closed_copies_it(tmp_path):
    from specdash.events import Summary

    summary = Summary(
        prompts=6,
        exact_prompts=5,
        new_tokens=1,
        seconds=1.0,
        tokens_per_s=1.0,
        mean_accepted_length=1.0,
        acceptance_rate=0.0,
        verify_steps=1,
        divergences=1,
    )
    events = [*fake_session(prompts=6), summary]
    path = tmp_path / "run.jsonl"
    app = SpecdashApp(ScriptedSource.live_like(events), tmp_path, TraceWriter(path))
    app.event_log = EventLog(window=50, max_landmarks=5)
    app.notes = []
    app.notify = lambda message, **kw: app.notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        assert app.trace_writer is None and "complete" in app.recorder.note
        await pilot.press("e")
    (copy,) = tmp_path.glob("specdash-*.jsonl")
    assert copy.read_bytes() == path.read_bytes()
    assert any("copy of the complete recording" in n for n in app.notes)
