"""What a first-time user sees: the loading state, no verdict before the first compared
token, palette entries with the keys as shown, toasts in words, controls that say when they
no longer apply, a glossary that scrolls at once, a replay footer without refused keys."""

from __future__ import annotations

from fake_events import ScriptedSource, fake_session
from textual.geometry import Region

from specdash.controls import Controls
from specdash.events import EngineError, PromptStart, SessionStart, StartPhase, Summary
from specdash.runs.runner import loading_label
from specdash.settings import SessionSettings
from specdash.ui.app import SpecdashApp
from specdash.ui.replay_app import ReplayApp
from specdash.ui.sources import Sink
from specdash.ui.widgets.help_screen import HelpScreen

SIZE = (100, 30)


class Loading:
    """A live source whose engine is still loading its weights: no event yet."""

    def __init__(self, settings: SessionSettings) -> None:
        self.loading = loading_label(settings)  # what LiveSession tells the dashboard
        self.controls = Controls.from_settings(settings)

    def start(self, sink: Sink) -> None:
        self.sink = sink

    def stop(self) -> None:
        pass


def status(app: SpecdashApp) -> str:
    return str(app.dashboard.query_one("#status").render())


def noted(app: SpecdashApp) -> list[str]:
    app.notes = []
    app.notify = lambda message, **kw: app.notes.append(message)
    return app.notes


async def test_loading_says_what_and_how_long_and_gives_no_verdict() -> None:
    now = [100.0]
    app = SpecdashApp(Loading(SessionSettings()))
    app.clock = lambda: now[0]
    app._phase = ("loading", 100.0)
    async with app.run_test(size=SIZE) as pilot:
        now[0] = 107.2
        app.refresh_numbers()
        await pilot.pause()
        text = status(app)
        assert "LOADING" in text
        assert "loading embedded target + embedded draft on cpu (native engine) … 7 s" in text
        assert "EXACT" not in text and "engine ?" not in text

        config = {"engine": "native", "model": "m", "drafter": "model", "k": 4, "shadow": True}
        app.source.sink(SessionStart(t_ns=109_000_000_000, config=config, versions={},
                                     device="cpu", gemm_backend="t"))  # fmt: skip
        app.source.sink(PromptStart(t_ns=110_000_000_000, prompt_index=0, prompt_tokens=4512,
                                    text="x"))  # fmt: skip
        now[0] = 110.0
        app.refresh_numbers()
        await pilot.pause()
        now[0] = 113.0
        app.refresh_numbers()  # no new event: the seconds still count
        await pilot.pause()
        text = status(app)
        assert "NO VERDICT YET" in text and "EXACT" not in text
        assert "prefill prompt 0, 4,512 tokens … 3 s" in text


async def test_loading_shows_the_engine_start_phase_until_the_session_starts() -> None:
    app = SpecdashApp(Loading(SessionSettings()))
    async with app.run_test(size=SIZE) as pilot:
        phase = "capture target verify CUDA graphs"
        app.source.sink(StartPhase(engine="spec", phase=phase, done=3, total=8, since_start_s=41))
        app.refresh_numbers()
        await pilot.pause()
        # at 100 columns the hint beside it in its short form, not cut at the edge
        assert f"spec engine: {phase} 3/8 · verdict and numbers once a prompt runs" in status(app)
        config = {"engine": "sglang", "model": "m", "drafter": "ngram", "k": 3, "shadow": True}
        app.source.sink(SessionStart(config=config, versions={}, device="cuda", gemm_backend="t"))
        app.refresh_numbers()
        await pilot.pause()
        assert "LOADING" not in status(app) and phase not in status(app)


async def test_verdict_after_the_first_compared_token_and_without_a_shadow() -> None:
    events = fake_session(prompts=1, divergence_at=None)
    app = SpecdashApp(ScriptedSource.live_like(events))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        assert "EXACT so far" in status(app)
    header = events[0].model_copy(update={"shadow": False})
    app = SpecdashApp(ScriptedSource.live_like([header, *events[1:]]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        assert "NOT CHECKED (no shadow)" in status(app)


async def test_without_a_shadow_no_shadow_rate_and_no_speedup_are_shown() -> None:
    events = fake_session(prompts=1, divergence_at=None)
    header = events[0].model_copy(update={"shadow": False})
    app = SpecdashApp(ScriptedSource.live_like([header, *events[1:]]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        app.refresh_plots()
        numbers = str(app.dashboard.query_one("#throughput-numbers").render())
        header, *rows = numbers.splitlines()
        assert header.split()[3:] == ["–", "(--no-shadow)"]  # no shadow, and why
        assert all(row.split()[-2:] == ["–", "–"] for row in rows), numbers
        assert app.model.session_steps.shadow_tps is None
        assert all(point[2] == 0.0 for point in app.model.tps_series)
        key = str(app.dashboard.query_one("#throughput-plot .chart-key").render())
        assert "spec" in key and "shadow" not in key


async def test_an_engine_error_before_the_start_ends_loading() -> None:
    app = SpecdashApp(Loading(SessionSettings()))
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_numbers()
        await pilot.pause()
        assert "LOADING" in status(app)
        app.source.sink(EngineError(message="/m: checkpoint directory does not exist"))
        app.refresh_numbers()
        await pilot.pause()
        text = status(app)
        assert "LOADING" not in text and " FAILED " in text
        assert (
            "loading embedded target + embedded draft on cpu (native engine): stopped by an "
            in text
        )


async def test_palette_shows_keys_as_typed() -> None:
    app = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with app.run_test(size=SIZE):
        titles = [c.title for c in app.get_system_commands(app.screen)]
    assert "Keys and a glossary of every metric (?)" in titles
    assert "Draft one more token per verify step (next step) (+)" in titles
    assert "Draft one token fewer per verify step (next step) (-)" in titles
    assert "Type a prompt of your own (/)" in titles
    assert not [t for t in titles if "question_mark" in t or "plus" in t or "slash" in t]


async def test_toasts_say_on_off_and_stop_promising_after_the_session() -> None:
    events = fake_session(prompts=1)
    app = SpecdashApp(ScriptedSource.live_like(events))
    notes = noted(app)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        await pilot.press("s", "space", "plus", "v")
        assert notes == [
            "speculation off (applies at the next step)",
            "pause on (applies at the next step)",
            "k → 5 (applies at the next step)",
            "verify mode → fast (applies at the next step)",
        ]
        notes.clear()
        app.buffer.put(
            Summary(
                prompts=1,
                exact_prompts=1,
                new_tokens=1,
                seconds=1.0,
                tokens_per_s=1.0,
                mean_accepted_length=1.0,
                acceptance_rate=0.0,
                verify_steps=1,
                divergences=0,
            )
        )
        app.refresh_numbers()
        await pilot.press("s", "g", "n")
        assert notes and all("has finished: there is no next step" in n for n in notes)


async def test_glossary_scrolls_without_tab() -> None:
    app = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen) and app.focused.id == "help"
        await pilot.press("pagedown")
        await pilot.pause()
        assert app.screen.query_one("#help").scroll_y > 0


async def test_replay_footer_lists_only_what_replay_does(tmp_path) -> None:
    from synthetic_trace import Plan, session

    from specdash.trace.replay import TraceReplay

    events = session(Plan(prompts=1))
    app = ReplayApp(TraceReplay(events[0], events[1:]), name="x")
    async with app.run_test(size=(160, 48)):
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
    assert {"space", "full_stop", "comma", "0"} <= shown
    assert not shown & {"g", "s", "plus", "minus", "v", "slash"}


async def test_long_status_notes_are_cut_not_wrapped_at_100x30() -> None:
    app = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.recorder.note = "trace closed after the session finished: /" + "x" * 120
        app._shown_revision = -1  # as a closing trace leaves it
        app.refresh_numbers()
        await pilot.pause()
        bar = app.dashboard.query_one("#status")
        first, second = (s.text for s in bar.render_lines(Region(0, 0, bar.size.width, 2)))
    assert "trace closed" in first and "x" * 30 not in first  # cut at the edge
    assert second.strip().startswith("engine native") and "device cpu" in second


def footer_keys_whole(app: SpecdashApp) -> set[str]:
    """The footer's keys, after checking each lies whole within the screen, none under the
    next (the palette's key is docked right, over whatever reaches it)."""
    from textual.widgets._footer import FooterKey

    keys = sorted(app.query(FooterKey), key=lambda k: k.region.x)
    for key, after in zip(keys, keys[1:], strict=False):
        assert key.region.right <= after.region.x, (key.description, after.description)
    assert keys[-1].region.right <= app.size.width
    assert all(k.region.width >= k.get_content_width(app.size, app.size) for k in keys)
    return {k.key_display for k in keys}


async def test_both_footers_show_every_key_whole_at_100_columns() -> None:
    from synthetic_trace import Plan, session

    from specdash.trace.replay import TraceReplay

    events = session(Plan(prompts=1))
    replay = ReplayApp(TraceReplay(events[0], events[1:]), name="x")
    async with replay.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert {"space", ".", ",", "[", "]", "<", ">", "0", "^p"} <= footer_keys_whole(replay)
    live = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with live.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert {"g", "s", "+/-", "v", "space", "e", "/", "^p"} <= footer_keys_whole(live)
