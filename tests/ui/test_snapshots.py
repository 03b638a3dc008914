"""SVG snapshots of the dashboard over the seeded fake event stream (no engine, no clock,
explicit plot colours). Update with `pytest tests/ui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest
from fake_events import ScriptedSource, fake_session

from specdash.events import EngineError
from specdash.ui.app import SpecdashApp

SIZE = (160, 48)


def dashboard(telemetry: str = "gpm", extra=()) -> SpecdashApp:
    events = fake_session(seed=7, telemetry=telemetry) + list(extra)
    return SpecdashApp(ScriptedSource.live_like(events))


async def settle(pilot) -> None:
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


@pytest.mark.parametrize("telemetry", ["gpm", "mem_busy", "none"])
def test_dashboard(snap_compare, telemetry):
    assert snap_compare(dashboard(telemetry), terminal_size=SIZE, run_before=settle)


def test_help_screen(snap_compare):
    assert snap_compare(dashboard(), press=["question_mark"], terminal_size=SIZE, run_before=settle)


def test_divergence_detail(snap_compare):
    assert snap_compare(dashboard(), press=["enter"], terminal_size=SIZE, run_before=settle)


def test_engine_error_panel(snap_compare):
    app = dashboard(
        extra=[EngineError(t_ns=3_000_000_000, message="RuntimeError: weights on fire")]
    )
    assert snap_compare(app, terminal_size=SIZE, run_before=settle)


def test_terminal_too_small(snap_compare):
    assert snap_compare(dashboard(), terminal_size=(70, 20), run_before=settle)


MINIMUM = (100, 30)
"""The documented minimum: plots drawn bare, the footer starts with help and quit, the
divergence table keeps its columns narrow."""


def test_dashboard_minimum_size(snap_compare):
    assert snap_compare(dashboard(), terminal_size=MINIMUM, run_before=settle)


LAPTOP = (120, 40)


def test_dashboard_laptop_size(snap_compare):
    assert snap_compare(dashboard(), terminal_size=LAPTOP, run_before=settle)


def test_typing_a_prompt_minimum_size(snap_compare):
    """The footer while a prompt is typed: the prompt's keys, not the dashboard's."""
    assert snap_compare(
        dashboard(), press=["slash", "h", "i"], terminal_size=MINIMUM, run_before=settle
    )


def test_help_screen_minimum_size(snap_compare):
    assert snap_compare(
        dashboard(), press=["question_mark"], terminal_size=MINIMUM, run_before=settle
    )


class StartingSGLang:
    """A live SGLang session whose two engines are still starting: start phases, no header."""

    def __init__(self) -> None:
        from pathlib import Path

        from specdash.controls import Controls
        from specdash.runs.runner import loading_label
        from specdash.settings import SessionSettings

        settings = SessionSettings(
            engine="sglang", model=Path("/models/Qwen3.5-27B"), trace=Path("/tmp/session.jsonl")
        )
        self.loading = loading_label(settings)  # what LiveSession tells the dashboard
        self.controls = Controls.from_settings(settings)

    def start(self, sink) -> None:
        from specdash.events import StartPhase

        sink(StartPhase(engine="shadow", phase="load weights", since_start_s=20.1))
        sink(StartPhase(engine="spec", phase="capture target verify CUDA graphs", done=3,
                        total=8, since_start_s=24.0))  # fmt: skip

    def stop(self) -> None:
        pass


def test_sglang_engines_starting(snap_compare):
    app = SpecdashApp(StartingSGLang())
    app.clock = lambda: 142.0
    app._phase = ("loading", 100.0)
    assert snap_compare(app, terminal_size=SIZE, run_before=settle)
