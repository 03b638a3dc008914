"""The prompt line under the panels: `/` focuses it, Enter queues the prompt, Esc leaves."""

from __future__ import annotations

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
