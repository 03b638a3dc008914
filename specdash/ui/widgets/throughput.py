"""Throughput panel: emitted tokens per second (last 1 s and session), and the speculative
path against the shadow (plain greedy decode of the same tokens) from per-step timings."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.numbers import num
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import SeriesPlot

SPEC_COLOUR = "cyan"
SHADOW_COLOUR = "orange"


def _speedup(spec: float | None, shadow: float | None) -> str:
    return "–" if not spec or not shadow else f"{spec / shadow:.2f}x"


class ThroughputPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Readout(id="throughput-numbers")
        yield SeriesPlot("t/s (each point: last 1 s)", "s (session)", "t/s", id="throughput-plot")

    def show_numbers(self, m: DashboardModel) -> None:
        w, s = m.window_steps, m.session_steps
        if m.shadow:
            shadow = f"{num(w.shadow_tps)} (1 s) {num(s.shadow_tps)} (session)"
            speedup = f"{_speedup(s.spec_tps, s.shadow_tps)} (session)"
        else:  # nothing to compare with: no rate, no speedup
            shadow, speedup = f"{num(None)} (no shadow: --no-shadow)", num(None)
        self.query_one("#throughput-numbers", Readout).show_text(
            f"[b]{num(m.tokens_per_s_window)}[/b] t/s (1 s, wall)   "
            f"[b]{num(m.tokens_per_s_session)}[/b] t/s (session, wall)\n"
            f"[{SPEC_COLOUR}]spec[/] {num(w.spec_tps)} (1 s) {num(s.spec_tps)} (session)   "
            f"[{SHADOW_COLOUR}]shadow[/] {shadow}   speedup {speedup}"
        )

    def show_plot(self, m: DashboardModel) -> None:
        points = list(m.tps_series)
        series = [("spec", [p[1] for p in points], SPEC_COLOUR)]
        if m.shadow:
            series.append(("shadow", [p[2] for p in points], SHADOW_COLOUR))
        self.query_one(SeriesPlot).show([p[0] for p in points], series)
