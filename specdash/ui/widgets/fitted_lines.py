"""Lines fitted to the widget's width when drawn: where a line is too long its least important
parts take their shorter forms (an abbreviation, a dropped label) until it fits, and only then
is a name cut in its middle. A bar of one or two lines keeps what matters whole at 100
columns instead of losing its tail to the terminal's edge, and a wider terminal shows the
long forms again (the fit is made at each render, so a resize refits it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

ELLIPSIS = "…"


@dataclass(frozen=True)
class Part:
    """A piece of a line. `shorter`: (rank, text) forms, each shorter than the one before; the
    line takes the steps of the lowest rank first, every part's step of that rank at once, so
    the same kind of text shortens together. `elastic`: a name that may be cut in its middle
    once no shorter form is left."""

    text: str
    style: str = ""
    shorter: tuple[tuple[int, str], ...] = ()
    elastic: bool = False


def fit(parts: Sequence[Part], width: int) -> Text:
    """`parts` as one line of at most `width` cells where the forms and cuts allow it."""
    steps = [0] * len(parts)

    def form(i: int) -> str:
        return parts[i].text if steps[i] == 0 else parts[i].shorter[steps[i] - 1][1]

    def length() -> int:
        return sum(len(form(i)) for i in range(len(parts)))

    while length() > width:
        ranks = [p.shorter[s][0] for p, s in zip(parts, steps, strict=True) if s < len(p.shorter)]
        if not ranks:
            break
        for i, p in enumerate(parts):
            if steps[i] < len(p.shorter) and p.shorter[steps[i]][0] == min(ranks):
                steps[i] += 1
    forms = [form(i) for i in range(len(parts))]
    over = length() - width
    for i in sorted(range(len(parts)), key=lambda i: -len(forms[i])):
        if over > 0 and parts[i].elastic:
            cut = cut_middle(forms[i], len(forms[i]) - over)
            over -= len(forms[i]) - len(cut)
            forms[i] = cut
    text = Text()
    for p, f in zip(parts, forms, strict=True):
        text.append(f, style=p.style)
    return text


def cut_middle(name: str, length: int) -> str:
    """`name` in `length` cells (never fewer than 9), its start and end kept around an
    ellipsis: "specdash-2026…5800.jsonl" still tells which file it is."""
    length = max(length, 9)
    if len(name) <= length:
        return name
    head = (length - 1) - (length - 1) // 2
    return name[:head] + ELLIPSIS + name[len(name) - (length - 1) // 2 :]


class FittedLines(Static):
    """A Static whose lines are `Part` sequences, fitted to its content width at each render."""

    _lines: tuple[tuple[Part, ...], ...] = ()

    def show_lines(self, lines: Sequence[Sequence[Part]]) -> None:
        shown = tuple(tuple(line) for line in lines)
        if shown != self._lines:
            self._lines = shown
            self.refresh()

    def render(self) -> Text:
        width = self.content_size.width or self.app.size.width
        return Text("\n").join(fit(line, width) for line in self._lines)
