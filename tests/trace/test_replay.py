"""`specdash replay`: playback control of a recorded session, and the live dashboard's own
widgets showing the replayed session exactly as they showed it live."""

from __future__ import annotations

import pytest
from fake_events import ScriptedSource
from synthetic_trace import Plan, session
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from specdash.cli import main
from specdash.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageError
from specdash.events import PromptStart, VerifyStep
from specdash.trace.jsonl import TraceWriter, read_trace
from specdash.trace.replay import TraceReplay
from specdash.ui.app import SpecdashApp
from specdash.ui.replay_app import ReplayApp

SIZE = (160, 48)
PANELS = ("#status", "#throughput", "#acceptance", "#gpu", "#divergence", "#tokens")


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def replay_of(speed: float = 1.0):
    events = session(Plan())
    clock = FakeClock()
    return TraceReplay(events[0], events[1:], speed=speed, clock=clock), clock, events


def test_plays_at_recorded_pace_and_speed():
    replay, clock, events = replay_of(speed=2.0)
    got = []
    replay.start(got.append)
    assert got == [events[0]]  # the header at t=0
    clock.t += 0.05  # 0.1 s of trace time at 2x
    replay.tick()
    due = [e for e in events if e.t_ns - events[0].t_ns <= 0.1e9]
    assert got == due and len(due) > 5
    clock.t += 1e6
    replay.tick()
    assert got == events and replay.finished and not replay.playing


def test_pause_holds_position_and_step_sends_one_verify_step():
    replay, clock, events = replay_of()
    got = []
    replay.start(got.append)
    replay.pause()
    clock.t += 10
    assert replay.tick() == 0
    replay.step()
    assert isinstance(got[-1], VerifyStep) and got[-1].step == 0
    assert sum(isinstance(e, VerifyStep) for e in got) == 1
    replay.step()
    assert got[-1].step == 1 and got == events[: len(got)]
    assert not replay.playing


def test_seek_returns_the_history_and_continues_from_there():
    replay, clock, events = replay_of()
    got = []
    replay.start(got.append)
    history = replay.seek(0.5)
    assert history == [e for e in events if e.t_ns - events[0].t_ns <= 0.5e9]
    clock.t += 0.1
    replay.tick()
    assert got[-1] is not events[0]
    assert history + got[1:] == events[: len(history) + len(got) - 1]
    back = replay.seek(-3)
    assert back == [events[0]] and replay.position_s == 0.0
    assert replay.seek(1e9) == events and replay.position_s == replay.duration_s


def test_step_back_and_next_prompt():
    replay, _, events = replay_of()
    replay.start(lambda e: None)
    replay.pause()
    for _ in range(3):
        replay.step()
    history = replay.step_back()
    assert [e.step for e in history if isinstance(e, VerifyStep)] == [0, 1]
    t = replay.next_prompt_s()
    history = replay.seek(t)
    assert isinstance(history[-1], PromptStart) or any(
        isinstance(e, PromptStart) and e.prompt_index == 1 for e in history
    )


def test_speed_must_be_positive():
    events = session(Plan(prompts=1))
    with pytest.raises(UsageError, match="speed must be above 0"):
        TraceReplay(events[0], events[1:], speed=0)


def panel_text(app) -> dict[str, list[str]]:
    """What each panel shows: its text widgets, plots and table rows."""
    shown = {}
    for selector in PANELS:
        panel = app.query_one(selector)
        widgets = [panel, *panel.query("*")]
        texts = [str(w.render()) for w in widgets if isinstance(w, Static | PlotextPlot)]
        rows = [
            [str(c) for c in t.get_row_at(i)]
            for t in widgets if isinstance(t, DataTable) for i in range(t.row_count)
        ]  # fmt: skip
        shown[selector] = texts + [" | ".join(r) for r in rows]
    return shown


async def settle(pilot):
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


async def shown_live(events) -> dict[str, list[str]]:
    app = SpecdashApp(ScriptedSource.live_like(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        return panel_text(app)


async def test_replay_shows_what_the_live_dashboard_showed(tmp_path):
    events = session(Plan(divergence_at=(1, 9)))
    path = tmp_path / "s.jsonl"
    with TraceWriter(path) as w:
        for e in events:
            w(e)
    header, back, _ = read_trace(path)
    clock = FakeClock()
    app = ReplayApp(TraceReplay(header, back, clock=clock), name="s.jsonl")
    async with app.run_test(size=SIZE) as pilot:  # the replay bar where the prompt line was
        clock.t += 1e6
        app.tick()
        await settle(pilot)
        replayed = panel_text(app)
        assert "■ end" in str(app.query_one("#replay-bar", Static).render())
    live = await shown_live(events)
    assert replayed == live
    assert any("DIVERGED" in t for t in live["#status"])


async def test_seeking_back_rebuilds_the_panels(tmp_path):
    events = session(Plan())
    clock = FakeClock()
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=clock), name="x")
    async with app.run_test(size=(SIZE[0], SIZE[1] + 1)) as pilot:
        await pilot.press("space")  # pause at the start
        for _ in range(5):
            await pilot.press("full_stop")
        await settle(pilot)
        assert app.model.verify_steps == 5
        await pilot.press("comma")
        await settle(pilot)
        assert app.model.verify_steps == 4
        early = panel_text(app)
        await pilot.press("right_square_bracket")  # +10 s: past the end
        await settle(pilot)
        assert app.model.finished and app.replay.finished
        await pilot.press("0")
        assert app.model.verify_steps == 0 and app.replay.playing
        app.replay.pause()
        for _ in range(4):
            await pilot.press("full_stop")
        await settle(pilot)
        assert panel_text(app) == early


async def test_engine_controls_are_read_only_in_a_replay():
    events = session(Plan(prompts=1))
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=FakeClock()), name="x")
    notes = []
    app.notify = lambda message, **kw: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        for key in ("g", "v", "plus"):
            await pilot.press(key)
    assert notes == ["read-only: this session is a replay"] * 3


async def test_e_in_a_replay_writes_nothing(tmp_path, monkeypatch):
    """The README's rule: replay writes nothing; `e` says so instead of exporting."""
    monkeypatch.chdir(tmp_path)
    events = session(Plan(prompts=1))
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=FakeClock()), name="x")
    notes = []
    app.notify = lambda message, **kw: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
    assert notes == [
        "read-only: a replay writes nothing, the trace is the recording "
        "(specdash export converts it)"
    ]
    assert list(tmp_path.iterdir()) == []


async def test_torn_trace_replays_with_a_warning(tmp_path):
    path = tmp_path / "s.jsonl"
    with TraceWriter(path) as w:
        for e in session(Plan(prompts=1)):
            w(e)
    path.write_bytes(path.read_bytes()[:-30])
    header, events, warnings = read_trace(path)
    app = ReplayApp(TraceReplay(header, events, speed=1000), name="s", warnings=warnings)
    notes = []
    app.notify = lambda message, **kw: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        await settle(pilot)
        assert app.replay.finished and app.model.verify_steps > 0
    assert any("torn last line" in n for n in notes)


def test_cli_replay_opens_the_app_on_the_trace(tmp_path, monkeypatch):
    path = tmp_path / "s.jsonl"
    with TraceWriter(path) as w:
        for e in session(Plan(prompts=1)):
            w(e)
    opened = []
    monkeypatch.setattr(ReplayApp, "run", lambda self: opened.append(self))
    assert main(["replay", str(path), "--speed", "4"]) == EXIT_OK
    assert opened[0].trace_name == "s.jsonl" and opened[0].replay.speed == 4
    assert len(opened[0].replay.events) == len(session(Plan(prompts=1)))


def test_cli_replay_bad_input(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "none.jsonl")]) == EXIT_USAGE
    (tmp_path / "t.jsonl").write_text(session(Plan())[0].model_dump_json() + "\n")
    with pytest.raises(SystemExit) as flag_error:
        main(["replay", str(tmp_path / "t.jsonl"), "--speed", "-1"])
    assert flag_error.value.code == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"specdash: error: trace not found: {tmp_path / 'none.jsonl'}",
        "specdash: error: argument --speed: -1 is out of range (a finite number above 0)",
        "hint: `specdash replay --help` lists every flag",
    ]


async def test_replay_plays_on_under_the_help_screen_and_while_quitting():
    """The position bar lives on the dashboard screen: a tick with the help screen on top
    updates it, and a tick after the bar is gone (the app quitting: a query raises NoMatches)
    moves the replay on without failing."""
    from specdash.ui.widgets.help_screen import HelpScreen

    events = session(Plan())
    clock = FakeClock()
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=clock), name="x")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        step = app.replay.duration_s / 100
        clock.t += step
        app.tick()
        await pilot.pause()
        await pilot.press("escape")
        bar = str(app.dashboard.query_one("#replay-bar", Static).render())
        assert f"event {app.replay.cursor}/" in bar and app.replay.cursor > 0
        await app.dashboard.query_one("#replay-bar").remove()  # gone, as when the app quits
        cursor = app.replay.cursor
        for _ in range(10):
            clock.t += step
            app.tick()
        assert not app.replay.finished and app.replay.cursor > cursor  # moved, drawn nowhere


async def test_ctrl_c_ends_a_replay_with_130(tmp_path, monkeypatch, capsys):
    replay, _, _ = replay_of()
    app = ReplayApp(replay, name="s")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+c")
    assert app.return_value == EXIT_INTERRUPTED
    path = tmp_path / "s.jsonl"
    with TraceWriter(path) as w:
        for e in session(Plan(prompts=1)):
            w(e)
    monkeypatch.setattr(ReplayApp, "run", lambda self: EXIT_INTERRUPTED)
    assert main(["replay", str(path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "specdash: interrupted\n"


def test_a_tick_sends_at_most_its_bound_and_the_clock_waits_for_the_rest():
    events = session(Plan(prompts=3))
    clock = FakeClock()
    replay = TraceReplay(events[0], events[1:], speed=1e9, clock=clock, max_per_tick=10)
    got = []
    replay.start(got.append)
    clock.t += 1
    assert replay.tick() == 10 and not replay.finished
    assert replay.position_s == replay._offsets[replay.cursor - 1]  # where it is, not ahead
    while not replay.finished:
        clock.t += 1
        assert replay.tick() <= 10
    assert got == events  # every event, in order, none dropped


async def test_a_dense_trace_at_a_high_speed_loses_no_event():
    """More events due in one tick than the dashboard's buffer holds: none dropped, the
    session's header among them (the status leaves LOADING)."""
    events = session(Plan(prompts=150, new_tokens=300, telemetry=False))
    clock = FakeClock()
    app = ReplayApp(TraceReplay(events[0], events[1:], speed=1e9, clock=clock), name="x")
    assert len(events) > app.buffer.capacity  # all of them due at the first tick
    async with app.run_test(size=SIZE) as pilot:
        clock.t += 1
        while not app.replay.finished:
            clock.t += 1
            await pilot.pause(0.05)
        await settle(pilot)
        assert app.buffer.dropped == 0
        assert app.model.started and app.model.finished
        assert app.model.verify_steps == sum(isinstance(e, VerifyStep) for e in events)


@pytest.mark.parametrize("cut", [False, True], ids=["finished", "cut-off"])
async def test_the_bar_fits_100_columns_and_says_where_a_cut_off_recording_ends(cut):
    events = session(Plan(prompts=1))
    if cut:  # killed mid-run: no summary, the last prompt unfinished
        events = [e for e in events if e.kind not in ("summary", "prompt_done")][:-5]
    clock = FakeClock()
    name = "specdash-20261207-123456.jsonl"  # an exported trace's name
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=clock), name=name)
    async with app.run_test(size=(100, 30)) as pilot:
        clock.t += 1e6
        app.tick()
        await pilot.pause()
        bar = str(app.query_one("#replay-bar", Static).render())
    assert len(bar) <= 100 - 2 and name in bar and "recorded" in bar, bar  # (padding 0 1)
    assert ("■ end: recording cut off here" in bar) is cut
    assert cut or "■ end" in bar


@pytest.mark.parametrize("width", [100, 120, 160])
async def test_the_bar_keeps_a_long_name_and_the_position_whole(width):
    """Mid-replay of a trace with a long name, cut off: the name, where the replay is (its
    recorded seconds, share and speed) and the cut stay whole at every width; the words
    around them ("recorded", the event counter) go first where they do not fit."""
    events = session(Plan(prompts=2))
    events = [e for e in events if e.kind not in ("summary", "prompt_done")][:-5]
    clock = FakeClock()
    name = "qwen3.5-27b-nextn-24-prompts-on-the-h100-k9.jsonl"
    app = ReplayApp(TraceReplay(events[0], events[1:], clock=clock), name=name)
    async with app.run_test(size=(width, 30)) as pilot:
        app.replay.set_speed(0.25)
        clock.t += app.replay.duration_s * 2  # (recorded seconds at a quarter of the pace)
        app.tick()
        await pilot.pause()
        playing = str(app.query_one("#replay-bar", Static).render())
        clock.t += 1e6
        app.tick()
        await pilot.pause()
        ended = str(app.query_one("#replay-bar", Static).render())
    for bar in (playing, ended):
        assert len(bar) <= width - 2 and f"REPLAY {name}  " in bar and "…" not in bar, bar
    r = app.replay
    assert f"/{r.duration_s:.2f} s" in playing and "0.25x" in playing and "%)" in playing
    assert f"■ end: recording cut off here  {r.duration_s:.2f} s" in ended
    if width == 160:
        assert "s recorded (" in playing and f"/{len(r.events)}" in playing
        assert f"s recorded  {len(r.events)} events" in ended


async def test_the_replay_charts_are_in_recorded_seconds_at_any_speed():
    """The throughput and GPU charts of a replay put each point at its recorded time: played
    at a quarter of the pace or 8x, the points are the live dashboard's, and the last one lies
    within the recording's length, not its playback's."""
    events = session(Plan(prompts=2))
    charts = []
    for speed in (0.25, 8.0):
        clock = FakeClock()
        app = ReplayApp(TraceReplay(events[0], events[1:], speed=speed, clock=clock), name="s")
        async with app.run_test(size=SIZE) as pilot:
            while not app.replay.finished:
                clock.t += 0.5
                app.tick()
                app.refresh_numbers()  # (the app's timer drains the buffer as often)
            await pilot.pause()
            played_s = clock.t - 100.0
            charts.append((list(app.model.tps_series), list(app.model.bandwidth_series)))
            assert played_s > 2 * app.replay.duration_s or speed > 1
    live = SpecdashApp(ScriptedSource.live_like(events))
    async with live.run_test(size=SIZE) as pilot:
        await pilot.pause()
        live.refresh_numbers()
        shown_live = (list(live.model.tps_series), list(live.model.bandwidth_series))
    assert charts[0] == charts[1] == shown_live and shown_live[0]
    duration_s = (events[-1].t_ns - events[0].t_ns) / 1e9
    assert 0 < shown_live[0][-1][0] <= duration_s
