"""A line plot of a few series under a key line that says what it draws, with explicit colours
(automatic colour cycling makes SVG snapshots flaky), rebuilt only when given new data.

plotext's `build()` costs about 40 us per point (24 ms for 600 braille points at 76x12),
while a braille plot resolves only two points per cell column. So a series longer than the
plot is wide is reduced to the lowest and highest point of each column's share of it: the
same picture, since a line through a column covers min..max anyway, at a quarter of the cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

FALLBACK_WIDTH = 80
"""Columns assumed before the first layout."""
ROOMY_HEIGHT = 7
"""Rows a plot needs for its frame and tick labels; a shorter one (a 100x30 terminal) is drawn
bare: two y ticks, x ticks a dozen columns apart, no frame, so that no label lands on another."""


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


class _Canvas(PlotextPlot):
    """The plotted area: points and tick numbers only. Titles, legends and axis labels that
    plotext would draw inside it land on the data in a short or crowded plot, so the key line
    above says all of that instead."""

    def __init__(self) -> None:
        super().__init__()
        self.redraw: tuple | None = None
        """The last `SeriesPlot.show` arguments, to redraw when a resize changes the frame."""
        self.bare: bool | None = None
        self.drawn = 0
        """How many times `show` drew the figure: a render with the same count, size and theme
        reuses the last picture (plotext builds it from scratch, ~10 ms, and Textual renders a
        widget again whenever the screen is laid out)."""
        self._picture: tuple[tuple, object] | None = None

    def render(self):
        key = (self.drawn, self.size, self.app.theme)
        if self._picture is None or self._picture[0] != key:
            self._picture = (key, super().render())
        return self._picture[1]

    def is_bare(self) -> bool:
        return 0 < self.size.height < ROOMY_HEIGHT

    def on_resize(self) -> None:
        if self.redraw is not None and self.is_bare() != self.bare:
            self.parent.show(*self.redraw)  # type: ignore[union-attr]


class SeriesPlot(Vertical):
    """A plot under its key: each series' colour and name, then what the axes measure
    (`units`, e.g. "t/s vs session s"). The key is one line, cut rather than wrapped."""

    DEFAULT_CSS = """
    SeriesPlot { height: 1fr; }
    SeriesPlot > .chart-key { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    SeriesPlot > _Canvas { height: 1fr; }
    """

    def __init__(self, units: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.units = units
        self._key = ""

    def compose(self):
        yield Static(classes="chart-key")
        yield _Canvas()

    def show(
        self,
        xs: Sequence[float],
        series: Sequence[tuple[str, Sequence[float], str]],
        ylim: tuple[float, float] | None = None,
        lines: bool = True,
    ) -> None:
        """Redraw with `series` = (label, ys, colour) sharing `xs`, as lines or as dots (a
        third of the cost, and clearer for integer series that jump between levels)."""
        canvas = self.query_one(_Canvas)
        canvas.redraw = (xs, series, ylim, lines)
        canvas.bare = bare = canvas.is_bare()
        key = "".join(f"[{colour}]━━[/] {escape(label)}  " for label, _, colour in series)
        key += f"[dim]{escape(self.units)}[/dim]"
        if key != self._key:  # one line tall: no layout pass
            self._key = key
            self.query_one(".chart-key", Static).update(key, layout=False)
        plt = canvas.plt
        plt.clear_data()
        plt.clear_figure()
        columns = canvas.size.width or FALLBACK_WIDTH
        if bare:
            plt.frame(False)
            plt.yfrequency(2)
            plt.xfrequency(max(2, columns // 12))
        if ylim is not None:
            plt.ylim(*ylim)
        draw = plt.plot if lines else plt.scatter
        for _, ys, colour in series:
            if ys:
                px, py = envelope(xs, ys, columns)
                draw(px, py, marker="braille", color=colour)
        canvas.drawn += 1
        canvas.refresh()
