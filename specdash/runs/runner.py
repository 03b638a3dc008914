"""The runner protocol both engines implement, and the pick of one by `settings.engine`.

A runner turns an engine into the event stream: `run(settings, sink, controls, stop)` blocks,
calls `sink(event)` from the calling thread, applies `controls` between steps (native) or
prompts (SGLang), ends early when `stop` is set, and returns the `Summary` it emitted last.
`NativeRunner` (specdash.runs.native) and `SGLangRunner` (specdash.runs.sglang) implement it;
`run_engine` picks the one `settings.engine` names. Both emit through
`specdash.runs.session_events.SessionEvents`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from specdash.controls import Controls
from specdash.events import Sink, Summary
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from specdash.runs.sglang import SGLangOptions


class Runner(Protocol):
    def run(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
    ) -> Summary: ...


def runner_for(settings: SessionSettings, sglang_options: SGLangOptions | None = None) -> Runner:
    """The runner of the engine `settings.engine` names (imported lazily: torch, SGLang)."""
    if settings.engine == "sglang":
        from specdash.runs.sglang import SGLangOptions, SGLangRunner

        return SGLangRunner(sglang_options or SGLangOptions())
    from specdash.runs.native import NativeRunner

    return NativeRunner()


def run_engine(
    settings: SessionSettings,
    sink: Sink,
    controls: Controls | None = None,
    stop: threading.Event | None = None,
    sglang_options: SGLangOptions | None = None,
) -> Summary:
    """The session on the engine `settings.engine` names (native, or SGLang in-process)."""
    return runner_for(settings, sglang_options).run(settings, sink, controls, stop)
