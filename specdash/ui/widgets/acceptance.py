"""Acceptance panel: the mean accepted length (tokens per step incl. bonus) and the acceptance
rate, the histogram of verify steps by drafts kept (every row 0..k) beside acceptance by draft
position, and accepted drafts per verify step over time where the panel has room for a plot.

At k = 16 the table has 17 rows, more than a 100x30 (or even 160x48) panel holds: its rows
scroll under a fixed header (wheel, or shift+tab to it, then the arrows), and the panel's
bottom border says which rows are in view."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.numbers import bar, num, pct
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import SeriesPlot

ACCEPTED_COLOUR = "green"
BAR_WIDTH = 8
HISTOGRAM_ROW = "{:>2} {} {:>5}"
POSITION_ROW = "{:>2} {} {:>4}"
GAP = "  "
TABLE_WIDTH = 2 + 1 + BAR_WIDTH + 1 + 5 + len(GAP) + 2 + 1 + BAR_WIDTH + 1 + 4
"""Columns of the histogram and by-position table."""
MIN_PLOT_WIDTH = 30
"""Narrower than this beside the table (below 160 columns), the plot is left out: the table's
rows come first, and a narrower plot cannot show its key."""


class AcceptancePanel(Panel):
    TITLE, ID = "acceptance", "acceptance"

    def compose(self) -> ComposeResult:
        yield Readout(id="acceptance-numbers")
        with Horizontal():
            with Vertical(id="acceptance-table"):
                yield Readout(_header(), id="acceptance-header")
                with TableRows(id="acceptance-rows"):
                    yield Readout(id="acceptance-bars")
            yield SeriesPlot("vs verify step", id="acceptance-plot")

    def on_mount(self) -> None:
        self.query_one("#acceptance-table").styles.width = TABLE_WIDTH + 1  # + the scrollbar

    def on_resize(self, event: events.Resize) -> None:
        room = self.content_size.width - TABLE_WIDTH - 1
        self.query_one(SeriesPlot).display = room >= MIN_PLOT_WIDTH

    def show_numbers(self, m: DashboardModel) -> None:
        window = m.idle_reason or num(m.mean_accepted_length_window, ".2f")
        self.query_one("#acceptance-numbers", Readout).show_text(
            f"mean accepted length [b]{window}[/b] (1 s) "
            f"[b]{num(m.mean_accepted_length, '.2f')}[/b] (session)\n"
            f"acceptance rate [b]{pct(m.acceptance_rate)}[/b], "
            f"verify steps {m.verify_steps} (session)"
        )
        self.query_one("#acceptance-bars", Readout).show_text("\n".join(_table(m)))
        self.call_after_refresh(self.query_one(TableRows).say_in_view)  # once laid out

    def show_plot(self, m: DashboardModel) -> None:
        ys = list(m.accepted_series)
        start = m.verify_steps - len(ys)
        self.query_one(SeriesPlot).show(
            range(start, start + len(ys)),
            [("drafts kept per step", ys, ACCEPTED_COLOUR)],
            ylim=(0, max(m.max_k, 1)),
            lines=False,
        )


class TableRows(VerticalScroll):
    """The table's rows, scrolled where the panel is shorter than k + 1 rows; the panel's
    bottom border then says which are in view."""

    DEFAULT_CSS = "TableRows { scrollbar-size-vertical: 1; }"

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.say_in_view()

    def on_resize(self) -> None:
        self.call_after_refresh(self.say_in_view)

    def say_in_view(self) -> None:
        rows, shown = self.virtual_size.height, self.size.height
        panel = self.query_ancestor(AcceptancePanel)
        if not shown or rows <= shown:
            if panel.border_subtitle:
                panel.border_subtitle = ""
            return
        first = round(self.scroll_y)
        last = min(rows, first + shown) - 1
        more = "↓ wheel or shift+tab" if last < rows - 1 else "↑"
        subtitle = f"rows {first}–{last} of 0–{rows - 1} {more}"
        if panel.border_subtitle != subtitle:
            panel.border_subtitle = subtitle


def _header() -> str:
    left_width = len(HISTOGRAM_ROW.format("", " " * BAR_WIDTH, ""))
    return f"[b]{'kept: steps':<{left_width}}[/b]{GAP}[b]draft i: P(kept)[/b]"


def _table(m: DashboardModel) -> list[str]:
    """Row a: how many verify steps kept a drafts (a = 0..k), beside row i: the share of
    steps that drafted an i-th token which kept it."""
    steps = sum(m.histogram.values())
    lines = []
    rates = m.acceptance_by_position()
    for accepted in range(m.max_k + 1):
        count = m.histogram[accepted]
        share = count / steps if steps else None
        shaded = f"[{ACCEPTED_COLOUR}]{bar(share, BAR_WIDTH)}[/]"
        line = HISTOGRAM_ROW.format(accepted, shaded, count)
        if accepted < len(rates):
            rate = rates[accepted]
            shaded = f"[{ACCEPTED_COLOUR}]{bar(rate, BAR_WIDTH)}[/]"
            line += GAP + POSITION_ROW.format(accepted + 1, shaded, pct(rate))
        lines.append(line)
    return lines
