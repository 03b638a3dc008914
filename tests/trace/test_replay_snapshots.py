"""SVG snapshots of `specdash replay`: the live panels plus the playback bar, paused midway and
at the end. Update with `pytest tests/trace/test_replay_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest
from synthetic_trace import Plan, session
from test_replay import FakeClock, settle

from specdash.trace.replay import TraceReplay
from specdash.ui.replay_app import ReplayApp

SIZE = (160, 48)
"""The live dashboard's size: the playback bar takes the prompt line's place."""


def replay_app() -> ReplayApp:
    events = session(Plan(divergence_at=(1, 9)))
    return ReplayApp(TraceReplay(events[0], events[1:], clock=FakeClock()), name="s.jsonl")


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_replay(snap_compare, share):
    async def seek(pilot) -> None:
        app = pilot.app
        app.replay.pause()
        app.show_history(app.replay.seek(app.replay.duration_s * share))
        await settle(pilot)

    assert snap_compare(replay_app(), terminal_size=SIZE, run_before=seek)
