"""Progress on stderr for the long CLI jobs (`run --headless`, `audit`): model load, prefill
of each prompt, prompts done with the wall token rate and an ETA, audit cells done.

Shown only when stderr is a terminal (rich's own check), so pipes, logs and `--json`
consumers see only the result, and an error stays one line.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column

from specdash.events import (
    Event,
    Prefill,
    PromptDone,
    PromptStart,
    SessionStart,
    StartPhase,
    Token,
)


def make_progress(console: Console | None = None) -> Progress:
    """A transient rich progress display on stderr; disabled where stderr is no terminal."""
    console = console or Console(stderr=True)
    # on a narrow terminal the description is cut, not the numbers
    shrinks = Column(no_wrap=True, overflow="ellipsis", ratio=1)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", table_column=shrinks),
        BarColumn(bar_width=20),
        TextColumn("{task.fields[rate]}", table_column=Column(no_wrap=True, min_width=16)),
        TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)),
        TextColumn("ETA"),
        TimeRemainingColumn(table_column=Column(no_wrap=True, min_width=7)),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


class SessionProgress:
    """A session's progress as an event sink: one task counting generated tokens (the bar
    and the ETA), described by what runs now and how many prompts are done."""

    def __init__(
        self,
        progress: Progress,
        prompts: int,
        max_new_tokens: int,
        prefix: str = "",
        waiting: str = "loading model weights",
    ) -> None:
        self.progress = progress
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.total = prompts * max_new_tokens
        self.prefix = prefix
        self.done = 0
        self.tokens = 0
        self.t0 = 0.0
        self.starting: dict[str, str] = {}
        """Each starting engine's latest phase (the spec and shadow engines start together)."""
        self.task: TaskID = progress.add_task(prefix + waiting, total=None, rate="")

    def _describe(self, doing: str) -> None:
        self.progress.update(
            self.task, description=f"{self.prefix}prompts {self.done}/{self.prompts} · {doing}"
        )

    def __call__(self, event: Event) -> None:
        p = self.progress
        if isinstance(event, StartPhase):
            self.starting[event.engine] = event.text
            starting = " · ".join(self.starting.values())
            p.update(self.task, description=f"{self.prefix}starting · {starting}")
        elif isinstance(event, SessionStart):
            self.t0 = time.perf_counter()
            p.reset(self.task, total=self.total)
            self._describe("starting")
        elif isinstance(event, PromptStart):
            n = event.prompt_tokens
            self._describe(f"prefill prompt {event.prompt_index} ({n:,} tokens)")
        elif isinstance(event, Prefill):
            self._describe(f"decoding prompt {event.prompt_index}")
        elif isinstance(event, Token):
            self.tokens += 1
            rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
            p.update(self.task, advance=1, rate=f"{rate:.1f} tok/s wall")
        elif isinstance(event, PromptDone):
            self.done += 1
            # a prompt that stops early (EOS) leaves its unused tokens out of the total
            self.total -= self.max_new_tokens - event.new_tokens
            p.update(self.task, total=self.total)
            self._describe("done" if self.done == self.prompts else "next prompt")

    def close(self) -> None:
        self.progress.remove_task(self.task)


class AuditProgress:
    """`specdash audit`: cells done of all, with the current cell's session below it."""

    def __init__(self, progress: Progress, cells: int, prompts: int, max_new_tokens: int) -> None:
        self.progress = progress
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.cells = cells
        self.done = 0
        self.task = progress.add_task(f"audit cells 0/{cells}", total=cells, rate="")
        self.session: SessionProgress | None = None
        self.t0 = time.perf_counter()

    def loading(self, drafter: str) -> None:
        self.progress.update(
            self.task, description=f"audit cells {self.done}/{self.cells} · loading {drafter}"
        )

    def start_cell(self, name: str) -> SessionProgress:
        self.progress.update(
            self.task, description=f"audit cells {self.done}/{self.cells} · {name}"
        )
        self.session = SessionProgress(
            self.progress, self.prompts, self.max_new_tokens, "  ", waiting="starting"
        )
        return self.session

    def end_cell(self) -> None:
        if self.session is not None:
            self.session.close()
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        self.progress.update(
            self.task,
            advance=1,
            description=f"audit cells {self.done}/{self.cells}",
            rate=f"{60 * self.done / max(elapsed, 1e-9):.1f} cells/min",
        )
