"""The runner protocol both engines implement, and what a caller needs of a session before it
runs, whichever engine runs it.

A runner turns an engine into the event stream: `run(settings, sink, controls, stop)` blocks,
calls `sink(event)`, applies `controls` between steps, ends early when `stop` is set, and returns
the `Summary` it emitted last. `NativeRunner` (specdash.runs.native) and `SGLangRunner`
(specdash.runs.sglang.backend) implement it, each as a backend of `specdash.runs.session`;
`run_engine` picks the one `settings.engine` names. `loading_label` says what a session loads,
and `fatal_watch` how an engine's failure outside the session's thread reaches it: a caller
(the dashboard) needs both without knowing the engine. Nothing here imports torch or SGLang.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from specdash.controls import Controls
from specdash.errors import SpecdashError
from specdash.events import Sink, Summary
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from typing import TypeAlias

    from specdash.runs.sglang.args import SGLangOptions

    EngineOptions: TypeAlias = SGLangOptions
    """What an engine needs beyond `SessionSettings` (only SGLang needs anything), passed
    through by callers that do not know which engine runs."""


class Runner(Protocol):
    def run(
        self,
        settings: SessionSettings,
        sink: Sink,
        controls: Controls | None = None,
        stop: threading.Event | None = None,
    ) -> Summary: ...


def runner_for(settings: SessionSettings, options: EngineOptions | None = None) -> Runner:
    """The runner of the engine `settings.engine` names (imported lazily: torch, SGLang)."""
    if settings.engine == "sglang":
        from specdash.runs.sglang.args import SGLangOptions
        from specdash.runs.sglang.backend import SGLangRunner

        return SGLangRunner(options or SGLangOptions())
    from specdash.runs.native import NativeRunner

    return NativeRunner()


def run_engine(
    settings: SessionSettings,
    sink: Sink,
    controls: Controls | None = None,
    stop: threading.Event | None = None,
    options: EngineOptions | None = None,
) -> Summary:
    """The session on the engine `settings.engine` names (native, or SGLang in-process), with
    `options` beyond the settings."""
    return runner_for(settings, options).run(settings, sink, controls, stop)


def loading_label(settings: SessionSettings) -> str:
    """What a session of `settings` loads before its first event, in words."""
    target = settings.model.name if settings.model else settings.preset or "embedded target"
    if settings.engine == "sglang":
        from specdash.runs.sglang.process import log_file_beside

        engines = "engine + shadow engine" if settings.speculation and settings.shadow else "engine"
        log = log_file_beside(settings)
        return f"starting the SGLang {engines} for {target} (SGLang's log: {log})"
    if not settings.speculation or settings.drafter == "ngram":
        draft = ""
    else:
        draft = f" + {settings.draft.name if settings.draft else 'embedded draft'}"
    return f"loading {target}{draft} on {settings.device} ({settings.engine} engine)"


class FatalWatch(Protocol):
    """How an engine's failure that happens outside the session's thread (a child process
    dying) ends the session: `arm` from the main thread before the session's thread starts,
    `disarm` after; `failure` is that error once it came."""

    failure: SpecdashError | None

    def arm(self, thread: threading.Thread) -> None: ...

    def disarm(self) -> None: ...


class _NoWatch:
    """An engine whose failures all happen in the session's thread."""

    failure: SpecdashError | None = None

    def arm(self, thread: threading.Thread) -> None:
        pass

    def disarm(self) -> None:
        pass


def fatal_watch(settings: SessionSettings) -> FatalWatch:
    """The `FatalWatch` of the engine `settings.engine` names."""
    if settings.engine == "sglang":
        from specdash.runs.sglang.process import SchedulerWatch

        return SchedulerWatch()
    return _NoWatch()
