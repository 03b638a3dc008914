"""Acceptance panel: accepted drafts per verify step over time, the histogram over 0..k,
acceptance by draft position and the mean accepted length (tokens per step incl. bonus)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.numbers import bar, num, pct
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import SeriesPlot

ACCEPTED_COLOUR = "green"
BAR_WIDTH = 16


class AcceptancePanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Readout(id="acceptance-numbers")
        with Horizontal():
            yield SeriesPlot(
                "accepted drafts per verify step", "step", "drafts", id="acceptance-plot"
            )
            yield Readout(id="acceptance-bars")

    def show_numbers(self, m: DashboardModel) -> None:
        self.query_one("#acceptance-numbers", Readout).show_text(
            f"mean accepted length [b]{num(m.mean_accepted_length_window, '.2f')}[/b] (1 s) "
            f"[b]{num(m.mean_accepted_length, '.2f')}[/b] (session)   "
            f"acceptance rate [b]{pct(m.acceptance_rate)}[/b] (session)   "
            f"verify steps {m.verify_steps} (session)"
        )
        steps = sum(m.histogram.values())
        lines = ["[b]histogram[/b] (session)"]
        for accepted in range(m.max_k + 1):
            count = m.histogram[accepted]
            share = count / steps if steps else None
            lines.append(f"{accepted:>2} [{ACCEPTED_COLOUR}]{bar(share, BAR_WIDTH)}[/] {count}")
        lines.append("[b]by draft position[/b] (session)")
        for position, rate in enumerate(m.acceptance_by_position(), start=1):
            lines.append(f"{position:>2} [{ACCEPTED_COLOUR}]{bar(rate, BAR_WIDTH)}[/] {pct(rate)}")
        self.query_one("#acceptance-bars", Readout).show_text("\n".join(lines))

    def show_plot(self, m: DashboardModel) -> None:
        ys = list(m.accepted_series)
        start = m.verify_steps - len(ys)
        self.query_one(SeriesPlot).show(
            range(start, start + len(ys)),
            [("accepted", ys, ACCEPTED_COLOUR)],
            ylim=(0, max(m.max_k, 1)),
            lines=False,
        )
