"""What a person sees at each supported terminal size: every chart says what it draws (a key
with units, outside the plotted area), every readout line fits its panel (nothing wraps), the
histogram shows every row 0..k, and the footer shows the keys that act here and now."""

from __future__ import annotations

import pytest
from fake_events import ScriptedSource, fake_session
from rich.text import Text
from textual.widgets import Footer
from textual_plotext import PlotextPlot

from specdash.events import ControlChange, GemmChoice
from specdash.ui.app import SpecdashApp
from specdash.ui.widgets.divergence import DivergenceDetail
from specdash.ui.widgets.readout import Readout

ENTER = "⏎"
"""How Textual's footer shows Enter."""
SIZES = [(100, 30), (120, 40), (160, 48)]
"""The documented minimum, a common laptop terminal, the snapshot size."""


def make_app(events=None) -> SpecdashApp:
    events = fake_session(seed=7) if events is None else events
    app = SpecdashApp(ScriptedSource.live_like(events))
    app.notes = []
    app.notify = lambda message, **kw: app.notes.append(message)
    return app


async def settle(pilot) -> None:
    await pilot.pause()
    pilot.app.refresh_numbers()
    pilot.app.refresh_plots()
    await pilot.pause()


def text_of(widget) -> str:
    return str(widget.render())


def plotted_lines(plot: PlotextPlot) -> list[str]:
    """The plot's canvas as the terminal shows it."""
    return [line.text for line in plot.render_lines(plot.region.reset_offset)]


def plain_lines(readout: Readout) -> list[str]:
    """A readout's lines as given, before the panel wraps or cuts them."""
    shown = readout._shown
    text = shown if isinstance(shown, Text) else Text.from_markup(shown or "")
    return text.plain.splitlines()


def footer_keys(app: SpecdashApp) -> dict[str, bool]:
    """Each footer key's display text -> whether it is fully on screen."""
    footer = app.screen.query_one(Footer)
    width = app.size.width
    return {
        key.key_display or key.key: key.region.right <= width - len("^p palette")
        for key in footer.query("FooterKey")
        if key.display
    }


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_each_chart_has_a_key_with_units_outside_its_data(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        keys = {
            panel: text_of(app.query_one(f"#{panel} .chart-key")) for panel in ("throughput", "gpu")
        }
        assert "spec" in keys["throughput"] and "shadow" in keys["throughput"]
        assert "t/s" in keys["throughput"] and "session s" in keys["throughput"]
        assert "GB/s" in keys["gpu"] and "session s" in keys["gpu"]
        for plot in app.query(PlotextPlot):
            if not plot.display or not plot.region.area:
                continue
            lines = plotted_lines(plot)
            # only tick numbers on the canvas: no legend, title or label over the points
            assert not any(c.isalpha() for line in lines for c in line), "\n".join(lines)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_readouts_fit_their_panels_without_wrapping(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for readout in app.query(Readout):
            if not readout.display or readout.id in ("token-text", "status"):
                continue
            width = readout.content_size.width
            for line in plain_lines(readout):
                assert len(line.rstrip()) <= width, f"#{readout.id} at {size}: {line!r}"


@pytest.mark.parametrize("k", [4, 9, 16])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_histogram_rows_zero_to_k_are_each_in_view_or_a_scroll_away(size, k):
    """Every row 0..k of the table is on screen, or is brought there by scrolling its rows
    (shift+tab reaches them from the divergence table, then End / the arrows), and the panel's
    border says which rows are in view while some are not."""
    app = make_app(fake_session(seed=7, k=k))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        header = text_of(app.query_one("#acceptance-header"))
        assert "kept: steps" in header and "draft i: P(kept)" in header
        lines = str(app.query_one("#acceptance-bars", Readout).render()).splitlines()
        assert [line.split()[0] for line in lines] == [str(a) for a in range(k + 1)]
        rows = app.query_one("#acceptance-rows")
        in_view = set(range(rows.size.height))
        subtitle = app.query_one("#acceptance").border_subtitle
        if k + 1 <= rows.size.height:
            assert not subtitle
        else:
            assert subtitle == f"rows 0–{rows.size.height - 1} of 0–{k} ↓ wheel or shift+tab"
            await pilot.press("shift+tab")
            assert app.focused is rows
            while round(rows.scroll_y) < rows.max_scroll_y:
                await pilot.press("pagedown")
                await pilot.pause()
                first = round(rows.scroll_y)
                in_view |= set(range(first, first + rows.size.height))
            subtitle = app.query_one("#acceptance").border_subtitle
            assert subtitle == f"rows {first}–{k} of 0–{k} ↑"
        assert in_view >= set(range(k + 1))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_footer_shows_every_dashboard_key(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        shown = footer_keys(app)
        for key in ("?", "q", "g", "s", "+/-", "v", "space", "n", "e", "/", ENTER):
            assert shown.get(key), f"{key} not on the footer at {size}: {shown}"


async def test_footer_while_typing_a_prompt_shows_the_prompt_keys_only():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await pilot.pause()
        shown = footer_keys(app)
        assert "+/-" not in shown and "g" not in shown and "n" not in shown and "/" not in shown
        assert shown.get(ENTER) and shown.get("esc")
        await pilot.press("escape")
        await pilot.pause()
        assert footer_keys(app).get("g")


async def test_a_paused_session_shows_no_current_rate():
    paused = ControlChange(t_ns=2_300_000_000, name="paused", old="False", new="True",
                           applied_step=60)  # fmt: skip
    app = make_app([*fake_session(seed=7), paused])
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        numbers = text_of(app.query_one("#throughput-numbers"))
        row = next(line for line in numbers.splitlines() if line.startswith("1 s"))
        assert "paused" in row and not any(c.isdigit() for c in row[3:]), numbers


async def test_enter_opens_a_divergence_from_anywhere_and_the_footer_says_so():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.set_focus(None)  # focus elsewhere: no Tab needed to reach the table
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DivergenceDetail)
        await pilot.press("escape")
        await pilot.pause()
        assert "Enter" in text_of(app.query_one("#divergence-count"))


async def test_enter_is_not_offered_without_a_divergence():
    app = make_app(fake_session(seed=7, divergence_at=None))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert ENTER not in footer_keys(app)


def cpu_session() -> list:
    """The fake session as the CPU's header has it: one GEMM backend, `torch`, whose exact
    GEMM is the compiled C loop."""
    events = fake_session(seed=7)
    config = events[0].config | {"gemm_kernel": "C loop"}
    torch_only = [GemmChoice(name="torch")]
    events[0] = events[0].model_copy(
        update={"config": config, "gemm_backend": "torch", "gemm_backends": torch_only}
    )
    return [e.model_copy(update={"gemm_backend": "torch"}) if hasattr(e, "gemm_backend") else e
            for e in events]  # fmt: skip


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_one_gemm_backend_the_footer_says_so_and_the_status_bar_names_the_kernel(size):
    app = make_app(cpu_session())
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        footer = {k.key_display or k.key: k for k in app.screen.query("FooterKey")}
        assert "1 GEMM" in str(footer["g"].render())
        assert footer_keys(app).get("g") and footer_keys(app).get("/")  # all still fit
        assert "GEMM C loop (torch)" in text_of(app.query_one("#status"))
        await pilot.press("g")
        assert app.notes[-1] == "torch is the only GEMM backend available here"


async def test_several_gemm_backends_keep_the_switch_in_the_footer():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        footer = {k.key_display or k.key: k for k in app.screen.query("FooterKey")}
        assert "GEMM" in str(footer["g"].render()) and "only" not in str(footer["g"].render())
        assert "GEMM rowwise " in text_of(app.query_one("#status"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_toast_leaves_the_token_streams_border_alone(size):
    app = SpecdashApp(ScriptedSource.live_like(fake_session(seed=7)))
    async with app.run_test(size=size, notifications=True) as pilot:
        await settle(pilot)
        app.notify("k → 5 (applies at the next step)")
        await pilot.pause(0.3)
        (toast,) = app.screen.query("Toast")
        tokens = app.query_one("#tokens").region
        inside = tokens.shrink((1, 1, 1, 1))  # the panel less its border
        assert inside.contains_region(toast.region), (toast.region, tokens)
