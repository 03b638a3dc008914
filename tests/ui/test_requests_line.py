"""The divergence panel's requests line: one mark per prompt (exact, diverged, in flight, not
checked), so a batch's prompts each have a verdict on screen, not only the latest one."""

from __future__ import annotations

import pytest
from fake_events import ScriptedSource, fake_session, folded
from tiny_models import write_pair

from specdash.events import Divergence, Event, PromptDone, PromptStart
from specdash.runs.native import native_session
from specdash.settings import SessionSettings
from specdash.ui.app import SpecdashApp
from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.divergence import requests_text


def test_a_prompt_is_diverged_from_its_first_divergence_and_exact_only_when_done() -> None:
    events = fake_session(prompts=3, divergence_at=(1, 37))
    first = next(i for i, e in enumerate(events) if isinstance(e, Divergence))
    assert folded(events[: first + 1]).requests == {0: "exact", 1: "diverged"}
    last_done = max(i for i, e in enumerate(events) if isinstance(e, PromptDone))
    m = folded(events[:last_done])  # prompt 2 still running
    assert m.requests == {0: "exact", 1: "diverged", 2: "running"}
    assert requests_text(m, 60).plain == "requests ✓✗•  1 in flight"
    no_shadow = [e.model_copy(update={"shadow": False})
                 if e.kind == "session_start" else e for e in events]  # fmt: skip
    assert requests_text(folded(no_shadow), 60).plain == "requests ···"


def test_more_prompts_than_fit_show_the_latest() -> None:
    m = DashboardModel()
    for p in range(40):
        m.consume(PromptStart(t_ns=p + 1, prompt_index=p, prompt_tokens=3, text="x"))
    text = requests_text(m, 30).plain
    assert len(text) == 30 and text == "requests …" + "•" * 6 + "  40 in flight"
    assert requests_text(DashboardModel(), 30).plain == "requests –"


@pytest.fixture(scope="module")
def batch_events(tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    """A real native session of the tiny pair, 4 prompts decoded together."""
    model, draft, prompts = write_pair(tmp_path_factory.mktemp("tiny"))
    settings = SessionSettings(model=model, draft=draft, prompts=prompts, max_new_tokens=8,
                               k=3, batch=4)  # fmt: skip
    events: list[Event] = []
    native_session(settings, events.append).run()
    return events


def test_a_batch_shows_every_prompt_in_flight(batch_events) -> None:
    starts = [i for i, e in enumerate(batch_events) if isinstance(e, PromptStart)]
    first_done = next(i for i, e in enumerate(batch_events) if isinstance(e, PromptDone))
    assert sum(i < first_done for i in starts) == 4  # the batch: four prompts started together
    line = requests_text(folded(batch_events[:first_done]), 60).plain
    assert line == "requests ••••  4 in flight"


async def test_the_dashboard_shows_a_real_batch_sessions_verdicts(batch_events, tmp_path) -> None:
    done = [e for e in batch_events if isinstance(e, PromptDone)]
    marks = "".join("✓" if e.exact else "✗" for e in sorted(done, key=lambda e: e.prompt_index))
    app = SpecdashApp(ScriptedSource(batch_events), trace_dir=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.refresh_numbers()
        await pilot.pause()
        shown = str(app.query_one("#requests").render())
    assert len(done) == 8 and shown == f"requests {marks}"
    assert marks == "✓" * 8  # exact mode: every prompt of the batch equals its shadow
