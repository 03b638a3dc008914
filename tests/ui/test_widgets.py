"""Widget pieces that keep the dashboard cheap: plot point reduction, the token stream's tail,
readouts that skip the screen-wide layout pass when their height stays put, lines that fit
their width."""

from __future__ import annotations

import random

from fake_events import ScriptedSource, fake_session

from specdash.events import Token
from specdash.ui.app import SpecdashApp
from specdash.ui.widgets.fitted_lines import Part, cut_middle, fit
from specdash.ui.widgets.readout import Readout
from specdash.ui.widgets.series_plot import envelope

SIZE = (160, 48)


def test_envelope_keeps_each_columns_extremes_in_order():
    rng = random.Random(3)
    xs = list(range(600))
    ys = [rng.randint(0, 4) for _ in xs]
    ys[123], ys[456] = -5, 9
    px, py = envelope(xs, ys, columns=76)
    assert len(px) <= 2 * 76
    assert px == sorted(px) and set(px) <= set(xs)
    points = list(zip(px, py, strict=True))
    assert all(ys[x] == y for x, y in points)
    assert (123, -5) in points and (456, 9) in points
    for c in range(76):  # every column's min and max survive
        lo, hi = c * 600 // 76, (c + 1) * 600 // 76
        kept = [y for x, y in points if lo <= x < hi]
        assert min(kept) == min(ys[lo:hi]) and max(kept) == max(ys[lo:hi])


def test_envelope_leaves_a_short_series_alone():
    xs, ys = range(10, 40), [float(i % 3) for i in range(30)]
    assert envelope(xs, ys, columns=76) == (list(xs), ys)


async def settle(pilot):
    await pilot.pause()
    pilot.app.refresh_numbers()
    await pilot.pause()


async def test_token_stream_shows_the_tail_at_a_fixed_height():
    events = fake_session(prompts=1)
    app = SpecdashApp(ScriptedSource.live_like(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        view = app.query_one("#token-text", Readout)
        height = view.size.height
        last = next(e for e in reversed(events) if isinstance(e, Token))
        for i in range(2000):  # far more text than the panel holds
            word = "END" if i == 1999 else f" w{i}"
            app.buffer.put(last.model_copy(update={"position": 1000 + i, "text": word}))
        await settle(pilot)
        assert view.size.height == height  # the panel did not grow or scroll
        shown = str(view.render())
        assert shown.rstrip().endswith("END") and " w1998" in shown
        assert shown.count("\n") < height


async def test_a_number_change_needs_no_layout_pass():
    app = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        numbers = app.query_one("#acceptance-numbers", Readout)
        text = str(numbers._shown)
        numbers.show_text(text.replace("verify steps", "verify steps "))
        assert not numbers._height_changed()
        numbers.show_text(text + "\nanother line")
        assert numbers._height_changed()


def test_a_line_gives_up_its_lowest_ranks_first_and_each_rank_at_once():
    parts = [
        Part("engine ", shorter=((2, ""),)),
        Part("native"),
        Part("  model ", shorter=((2, "  "),)),
        Part("embedded"),
        Part(" (session)", shorter=((1, ""),)),
        Part("  cpu (x86_64, 2 threads)", shorter=((3, "  cpu, 2 threads"),)),
    ]
    assert (
        fit(parts, 80).plain == "engine native  model embedded (session)  cpu (x86_64, 2 threads)"
    )
    assert fit(parts, 60).plain == "engine native  model embedded  cpu (x86_64, 2 threads)"
    assert fit(parts, 45).plain == "native  embedded  cpu (x86_64, 2 threads)"  # both labels
    assert fit(parts, 31).plain == "native  embedded  cpu, 2 threads"  # too long, all taken


def test_a_name_is_cut_in_its_middle_only_once_nothing_else_shortens():
    name = "specdash-20261207-151800.jsonl"
    parts = [Part("recording ", shorter=((0, ""),)), Part(name, "dim", elastic=True)]
    assert fit(parts, 40).plain == f"recording {name}"
    assert fit(parts, 30).plain == name
    cut = fit(parts, 20)
    assert cut.plain == cut_middle(name, 20) == "specdash-2…800.jsonl"
    assert cut.spans[0].style == "dim"


async def test_a_resized_terminal_refits_the_status_bar():
    app = SpecdashApp(ScriptedSource.live_like(fake_session()))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        bar = app.query_one("#status")
        assert str(bar.render()).splitlines()[1].startswith("engine native  model tiny-fake")
        await pilot.resize_terminal(70, 20)
        await pilot.pause()
        assert str(bar.render()).splitlines()[1].startswith("native  tiny-fake  draft model")
