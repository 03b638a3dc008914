"""A session on whichever engine `settings.engine` names, and what a caller needs of it without
knowing the engine.

`run_engine(settings, sink, controls, stop, options, prompts)` builds the engine's backend
(native, or SGLang in-process) and runs a `specdash.runs.session.Session` on it: it blocks, calls
`sink(event)`, applies `controls` between steps, ends early when `stop` is set, and returns the
`Summary` it emitted last. `loading_label` says what a session loads, and `pinned_options`
fixes what a session in another process must not decide there: the dashboard needs both without
knowing the engine. Nothing here imports torch or SGLang (the backends are imported lazily).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from specdash.controls import Controls
from specdash.events import Sink, Summary
from specdash.prompts import Prompt
from specdash.registry import drafters, engines
from specdash.settings import SessionSettings

if TYPE_CHECKING:
    from typing import TypeAlias

    from specdash.runs.session import Backend
    from specdash.runs.sglang.args import SGLangOptions

    EngineOptions: TypeAlias = SGLangOptions
    """What an engine needs beyond `SessionSettings` (only SGLang needs anything), passed
    through by callers that do not know which engine runs."""


def backend_for(settings: SessionSettings, options: EngineOptions | None = None) -> Backend:
    """The backend of the engine `settings.engine` names (`specdash.registry.engines`;
    imported here: torch, SGLang)."""
    backend: Backend = engines.engine(settings.engine).load()(settings, options)
    return backend


def run_engine(
    settings: SessionSettings,
    sink: Sink,
    controls: Controls | None = None,
    stop: threading.Event | None = None,
    options: EngineOptions | None = None,
    prompts: list[Prompt] | None = None,
) -> Summary:
    """The session on the engine `settings.engine` names, with `options` beyond the settings;
    `prompts`: the prompt set when the caller has read it (else the session reads it)."""
    from specdash.runs.session import Session

    backend = backend_for(settings, options)
    return Session(settings, backend, sink, controls, stop, prompts).run()


def loading_label(settings: SessionSettings) -> str:
    """What a session of `settings` loads before its first event, in words."""
    target = settings.model.name if settings.model else settings.preset or "embedded target"
    if settings.engine == "sglang":
        from specdash.runs.sglang.process import log_file_beside

        engines = "engine + shadow engine" if settings.speculation and settings.shadow else "engine"
        log = log_file_beside(settings)
        return f"starting the SGLang {engines} for {target} (SGLang's log: {log})"
    if not settings.speculation or not drafters.uses_draft_model(settings.drafter):
        draft = ""
    else:
        draft = f" + {settings.draft.name if settings.draft else 'embedded draft'}"
    return f"loading {target}{draft} on {settings.device} ({settings.engine} engine)"


def pinned_options(
    settings: SessionSettings, options: EngineOptions | None
) -> EngineOptions | None:
    """`options` with what they leave to the process that runs the session fixed here, for a
    session that runs in another process (`engine_process`): SGLang's log, named by this
    process's id when there is no trace (what `loading_label` says)."""
    if settings.engine != "sglang":
        return options
    from dataclasses import replace

    from specdash.runs.sglang.args import SGLangOptions
    from specdash.runs.sglang.process import log_file_beside

    options = options or SGLangOptions()
    return replace(options, log_file=options.log_file or log_file_beside(settings))
