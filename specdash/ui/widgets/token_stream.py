"""Token stream: the current prompt's generated text, each token styled by how it got there
(accepted draft, bonus token from the verifier, plain decode) and divergences marked.

The panel has a fixed size and shows the last lines that fit, wrapped here: a text that grows
inside a scrolling container would need a layout pass of the whole screen on every update.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widgets import Static

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.readout import Readout

STYLES = {"draft": "green", "bonus": "bold cyan", "decode": "default"}
DIVERGED = "bold white on red"
PROMPT_CHARS = 400
SHOWN_TOKENS = 300
"""Tokens rendered: enough to fill the panel; re-wrapping thousands each update costs the engine."""


def legend() -> Text:
    text = Text("legend: ")
    for label, style in (("accepted draft", STYLES["draft"]), ("bonus", STYLES["bonus"])):
        text.append(label, style=style)
        text.append("  ")
    text.append("decode  ")
    text.append("divergence", style=DIVERGED)
    return text


class TokenStream(Panel):
    TITLE, ID = "token stream", "tokens"
    _text = Text()

    def compose(self):
        yield Static(legend(), id="token-legend")
        yield Readout(id="token-text")

    def show_numbers(self, m: DashboardModel) -> None:
        text = Text()
        if m.prompt_index is not None:
            prompt = m.prompt_text[-PROMPT_CHARS:]
            text.append(f"prompt {m.prompt_index}: ", style="bold")
            text.append(("…" if len(m.prompt_text) > PROMPT_CHARS else "") + prompt, style="dim")
            text.append("\n")
        tokens = list(m.stream)[-SHOWN_TOKENS:]
        if len(m.stream) > SHOWN_TOKENS:
            text.append("…")
        for token in tokens:
            text.append(token.text, style=DIVERGED if token.diverged else STYLES[token.source])
        self._text = text
        self._show_tail()

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._show_tail)

    def _show_tail(self) -> None:
        view = self.query_one("#token-text", Readout)
        width, height = view.content_size
        text = self._text
        if width and height:
            lines = text.wrap(self.app.console, width)
            if len(lines) > height:
                text = Text("\n").join(lines[-height:])
        view.show_text(text)
