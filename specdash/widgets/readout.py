"""A Static that only re-renders when its text changed: every `update` costs a render and a
layout pass, and at 10 Hz most readouts are unchanged most of the time."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class Readout(Static):
    _shown: str | Text | None = None

    def show_text(self, content: str | Text) -> None:
        if content != self._shown:
            self._shown = content
            self.update(content)
