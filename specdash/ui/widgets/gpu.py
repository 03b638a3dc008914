"""GPU panel: DRAM bandwidth (GPM DRAM_BW_UTIL x peak), SM util, power and memory used.

Without GPM the bandwidth row is the labelled "mem busy %" (a busy-time share, never
converted to GB/s); without an NVIDIA GPU the panel is one line saying so.
"""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.numbers import num
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import SeriesPlot

BANDWIDTH_COLOUR = "magenta"


class GpuPanel(Panel):
    TITLE, ID = "GPU", "gpu"

    def compose(self) -> ComposeResult:
        yield Readout("GPU: waiting for the first sample", id="gpu-numbers")
        yield SeriesPlot("vs session s", id="gpu-plot")

    def show_numbers(self, m: DashboardModel) -> None:
        t = m.telemetry
        numbers = self.query_one("#gpu-numbers", Readout)
        plot = self.query_one(SeriesPlot)
        if t is None:
            return
        plot.display = t.source != "none"
        window = f"{t.window_s * 1000:.0f} ms"
        if t.source == "none":
            numbers.show_text(f"GPU: {escape(t.note)}")
            return
        if t.source == "gpm":
            bandwidth = (
                f"DRAM BW [b]{num(t.dram_bw_util_pct)}[/b] % "
                f"≈ [b]{num(t.dram_gbps, '.0f')}[/b] GB/s (GPM, {window})"
            )
            sm = f"SM util {num(t.sm_util_pct)} % (GPM, {window})"
        else:
            bandwidth = f"mem busy [b]{num(t.mem_busy_pct, '.0f')}[/b] % ({window}, not bandwidth)"
            sm = "SM util – (needs GPM)"
        numbers.show_text(
            f"{bandwidth}\n{sm}   power {num(t.power_w, '.0f')} W (now)\n"
            f"mem used {num(t.mem_used_gb, '.2f')} GB (now)\n[dim]{escape(t.note)}[/dim]"
        )

    def show_plot(self, m: DashboardModel) -> None:
        t = m.telemetry
        if t is None or t.source == "none":
            return
        gpm = t.source == "gpm"
        plot = self.query_one(SeriesPlot)
        points = list(m.bandwidth_series)
        ys = [y for _, y in points]
        plot.show(
            [x for x, _ in points],
            [
                (
                    "DRAM GB/s (GPM, derived)" if gpm else "mem busy % (not bandwidth)",
                    ys,
                    BANDWIDTH_COLOUR,
                )
            ],  # fmt: skip
            ylim=None if gpm else (0, 100),
        )
