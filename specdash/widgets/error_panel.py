"""Error panel: shown when the engine reports an error; the session is over but the numbers
so far stay on screen."""

from __future__ import annotations

from rich.text import Text

from specdash.widgets.readout import Readout


class ErrorPanel(Readout):
    def show(self, errors: list[str], recording: str) -> None:
        self.display = bool(errors)
        if errors:
            text = Text("engine error: ", style="bold")
            text.append(errors[-1])
            text.append(f"\n{recording or 'no trace was recording'}", style="dim")
            self.show_text(text)
