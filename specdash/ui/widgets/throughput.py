"""Throughput panel: emitted tokens per second (last 1 s and session), and the speculative
path against the shadow (plain greedy decode of the same tokens) from per-step timings, or
from each finished request where the engine times whole requests (SGLang).

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
STEP_UNITS = "t/s (1 s) vs session s"
REQUEST_UNITS = "t/s per request vs session s"
"""Session seconds: the session's clock, stopped while the engine is idle or paused, so idle
time never stretches the axis, and no line is drawn across it."""


def _rate(value: float | None) -> str:
    """A rate in its 8-column cell: whole numbers from 1000 t/s on (a tiny model's)."""
    return num(value, ".0f" if value is not None and value >= 1000 else ".1f")


def _speedup(spec: float | None, shadow: float | None) -> str:
    return "–" if not spec or not shadow else f"{spec / shadow:.2f}x"


def _rates(wall: float | None, steps: StepTimes, shadow_ran: bool) -> tuple[str, ...]:
    """The row's cells; without a shadow there is no plain rate and no speedup (–)."""
    spec, shadow = steps.spec_tps, steps.shadow_tps if shadow_ran else None
    return _rate(wall), _rate(spec), _rate(shadow), _speedup(spec, shadow)


class ThroughputPanel(Panel):
    TITLE, ID = "throughput", "throughput"

    def compose(self) -> ComposeResult:
        yield Readout(id="throughput-numbers")
        yield SeriesPlot(STEP_UNITS, id="throughput-plot")

    def show_numbers(self, m: DashboardModel) -> None:
        header = ROW.format("t/s", "wall", "spec", "shadow", "speedup")
        header = header.replace("spec", f"[{SPEC_COLOUR}]spec[/]", 1)
        if m.shadow:
            header = header.replace("shadow", f"[{SHADOW_COLOUR}]shadow[/]", 1)
        else:  # nothing to compare with: no rate, no speedup, and why
            header = header.replace("shadow", "–     ").replace("speedup", "(--no-shadow)")
        latest, whole = m.rate_steps
        if m.per_request:  # a finished request's rate holds while the engine rests
            wall = None if m.idle_reason else m.tokens_per_s_window
            window = ROW.format("last req", *_rates(wall, latest, m.shadow))
        elif m.idle_reason is not None:  # no step in the last second is not a rate of zero
            window = ROW.format("1 s", m.idle_reason, "", "", "")
        else:
            window = ROW.format("1 s", *_rates(m.tokens_per_s_window, latest, m.shadow))
        session = ROW.format("session", *_rates(m.tokens_per_s_session, whole, m.shadow))
        self.query_one("#throughput-numbers", Readout).show_text(
            f"[dim]{header}[/dim]\n{window}\n{session}"
        )

    def show_plot(self, m: DashboardModel) -> None:
        points = list(m.tps_series)
        series = [("spec", [p[1] for p in points], SPEC_COLOUR)]
        if m.shadow:
            series.append(("shadow", [p[2] for p in points], SHADOW_COLOUR))
        plot = self.query_one(SeriesPlot)
        plot.units = REQUEST_UNITS if m.per_request else STEP_UNITS
        plot.show([p[0] for p in points], series)
