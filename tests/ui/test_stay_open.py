"""The dashboard's session stays open after its prompt set: the engine goes idle (its clock
stops) and waits for a typed prompt, which the controls then apply to; only `q` ends it."""

from __future__ import annotations

import threading
import tracemalloc

from fake_events import ScriptedSource, fake_session

from specdash.controls import Controls
from specdash.events import (
    ControlChange,
    Event,
    Idle,
    Prefill,
    PromptDone,
    PromptStart,
    Token,
    VerifyStep,
)
from specdash.runs.native import native_session
from specdash.settings import SessionSettings
from specdash.ui.app import SpecdashApp
from specdash.ui.dashboard_model import MAX_REQUESTS

SIZE = (120, 40)


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


def long_prompts(start: int, count: int, t0_ns: int) -> list[Event]:
    """`count` prompts of 16 kB of text each, all different (typed by hand, say), each with
    its prefill, four tokens and its verdict."""
    events: list[Event] = []
    t = t0_ns
    for i in range(start, start + count):
        text = f"prompt {i}: " + "".join(chr(0x4E00 + (i * 7 + j) % 20000) for j in range(5300))
        t += 1000
        events.append(PromptStart(t_ns=t, prompt_index=i, prompt_tokens=5300, text=text))
        events.append(Prefill(t_ns=t, prompt_index=i, tokens=5300, seconds=0.01, run="spec"))
        for pos in range(4):
            events.append(Token(t_ns=t + pos, prompt_index=i, position=pos, token_id=pos,
                                logprob=-0.5, text="x", source="decode", step=pos))  # fmt: skip
        events.append(PromptDone(t_ns=t + 9, prompt_index=i, new_tokens=4, seconds=0.01,
                                 verify_steps=0, accepted_drafts=0, proposed_drafts=0,
                                 exact=True))  # fmt: skip
    return events


async def test_a_day_of_long_prompts_keeps_the_dashboard_flat():
    """Every prompt's text passes through the dashboard (its model, its bounded event log for
    a mid-session export): after the budgets fill, memory stays where it is instead of
    growing with each prompt (~18 kB one: 1,000 more would be ~17 MB)."""
    header = fake_session()[0]
    app = SpecdashApp(ScriptedSource.live_like([header]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        batch = 500

        async def feed(first: int, count: int) -> None:
            for start in range(first, first + count, batch):
                for event in long_prompts(start, batch, header.t_ns + start * 10_000):
                    app.buffer.put(event)
                app.refresh_numbers()
            await pilot.pause()

        tracemalloc.start()
        try:
            await feed(0, 1000)  # past every budget
            before = tracemalloc.get_traced_memory()[0]
            await feed(1000, 1000)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert app.buffer.dropped == 0 and app.model.prompts_done == 2000
        assert len(app.model.requests) <= MAX_REQUESTS
        assert grown < 4 * 2**20, grown
        assert app.recorder.log.gap_note()  # what left is counted, for an export to say
