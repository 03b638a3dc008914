"""Throughput panel: emitted tokens per second (last 1 s and session), and the speculative
path against the shadow (plain greedy decode of the same tokens) from per-step timings.

The numbers are a small table, one column per rate and one row per window, so each window is
named once and no line outgrows a 100-column terminal's panel."""

from __future__ import annotations

from textual.app import ComposeResult

from specdash.ui.dashboard_model import DashboardModel, StepTimes
from specdash.ui.widgets.numbers import num
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import SeriesPlot

SPEC_COLOUR = "cyan"
SHADOW_COLOUR = "orange"
ROW = "{:<8}{:>8}{:>8}{:>8}{:>9}"


def _speedup(spec: float | None, shadow: float | None) -> str:
    return "–" if not spec or not shadow else f"{spec / shadow:.2f}x"


def _rates(wall: float | None, steps: StepTimes, shadow_ran: bool) -> tuple[str, ...]:
    """The row's cells; without a shadow there is no plain rate and no speedup (–)."""
    spec, shadow = steps.spec_tps, steps.shadow_tps if shadow_ran else None
    return num(wall), num(spec), num(shadow), _speedup(spec, shadow)


class ThroughputPanel(Panel):
    TITLE, ID = "throughput", "throughput"

    def compose(self) -> ComposeResult:
        yield Readout(id="throughput-numbers")
        yield SeriesPlot("t/s (1 s) vs s since start", id="throughput-plot")

    def show_numbers(self, m: DashboardModel) -> None:
        header = ROW.format("t/s", "wall", "spec", "shadow", "speedup")
        header = header.replace("spec", f"[{SPEC_COLOUR}]spec[/]", 1)
        if m.shadow:
            header = header.replace("shadow", f"[{SHADOW_COLOUR}]shadow[/]", 1)
        else:  # nothing to compare with: no rate, no speedup, and why
            header = header.replace("shadow", "–     ").replace("speedup", "(--no-shadow)")
        if m.idle_reason is not None:  # no step in the last second is not a rate of zero
            window = ROW.format("1 s", m.idle_reason, "", "", "")
        else:
            window = ROW.format("1 s", *_rates(m.tokens_per_s_window, m.window_steps, m.shadow))
        rates = _rates(m.tokens_per_s_session, m.session_steps, m.shadow)
        session = ROW.format("session", *rates)
        self.query_one("#throughput-numbers", Readout).show_text(
            f"[dim]{header}[/dim]\n{window}\n{session}"
        )

    def show_plot(self, m: DashboardModel) -> None:
        points = list(m.tps_series)
        series = [("spec", [p[1] for p in points], SPEC_COLOUR)]
        if m.shadow:
            series.append(("shadow", [p[2] for p in points], SHADOW_COLOUR))
        self.query_one(SeriesPlot).show([p[0] for p in points], series)
