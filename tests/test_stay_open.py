"""The dashboard's session stays open after its prompt set: the engine goes idle (its clock
stops) and waits for a typed prompt, which the controls then apply to; only `q` ends it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fake_events import ScriptedSource, fake_session
from tiny_models import write_pair

from specdash.controls import Controls
from specdash.events import ControlChange, Event, Idle, PromptDone, PromptStart, VerifyStep
from specdash.runs.native import native_session
from specdash.settings import SessionSettings
from specdash.ui.app import SpecdashApp

SIZE = (120, 40)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_pair(tmp_path_factory.mktemp("tiny"))


def test_runner_waits_idle_for_a_typed_prompt_and_ends_on_stop(pair):
    settings = SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=6,
                               k=3)  # fmt: skip
    controls = Controls.from_settings(settings, "torch", stay_open=True)
    stop = threading.Event()
    events: list[Event] = []
    idle = threading.Event()

    def sink(e: Event) -> None:
        events.append(e)
        if isinstance(e, Idle):
            idle.set()

    thread = threading.Thread(target=native_session(settings, sink, controls, stop).run)
    thread.start()
    assert idle.wait(120), "the prompt set ends in an idle engine"
    assert [e.kind for e in events].count("prompt_done") == 8 and events[-1].kind == "idle"
    assert thread.is_alive() and "summary" not in [e.kind for e in events]
    idle.clear()
    controls.update(k=5)  # a control changed while idle applies to the typed prompt
    controls.submit_prompt("def typed(x):")
    assert idle.wait(60)
    typed = [e for e in events if isinstance(e, PromptStart) and e.text == "def typed(x):"]
    assert len(typed) == 1 and typed[0].prompt_index == 8
    assert any(isinstance(e, PromptDone) and e.prompt_index == 8 for e in events)
    steps = [e for e in events if isinstance(e, VerifyStep) and e.prompt_index == 8]
    assert steps and all(s.k == 5 for s in steps)
    assert any(isinstance(e, ControlChange) and e.name == "k" for e in events)
    stop.set()
    thread.join(30)
    assert not thread.is_alive() and events[-1].kind == "summary"
    assert events[-1].prompts == 9


def test_without_staying_open_the_runner_ends_after_the_set(pair):
    settings = SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=4)
    events: list[Event] = []
    native_session(settings, events.append).run()
    assert events[-1].kind == "summary" and not any(isinstance(e, Idle) for e in events)


async def settle(pilot) -> None:
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


async def test_an_idle_session_takes_keys_and_a_typed_prompt():
    events = fake_session(seed=7)
    events.append(Idle(t_ns=events[-1].t_ns + 1))
    source = ScriptedSource(events, Controls.from_settings(SessionSettings(), stay_open=True))
    app = SpecdashApp(source)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        status = str(app.query_one("#status").render())
        assert "IDLE" in status and "/ prompt" in status and "FINISHED" not in status
        numbers = str(app.query_one("#throughput-numbers").render())
        assert (
            next(line for line in numbers.splitlines() if line.startswith("1 s")).split()[2]
            == "idle"
        )
        await pilot.press("s")
        assert source.controls.snapshot().speculation is False
        await pilot.press("slash")
        assert app.focused.id == "prompt"
        await pilot.press(*"hello", "enter")
        assert source.controls.take_user_prompt() == "hello"
        assert not any("finished" in n for n in notes)
        await pilot.press("n")
        assert not source.controls.take_next_prompt_request()
        assert "no prompt is running" in notes[-1]


async def test_keys_typed_right_after_slash_go_into_the_prompt():
    """A fast typist (or tmux send-keys) sends the text right behind `/`: the prompt line has
    the focus before the next key is handled, so no letter acts as a dashboard key."""
    from textual import events as textual_events

    source = ScriptedSource(fake_session(seed=7), Controls.from_settings(SessionSettings()))
    app = SpecdashApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for char in "/def e s/2":
            key = {"/": "slash", " ": "space"}.get(char, char)
            app.post_message(textual_events.Key(key, char))
        await pilot.pause()
        assert app.query_one("#prompt").value == "def e s/2"  # a typed / is text
        assert source.controls.snapshot() == Controls.from_settings(SessionSettings()).snapshot()
