"""A line plot of a few series with explicit colours (automatic colour cycling makes SVG
snapshots flaky) that only rebuilds when it is given new data.

plotext's `build()` costs about 40 us per point (24 ms for 600 braille points at 76x12),
while a braille plot resolves only two points per cell column. So a series longer than the
plot is wide is reduced to the lowest and highest point of each column's share of it: the
same picture, since a line through a column covers min..max anyway, at a quarter of the cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual_plotext import PlotextPlot

FALLBACK_WIDTH = 80
"""Columns assumed before the first layout."""
ROOMY_HEIGHT = 9
"""Rows a plot needs for its frame, title, axis labels and legend; a shorter one (a 100x30
terminal) is drawn bare: two y ticks, x ticks a dozen columns apart, no frame, so that no
label lands on another."""


def envelope(
    xs: Sequence[float], ys: Sequence[float], columns: int
) -> tuple[list[float], list[float]]:
    """At most 2 x `columns` points: per column's slice of the series, its min and max, in
    series order. A series that already fits is returned as it is."""
    n = min(len(xs), len(ys))
    if n <= 2 * columns:
        return list(xs[:n]), list(ys[:n])
    out_x: list[float] = []
    out_y: list[float] = []
    for c in range(columns):
        lo, hi = c * n // columns, (c + 1) * n // columns
        i_min = min(range(lo, hi), key=ys.__getitem__)
        i_max = max(range(lo, hi), key=ys.__getitem__)
        for i in sorted({i_min, i_max}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


class SeriesPlot(PlotextPlot):
    def __init__(
        self, title: str, xlabel: str = "", ylabel: str = "", *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.heading = title
        self._xlabel = xlabel
        self._ylabel = ylabel
        self._last: tuple | None = None
        """The last `show` arguments, to redraw when a resize changes the decorations."""
        self._bare: bool | None = None

    def _is_bare(self) -> bool:
        return 0 < self.size.height < ROOMY_HEIGHT

    def on_resize(self) -> None:
        if self._last is not None and self._is_bare() != self._bare:
            self.show(*self._last)

    def show(
        self,
        xs: Sequence[float],
        series: Sequence[tuple[str, Sequence[float], str]],
        ylim: tuple[float, float] | None = None,
        lines: bool = True,
    ) -> None:
        """Redraw with `series` = (label, ys, colour) sharing `xs`, as lines or as dots (a
        third of the cost, and clearer for integer series that jump between levels)."""
        self._last = (xs, series, ylim, lines)
        self._bare = bare = self._is_bare()
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        columns = self.size.width or FALLBACK_WIDTH
        if bare:
            plt.frame(False)
            plt.yfrequency(2)
            plt.xfrequency(max(2, columns // 12))
        else:
            plt.title(self.heading)
            plt.xlabel(self._xlabel)
            plt.ylabel(self._ylabel)
        if ylim is not None:
            plt.ylim(*ylim)
        draw = plt.plot if lines else plt.scatter
        for label, ys, colour in series:
            if ys:
                px, py = envelope(xs, ys, columns)
                draw(px, py, marker="braille", color=colour, label=None if bare else label)
        self.refresh()
