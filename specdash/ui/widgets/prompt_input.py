"""The prompt line under the panels: `/` focuses it, Enter queues the prompt, Esc leaves."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.widgets import DataTable, Input


class PromptInput(Input):
    """The prompt line: Enter queues the prompt, Esc leaves it (both in the footer)."""

    BINDINGS = [
        Binding("enter", "submit", "queue prompt"),
        Binding("escape", "leave", "leave"),
    ]

    def action_leave(self) -> None:
        self.clear()
        self.screen.query_one(DataTable).focus()

    def _on_paste(self, event: events.Paste) -> None:
        """The line holds one line of text (`Input`'s own handler, which Textual runs after
        this one, keeps a paste's first): say so when a paste had more, rather than drop them
        unseen."""
        lines = len(event.text.splitlines())
        if lines > 1:
            self.notify(
                f"pasted {lines} lines: the prompt line keeps the first; a prompt of several "
                "lines goes in a --prompts file",
                severity="warning",
            )
