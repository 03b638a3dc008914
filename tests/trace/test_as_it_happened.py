"""A trace and its replay tell the session as it happened: `n` is a control event with the
skipped prompt marked, `q` mid-prompt still records the prompt's end and the summary, every
control's `applied_step` counts engine steps, event times only move forward from the header,
and a replay's clocks are the trace's, whatever way it is watched."""

from __future__ import annotations

import pytest
from fake_events import ScriptedSource, fake_session
from synthetic_trace import Plan, session
from textual.widgets import Input

from specdash.controls import Controls
from specdash.events import (
    ControlChange,
    Event,
    Prefill,
    PromptDone,
    PromptStart,
    Summary,
    TelemetrySample,
    VerifyStep,
)
from specdash.runs.native import native_session
from specdash.settings import SessionSettings
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.trace.recorder import TraceRecorder
from specdash.trace.replay import TraceReplay
from specdash.ui.app import SpecdashApp
from specdash.ui.replay_app import ReplayApp

SIZE = (160, 48)


def _settings(pair, **kw) -> SessionSettings:
    return SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=8, **kw)


async def settle(pilot) -> None:
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


def test_next_prompt_is_a_control_event_and_the_skipped_prompt_is_marked(pair):
    settings = _settings(pair, k=2)
    controls = Controls.from_settings(settings, "torch")
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)
        if isinstance(e, VerifyStep) and e.prompt_index == 0 and e.step == 1:
            controls.request_next_prompt()

    native_session(settings, sink, controls).run()
    (change,) = [e for e in events if isinstance(e, ControlChange)]
    assert (change.name, change.old, change.new, change.applied_step) == (
        "prompt",
        "0",
        "skipped",
        2,
    )
    done = {e.prompt_index: e for e in events if isinstance(e, PromptDone)}
    assert done[0].skipped and not any(d.skipped for p, d in done.items() if p)
    assert events.index(change) < events.index(done[0])


def test_stop_mid_prompt_ends_the_prompt_then_the_summary(pair):
    settings = _settings(pair, k=2)
    events: list[Event] = []
    runner = None

    def sink(e: Event) -> None:
        events.append(e)
        if isinstance(e, VerifyStep) and e.step == 1:
            runner.stop.set()

    runner = native_session(settings, sink)
    runner.run()
    assert [e.kind for e in events[-2:]] == ["prompt_done", "summary"]
    assert events[-2].prompt_index == 0


class StopsLikeARunner(ScriptedSource):
    """A live source whose `stop` lets the engine end the way a runner does: the running
    prompt's end, then the summary, sent from its thread while the app waits for it."""

    def stop(self) -> None:
        super().stop()
        last = self.events[-1].t_ns
        self.sink(
            PromptDone(
                t_ns=last + 1,
                prompt_index=1,
                new_tokens=3,
                seconds=0.1,
                verify_steps=2,
                accepted_drafts=1,
                proposed_drafts=8,
                exact=True,
            )
        )
        self.sink(Summary(t_ns=last + 2, prompts=2, exact_prompts=2, new_tokens=9, seconds=0.2,
                          tokens_per_s=45.0, mean_accepted_length=2.0, acceptance_rate=0.2,
                          verify_steps=4, divergences=0))  # fmt: skip

    def start(self, sink) -> None:
        self.sink = sink
        super().start(sink)


async def test_quit_mid_prompt_records_the_prompts_end_and_the_summary(tmp_path):
    events = [
        e for e in fake_session(seed=7) if not (isinstance(e, PromptDone) and e.prompt_index == 1)
    ]
    path = tmp_path / "s.jsonl"
    source = StopsLikeARunner(events, Controls.from_settings(SessionSettings()))
    app = SpecdashApp(source, tmp_path, TraceWriter(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
    _, recorded, _ = read_trace(path)
    assert [e.kind for e in recorded[-2:]] == ["prompt_done", "summary"]
    assert "complete" in app.recorder.note


async def test_the_trace_control_counts_engine_steps(tmp_path):
    events = fake_session(seed=7)
    last = events[-1].t_ns
    plain = [  # speculation off: plain decode steps, not verify steps
        VerifyStep(t_ns=last + i, prompt_index=1, step=60 + i, k=0, accepted=0, draft_tokens=[],
                   emitted_tokens=[5], verify_mode="exact", gemm_backend="rowwise", draft_s=0.0,
                   verify_s=0.01, shadow_s=0.01, rollback_s=0.0)
        for i in range(5)
    ]  # fmt: skip
    app = SpecdashApp(ScriptedSource.live_like(events + plain), trace_dir=tmp_path)
    app.notify = lambda *a, **kw: None
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        assert app.model.verify_steps == 60
    (path,) = tmp_path.glob("specdash-*.jsonl")
    _, recorded, _ = read_trace(path)
    (change,) = [e for e in recorded if isinstance(e, ControlChange)]
    assert change.name == "trace" and change.applied_step == 65  # the next engine step


def test_event_times_only_move_forward_from_the_header(tmp_path):
    events = session(Plan(prompts=1))
    header = events[0]
    early = TelemetrySample(t_ns=header.t_ns - 5_000_000, window_s=0.0, source="none", note="x")
    late = events[5]
    racing = TelemetrySample(t_ns=late.t_ns - 1_000, window_s=0.1, source="none", note="y")
    path = tmp_path / "s.jsonl"
    recorder = TraceRecorder(TraceWriter(path))
    for e in [early, *events[:6], racing, *events[6:]]:
        recorder.consume(e)
    recorder.close("done")
    head, recorded, _ = read_trace(path)
    times = [head.t_ns] + [e.t_ns for e in recorded]
    assert times == sorted(times), "a line's time is never before the line above it"
    assert len(recorded) == len(events) + 1  # nothing dropped


async def test_replay_prefill_counter_stops_while_paused():
    events = session(Plan(prompts=1))
    i = next(i for i, e in enumerate(events) if isinstance(e, Prefill))
    start = next(e for e in events if isinstance(e, PromptStart))
    slow = 30_000_000_000  # a 30 s prefill
    events = events[:i] + [e.model_copy(update={"t_ns": e.t_ns + slow}) for e in events[i:]]
    t = [100.0]
    replay = TraceReplay(events[0], events[1:], clock=lambda: t[0])
    app = ReplayApp(replay, name="s")
    async with app.run_test(size=(SIZE[0], SIZE[1] + 1)) as pilot:
        t[0] += (start.t_ns - events[0].t_ns) / 1e9 + 10  # 10 s into the prefill
        app.tick()
        await settle(pilot)
        await pilot.press("space")  # pause
        before = str(app.query_one("#status").render())
        assert "prefill" in before and "10 s" in before, before
        t[0] += 60
        app.tick()
        await settle(pilot)
        assert str(app.query_one("#status").render()) == before
        assert not app.query_one("#prompt", Input).display


def _paused_trace() -> list[Event]:
    """A session that sat paused for 20 s halfway through."""
    events = session(Plan(prompts=1))
    steps = [i for i, e in enumerate(events) if isinstance(e, VerifyStep)]
    half = steps[len(steps) // 2] + 1
    t = events[half - 1].t_ns
    pause = ControlChange(t_ns=t, name="paused", old="False", new="True", applied_step=0)
    resume = ControlChange(t_ns=t + 20_000_000_000, name="paused", old="True", new="False",
                           applied_step=0)  # fmt: skip
    shifted = [e.model_copy(update={"t_ns": e.t_ns + 20_000_000_000}) for e in events[half:]]
    return [*events[:half], pause, resume, *shifted]


def _session_row(app) -> str:
    numbers = str(app.query_one("#throughput-numbers").render())
    return next(line for line in numbers.splitlines() if line.startswith("session"))


async def test_replay_session_rate_is_the_traces_however_it_is_watched():
    events = _paused_trace()
    rows = []
    for watch in ("play", "seek", "step"):
        t = [100.0]
        app = ReplayApp(TraceReplay(events[0], events[1:], clock=lambda t=t: t[0]), name="s")
        async with app.run_test(size=(SIZE[0], SIZE[1] + 1)) as pilot:
            if watch == "play":
                for _ in range(50):
                    t[0] += 1.0
                    app.tick()
            elif watch == "seek":
                await pilot.press("right_square_bracket", "right_square_bracket",
                                  "right_square_bracket", "right_square_bracket")  # fmt: skip
            else:
                await pilot.press("space")
                while not app.replay.finished:
                    app.action_step()
            await settle(pilot)
            rows.append(_session_row(app))
    assert rows[0] == rows[1] == rows[2]
    live = SpecdashApp(ScriptedSource.live_like(events))
    async with live.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert _session_row(live) == rows[0]
        model = live.model
        busy = model.elapsed_s - 20.0
        assert model.tokens_per_s_session == pytest.approx(model.session_tokens / busy)
