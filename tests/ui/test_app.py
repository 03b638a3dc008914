"""Pilot tests: every key and palette command, the prompt box, trace export, faults."""

from __future__ import annotations

import time

import engine_standins
import pytest
from fake_events import ScriptedSource, fake_session
from textual.geometry import Region
from textual.widgets import Static

from specdash.events import (
    ControlChange,
    Divergence,
    EngineError,
    Idle,
    Summary,
    VerifyStep,
)
from specdash.settings import MAX_K, SessionSettings
from specdash.trace.jsonl import read_trace
from specdash.ui.app import CONTROL_ACTIONS, SpecdashApp
from specdash.ui.sources import EventBuffer, LiveSession
from specdash.ui.widgets.divergence import DivergenceDetail
from specdash.ui.widgets.help_screen import HelpScreen

SIZE = (160, 48)


def make_app(tmp_path, events=None, read_only=False) -> SpecdashApp:
    events = fake_session() if events is None else events
    source = ScriptedSource(events) if read_only else ScriptedSource.live_like(events)
    app = SpecdashApp(source, trace_dir=tmp_path)
    app.notes = []
    app.notify = lambda message, **kw: app.notes.append(message)
    return app


def state(app):
    return app.source.controls.snapshot()


async def wait_until(pilot, condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    assert condition()


async def settle(pilot):
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


CONTROL_EFFECTS = [
    ("g", "GEMM backend", lambda app: state(app).gemm_backend == "torch"),
    ("s", "spec on/off", lambda app: state(app).speculation is False),
    ("plus", "one more token", lambda app: state(app).k == 5),
    ("minus", "one token fewer", lambda app: state(app).k == 3),
    ("v", "verify mode", lambda app: state(app).verify_mode == "fast"),
    ("space", "pause", lambda app: state(app).paused is True),
    ("n", "next prompt", lambda app: app.source.controls.take_next_prompt_request()),
]
"""A control's key, its palette title and what either does to the session's controls."""
KEY_EFFECTS = [(key, effect) for key, _, effect in CONTROL_EFFECTS]
PALETTE_EFFECTS = [(title, effect) for _, title, effect in CONTROL_EFFECTS] + [
    ("export trace", lambda app: app.trace_writer is not None),
    ("type prompt", lambda app: app.focused.id == "prompt"),
    ("glossary", lambda app: isinstance(app.screen, HelpScreen)),
]


@pytest.mark.parametrize(("key", "effect"), KEY_EFFECTS, ids=[k for k, _ in KEY_EFFECTS])
async def test_control_key(tmp_path, key, effect):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(key)
        assert effect(app)
        assert app.notes, "every control change is acknowledged"


async def test_keys_toggle_back_and_gemm_cycles(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("g", "g", "s", "s", "v", "v", "space", "space")
        assert state(app).gemm_backend == "rowwise"
        assert state(app).speculation and state(app).verify_mode == "exact"
        assert not state(app).paused


async def test_k_stays_in_range(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(*["minus"] * 5)
        assert state(app).k == 1
        await pilot.press(*["plus"] * (MAX_K + 3))
        assert state(app).k == MAX_K
        assert any("k stays in" in n for n in app.notes)


@pytest.mark.parametrize(("title", "effect"), PALETTE_EFFECTS)
async def test_palette_command(tmp_path, title, effect):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*title)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert effect(app)


def test_every_key_has_a_palette_entry_and_a_test():
    palette_tested = {"cycle_gemm", "toggle_speculation", "k_up", "k_down", "toggle_verify"}
    palette_tested |= {"toggle_pause", "next_prompt", "export_trace", "type_prompt", "help"}
    actions = {action for _, action, _, _ in CONTROL_ACTIONS}
    assert actions - {"quit"} == palette_tested  # quit is Textual's own palette entry


async def test_help_opens_and_closes(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_panels_keep_updating_under_a_modal(tmp_path):
    """Events keep coming while help or a divergence detail is open."""
    app = make_app(tmp_path, events=fake_session(prompts=1))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        for event in fake_session(prompts=2)[-50:]:
            app.buffer.put(event)
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "2 done" in str(app.dashboard.query_one("#status").render())


async def test_quit_exits_zero_and_stops_the_source(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    assert app.source.stopped


async def test_typed_prompt_is_queued(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        assert app.focused.id == "prompt"
        await pilot.press(*"why q?", "enter")
        assert app.source.controls.take_user_prompt() == "why q?"
        assert app.focused.id == "divergence-table"
        await pilot.press("slash", "x", "escape")
        assert app.focused.id == "divergence-table"
        assert app.source.controls.take_user_prompt() is None


async def test_no_typed_prompt_after_the_session_finished(tmp_path):
    from specdash.events import Summary

    summary = Summary(
        prompts=2,
        exact_prompts=1,
        new_tokens=9,
        seconds=1.0,
        tokens_per_s=9.0,
        mean_accepted_length=3.0,
        acceptance_rate=0.5,
        verify_steps=3,
        divergences=1,
    )
    app = make_app(tmp_path, events=[*fake_session(), summary])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", "x", "enter")
        assert app.source.controls.take_user_prompt() is None
        assert any("finished" in n for n in app.notes)


async def test_divergence_detail_on_enter(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DivergenceDetail)
        assert app.screen.divergence.position == 37
        await pilot.press("escape")
        assert not isinstance(app.screen, DivergenceDetail)


async def test_divergence_detail_says_why_the_cause_names_an_earlier_token(tmp_path):
    events = fake_session()
    i, d = next((i, e) for i, e in enumerate(events) if isinstance(e, Divergence))
    cause = d.root_cause.model_copy(update={"origin_position": 35})
    events[i] = d.model_copy(update={"root_cause": cause})
    app = make_app(tmp_path, events)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await pilot.pause()
        text = " ".join(str(app.screen.query_one(Static).render()).split())
        assert (
            "the bits first differed at token 35, an earlier row of the same verify step; "
            "they reached token 37 through attention or the GDN state"
        ) in text


async def test_export_trace_writes_the_whole_session_and_keeps_recording(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        app.buffer.put(EngineError(message="CUDA error: out of memory"))
        await settle(pilot)
        assert app.trace_writer is None, "an engine error closes the trace"
        error_panel = app.query_one("#error")
        assert error_panel.display
        assert "CUDA error: out of memory" in str(error_panel.render())
        assert "trace closed" in str(error_panel.render())
    (path,) = tmp_path.glob("specdash-*.jsonl")
    header, events, warnings = read_trace(path)
    assert not warnings
    kinds = [e.kind for e in events]
    assert kinds.count("verify_step") == 60
    assert "control" in kinds and kinds[-1] == "error"


async def test_the_status_bar_names_the_trace_being_recorded_within_100_columns(tmp_path):
    deep = tmp_path / "a" / "rather" / "deep" / "directory" / "for" / "traces"
    deep.mkdir(parents=True)
    app = make_app(deep, events=[*fake_session(), Idle(t_ns=3_000_000_000)])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await settle(pilot)
        (path,) = deep.glob("specdash-*.jsonl")
        first_line = str(app.query_one("#status").render()).splitlines()[0]
        assert f"recording {path.name}" in first_line and str(deep) not in first_line
        # the line is cut at the terminal's width (less its padding), after the trace's name
        assert first_line.index(path.name) + len(path.name) <= 100 - 2, first_line
        assert str(path) in app.notes[-1]  # the toast has the whole path


def sglang_on_an_h100() -> list:
    """`fake_session` with the long names of a real GPU session in its header (a model path,
    the card as CUDA names it, the GEMM kernel beside its backend), idle after its prompts."""
    events = fake_session()
    header = events[0]
    config = {**header.config, "model": "/models/Qwen/Qwen3.5-27B-FP8", "drafter": "nextn",
              "gemm_kernel": "specdash-triton"}  # fmt: skip
    device = "cuda:0 NVIDIA H100 80GB HBM3"
    events[0] = header.model_copy(update={"config": config, "device": device, "engine": "sglang"})
    return [*events, Idle(t_ns=events[-1].t_ns + 1)]


def status_lines(app, width: int) -> list[str]:
    """The status bar's two lines as the terminal shows them, padding included."""
    bar = app.query_one("#status")
    return [s.text for s in bar.render_lines(Region(0, 0, width, 2))]


@pytest.mark.parametrize("width", [100, 120, 160])
async def test_status_lines_keep_what_matters_at_every_width(tmp_path, width):
    """With the longest names a session has (a GPU's, a trace exported into a deep directory,
    a change waiting for the next step), every status line keeps the verdict, the counts,
    the trace's file name and every setting with the device's card, whole: the labels and
    words around them shorten first, and 160 columns show everything in full."""
    deep = tmp_path / "a" / "rather" / "deep" / "directory" / "for" / "traces"
    deep.mkdir(parents=True)
    app = make_app(deep, events=sglang_on_an_h100())
    async with app.run_test(size=(width, 30)) as pilot:
        await settle(pilot)
        await pilot.press("e", "plus")
        await settle(pilot)
        (path,) = deep.glob("specdash-*.jsonl")
        first, second = status_lines(app, width)
        for line in (first, second):
            assert len(line) == width and line.endswith(" ") and "…" not in line, line
        assert "DIVERGED at token 37" in first and "2 done, 1 exact" in first
        assert path.name in first and str(deep) not in first
        for setting in ("sglang", "Qwen3.5-27B-FP8", "nextn", "k 4→5", "verify exact",
                        "specdash-triton", "H100"):  # fmt: skip
            assert setting in second, second
        if width == 160:
            assert "(prompt 1)" in first and "(session)" in first and "/ prompt" in first
            assert "engine sglang  model Qwen3.5-27B-FP8  drafter nextn  k 4→5" in second
            assert "GEMM specdash-triton (rowwise)  device cuda:0 NVIDIA H100 80GB HBM3" in second


@pytest.mark.parametrize("width", [100, 160])
async def test_a_closed_trace_keeps_its_name_on_the_status_bar(tmp_path, width):
    """The session finishes while it records: the bar then says the trace closed and holds
    the whole session, naming its file whole (in few words where the note is too long),
    never a path cut at the edge."""
    from specdash.trace.jsonl import TraceWriter

    deep = tmp_path / "a" / "rather" / "deep" / "directory" / "for" / "traces"
    deep.mkdir(parents=True)
    path = deep / "specdash-20261207-151800.jsonl"  # as long as an exported trace's name
    summary = Summary(t_ns=10**10, prompts=2, exact_prompts=1, new_tokens=200, seconds=1.2,
                      tokens_per_s=166.0, mean_accepted_length=3.5, acceptance_rate=0.6,
                      verify_steps=60, divergences=1)  # fmt: skip
    events = [*fake_session(), summary]
    app = SpecdashApp(ScriptedSource.live_like(events), deep, TraceWriter(path))
    async with app.run_test(size=(width, 30)) as pilot:
        await settle(pilot)
        assert app.model.finished and app.trace_writer is None  # closed with the session
        first, _ = status_lines(app, width)
        assert "FINISHED" in first and "2 done, 1 exact" in first and path.name in first, first
        assert str(deep) not in first and "…" not in first
        assert "closed" in first and "incomplete" not in first  # the whole session is in it


async def test_non_fatal_engine_error_keeps_recording(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        app.buffer.put(EngineError(message="typed prompt is empty", fatal=False))
        await settle(pilot)
        assert app.trace_writer is not None
        assert "session continues" in str(app.query_one("#error").render())


async def test_a_timer_tick_while_quitting_draws_nothing(tmp_path):
    """Under load a UI tick can land after the screens are gone (drawing then raises
    IndexError): it records what arrived and draws nothing."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
    revision = app.model.revision
    app.buffer.put(EngineError(message="late", fatal=False))
    app.refresh_numbers()
    app.refresh_plots()
    assert app.model.revision > revision


async def test_replay_source_is_read_only(tmp_path):
    app = make_app(tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("g", "plus", "space", "n", "slash")
        assert app.notes and all("read-only" in n for n in app.notes)
        assert app.focused.id != "prompt"


async def test_a_tiny_terminal_with_the_error_panel_open_shows_only_the_too_small_line(tmp_path):
    """40x10: an open error panel and the status bar would take the rows the line needs."""
    app = make_app(tmp_path)
    async with app.run_test(size=(40, 10)) as pilot:
        await settle(pilot)
        app.buffer.put(EngineError(message="RuntimeError: weights on fire " * 4))
        app.refresh_numbers()
        await pilot.pause(0.3)
        line = app.query_one("#too-small")
        footer = app.query_one("Footer")
        assert "terminal too small: 40x10" in str(line.render())
        assert line.region.height >= 1 and not line.region.overlaps(footer.region)
        assert line.region.bottom <= 10
        for hidden in ("#status", "#error", "#main", "#prompt"):
            assert not app.query_one(hidden).display, hidden
        await pilot.resize_terminal(*SIZE)
        await pilot.pause(0.3)
        assert not line.display
        for shown in ("#status", "#error", "#main", "#prompt"):
            assert app.query_one(shown).display, shown


async def test_terminal_too_small_shows_a_message(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(pilot)
        assert app.query_one("#too-small").display
        assert not app.query_one("#main").display
        assert "terminal too small: 60x20" in str(app.query_one("#too-small").render())
        await pilot.resize_terminal(*SIZE)
        await pilot.pause(0.3)
        assert app.query_one("#main").display


async def test_pause_shows_at_once(tmp_path):
    """The engine blocks while paused, so the status bar follows the request, not an event."""
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("space")
        await settle(pilot)
        assert "PAUSED" in str(app.query_one("#status").render())
        await pilot.press("space")
        await settle(pilot)
        assert "PAUSED" not in str(app.query_one("#status").render())


async def test_controls_asked_while_idle_show_at_once_until_applied(tmp_path):
    """An idle engine takes no step, so a change waits: the status bar says what was asked at
    once ("k 4→6"), and the plain value once the engine reports it applied."""
    app = make_app(tmp_path, events=[*fake_session(), Idle(t_ns=3_000_000_000)])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("plus", "plus", "v", "s")
        status = str(app.query_one("#status").render())
        assert "k 4→6" in status and "verify exact→fast" in status
        assert "drafter model→off" in status and "(at the next step)" in status
        for name, old, new in (("k", "4", "6"), ("verify_mode", "exact", "fast"),
                               ("speculation", "True", "False")):  # fmt: skip
            app.buffer.put(ControlChange(t_ns=3_100_000_000, name=name, old=old, new=new,
                                         applied_step=60))  # fmt: skip
        step = next(e for e in fake_session() if isinstance(e, VerifyStep))
        app.buffer.put(
            step.model_copy(update={"k": 6, "verify_mode": "fast", "t_ns": 3_200_000_000})
        )
        await settle(pilot)
        status = str(app.query_one("#status").render())
        assert "k 6 " in status and "verify fast " in status and "→" not in status
        assert "(at the next step)" not in status


async def test_a_refused_change_leaves_the_status_bar(tmp_path):
    app = make_app(tmp_path, events=[*fake_session(), Idle(t_ns=3_000_000_000)])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("v")
        assert "verify exact→fast" in str(app.query_one("#status").render())
        app.buffer.put(EngineError(message="fast verify is not offered here", fatal=False))
        await settle(pilot)
        assert "→" not in str(app.query_one("#status").render())


async def test_status_bar_shows_verdict(tmp_path):
    app = make_app(tmp_path, events=fake_session(divergence_at=None))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "EXACT so far" in str(app.query_one("#status").render())


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (engine_standins.raise_runtime_error, "RuntimeError: weights on fire"),
        # a SystemExit must not end the engine without a word either
        (engine_standins.exit_3, "SystemExit: 3"),
    ],
)
def test_live_session_reports_an_engine_exception(run, message):
    buffer = EventBuffer()
    session = LiveSession(SessionSettings(), telemetry=False, run=run)
    session.start(buffer.put)
    session.stop()
    (event,) = buffer.drain()
    assert isinstance(event, EngineError) and event.message == message


async def test_an_engine_error_is_not_doubled_by_the_engine_ending(tmp_path):
    run = engine_standins.raise_runtime_error
    app = SpecdashApp(LiveSession(SessionSettings(), telemetry=False, run=run), trace_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.source.running)
        await settle(pilot)
        assert [e.message for e in app.model.errors] == ["RuntimeError: weights on fire"]


async def test_dashboard_says_when_the_engine_ends_unfinished(tmp_path):
    """A session whose engine is gone with neither a summary nor an error is reported, not
    shown as a dashboard that silently stops moving."""
    run = engine_standins.five_events_then_return
    app = SpecdashApp(LiveSession(SessionSettings(), telemetry=False, run=run), trace_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.source.running)
        await settle(pilot)
        (error,) = app.model.errors
        assert error.message == "the engine ended without finishing the session"
        assert "engine ended" in str(app.query_one("ErrorPanel").render())


def test_live_session_stop_ends_the_engine():
    buffer = EventBuffer()
    session = LiveSession(SessionSettings(k=7), telemetry=False, run=engine_standins.wait_for_stop)
    assert session.controls.snapshot().k == 7
    session.start(buffer.put)
    deadline = time.monotonic() + 30
    while not buffer.drain() and time.monotonic() < deadline:  # the child is running
        time.sleep(0.05)
    assert session.running
    session.stop()
    assert not session.running and not session._engine._process.is_alive()


async def test_divergence_table_follows_a_model_reset(tmp_path):
    """A replay seek rebuilds the model; the table must not keep stale rows."""
    from specdash.ui.dashboard_model import DashboardModel

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one("#divergence-table")
        assert table.row_count == 1
        app.model = DashboardModel()
        for event in fake_session(divergence_at=None):
            app.buffer.put(event)
        await settle(pilot)
        assert table.row_count == 0


async def test_trace_given_up_front_records_from_the_header(tmp_path):
    """`specdash --trace PATH`: events before session_start (GPU samples) are kept too."""
    from specdash.events import TelemetrySample
    from specdash.trace.jsonl import TraceWriter

    events = fake_session()
    early = TelemetrySample(t_ns=1, window_s=0.0, source="none", note="no NVIDIA GPU")
    path = tmp_path / "run.jsonl"
    app = SpecdashApp(ScriptedSource.live_like([early, *events]), tmp_path, TraceWriter(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.trace_writer is not None  # no summary yet: still recording; quit closes it
    header, recorded, _ = read_trace(path)
    assert header.model_copy(update={"git_revision": None}) == events[0]
    assert recorded[0] == early.model_copy(update={"t_ns": header.t_ns})  # at the header's time
    assert recorded[1:] == events[1:]


async def test_unwritable_export_directory_is_a_notification(tmp_path):
    app = make_app(tmp_path / "missing")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        assert app.trace_writer is None
        assert any("cannot export trace" in n for n in app.notes)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["-k", "99"], 2, "argument -k: 99 is out of range (1..16)"),
        (["run", "--trace", "/nonexistent/dir/t.jsonl"], 4, "cannot write trace"),
        (["--engine", "sglang", "--sglang-arg", "no_value"], 2, "expected KEY=VALUE"),
    ],
)
def test_dashboard_entry_rejects_bad_input_before_the_ui(capsys, argv, code, message):
    from specdash.cli import main

    try:
        got = main(argv)
    except SystemExit as e:  # argparse's own flag errors
        got = e.code
    assert got == code
    line, *rest = capsys.readouterr().err.splitlines()
    assert line.startswith("specdash: error: ") and message in line
    hint = f"hint: `specdash{' run' * (argv[0] == 'run')} --help` lists every flag"
    assert rest == ([hint] if message.startswith("argument") else [])  # a flag error: + the hint


SGLANG_FLAGS = [
    "--engine",
    "sglang",
    "--model",
    "/models/m",
    "--speculative-algorithm",
    "EAGLE3",
    "--sglang-arg",
    "mem_fraction_static=0.3",
    "--sglang-shadow",
    "sequential",
    "--force-patches",
]


@pytest.mark.parametrize("prefix", [[], ["run"]], ids=["specdash", "specdash run"])
def test_dashboard_gets_the_sglang_options_headless_gets(prefix):
    """Same flags, same `session_options`, same `run_engine` call as `run --headless`, with
    SGLang's log named here (the child's process id would name another file)."""
    from dataclasses import replace

    from specdash.cli import build_parser
    from specdash.cli.dashboard import dashboard_app
    from specdash.cli.session_args import session_options, settings_from_args
    from specdash.runs.sglang.args import SGLangOptions
    from specdash.runs.sglang.process import log_file_beside

    args = build_parser().parse_args([*prefix, *SGLANG_FLAGS])
    expected = SGLangOptions("EAGLE3", {"mem_fraction_static": 0.3}, "sequential", True)
    headless_args = build_parser().parse_args(["run", "--headless", *SGLANG_FLAGS])
    settings = settings_from_args(headless_args)
    assert session_options(settings, headless_args) == expected
    source = dashboard_app(args).source
    assert source.engine_options == expected
    pinned = replace(expected, log_file=log_file_beside(settings))
    assert str(pinned.log_file) in source.loading  # the loading line names the log it writes
    session = LiveSession(
        source.settings, False, source.engine_options, run=engine_standins.report_arguments
    )
    buffer = EventBuffer()
    session.start(buffer.put)
    session.stop()
    (event,) = buffer.drain()
    assert event.message == repr(("sglang", pinned, session.controls.snapshot()))


def test_native_engine_gets_no_sglang_options_and_keeps_sigquit():
    import signal

    from specdash.cli import build_parser
    from specdash.cli.dashboard import dashboard_app

    source = dashboard_app(build_parser().parse_args([])).source
    assert source.engine_options is None
    session = LiveSession(
        source.settings, False, source.engine_options, run=engine_standins.report_arguments
    )
    before = signal.getsignal(signal.SIGQUIT)
    buffer = EventBuffer()
    session.start(buffer.put)
    session.stop()
    assert signal.getsignal(signal.SIGQUIT) is before
    (event,) = buffer.drain()
    assert event.message.startswith("('native', None, ")


@pytest.mark.parametrize("typed", ["", "   "])
async def test_an_empty_prompt_says_so_and_the_line_stays_open(tmp_path, typed):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *(["space"] * len(typed)), "enter")
        await pilot.pause()
        assert app.notes[-1] == "the prompt is empty: type one, then Enter (Esc leaves)"
        assert app.query_one("#prompt").has_focus
        await pilot.press("d", "enter")
        await pilot.pause()
        assert app.notes[-1].startswith("prompt queued")
        assert not app.query_one("#prompt").has_focus


async def test_a_multi_line_paste_says_only_its_first_line_is_kept(tmp_path):
    from textual import events

    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        prompt = app.query_one("#prompt")
        prompt.post_message(events.Paste("def f(x):\n    return x\n"))
        await pilot.pause()
        assert prompt.value == "def f(x):"
        assert app.notes[-1].startswith("pasted 2 lines: the prompt line keeps the first")
        notes = len(app.notes)
        prompt.post_message(events.Paste(" + 1"))
        await pilot.pause()
        assert prompt.value == "def f(x): + 1" and len(app.notes) == notes  # one line: no note
