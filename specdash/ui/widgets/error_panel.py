"""Error panel: the engine's latest error. A fatal one ends the session (the numbers so far
stay on screen); a non-fatal one (e.g. a typed prompt it refused) does not."""

from __future__ import annotations

from rich.text import Text

from specdash.events import EngineError
from specdash.ui.widgets.readout import Readout


class ErrorPanel(Readout):
    def show(self, errors: list[EngineError], recording: str) -> None:
        self.set_class(bool(errors), "-shown")  # CSS shows it, unless the screen is too small
        if errors:
            latest = errors[-1]
            verdict = "session over" if latest.fatal else "session continues"
            text = Text(f"engine error ({verdict}): ", style="bold")
            text.append(latest.message)
            text.append(f"\n{recording or 'no trace was recording'}", style="dim")
            self.show_text(text)
