"""A line plot of a few series with explicit colours (automatic colour cycling makes SVG
snapshots flaky) that only rebuilds when it is given new data."""

from __future__ import annotations

from collections.abc import Sequence

from textual_plotext import PlotextPlot


class SeriesPlot(PlotextPlot):
    def __init__(
        self, title: str, xlabel: str = "", ylabel: str = "", *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.heading = title
        self._xlabel = xlabel
        self._ylabel = ylabel

    def show(
        self,
        xs: Sequence[float],
        series: Sequence[tuple[str, Sequence[float], str]],
        ylim: tuple[float, float] | None = None,
    ) -> None:
        """Redraw with `series` = (label, ys, colour) sharing `xs`."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.heading)
        plt.xlabel(self._xlabel)
        plt.ylabel(self._ylabel)
        if ylim is not None:
            plt.ylim(*ylim)
        for label, ys, colour in series:
            if ys:
                plt.plot(list(xs), list(ys), marker="braille", color=colour, label=label)
        self.refresh()
