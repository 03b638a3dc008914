"""Freed C-heap memory goes back to the OS after each prefill, so RSS does not stay at the
longest prompt's high-water mark."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from tiny_models import write_pair

from specdash.controls import Controls
from specdash.events import Event, PromptDone
from specdash.runs import native, session
from specdash.runs.heap import trim_heap
from specdash.settings import SessionSettings


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_works_on_glibc() -> None:
    assert trim_heap() is True


def test_a_session_trims_after_each_prompt_groups_prefill_and_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[None] = []
    monkeypatch.setattr(session, "trim_heap", lambda: calls.append(None))
    model, draft, prompts = write_pair(tmp_path)
    settings = SessionSettings(model=model, draft=draft, prompts=prompts, max_new_tokens=4)
    events: list[Event] = []
    native.native_session(settings, events.append, Controls.from_settings(settings)).run()
    groups = sum(isinstance(e, PromptDone) for e in events)  # batch 1: a group per prompt
    assert groups > 1 and len(calls) == groups + 1
