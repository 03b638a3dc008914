"""Divergence panel: each prompt's verdict, one mark per prompt (a batch runs several at once),
and every flagged (prompt, position) in a table; Enter opens the detail.

The detail shows both tokens, both logprobs with their exact bits (the guarantee is about
bits, so the hex form is what settles a logprob divergence), the text around the position
and the root-cause layer and sub-op when the engine found one.
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from specdash.events import Divergence
from specdash.ui.dashboard_model import DashboardModel, Verdict
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.readout import Readout

COLUMNS = ("p", "tok", "what", "spec", "shadow", "k", "verify", "GEMM", "gap", "root cause")
NARROW_COLUMNS = ("p", "tok", "what", "spec", "shadow", "root cause")
"""Below WIDE_WIDTH (a 100-column terminal) k, verify, GEMM and the shadow's margin give way
(the detail has them) and the text cells are cut, so that every column shown fits."""
WIDE_WIDTH = 70
NARROW_TEXT = 8
NARROW_CAUSE = 12


MARKS: dict[Verdict, tuple[str, str]] = {
    "running": ("•", "bold yellow"),
    "exact": ("✓", "green"),
    "diverged": ("✗", "bold red"),
    "unchecked": ("·", "dim"),
}


def requests_text(m: DashboardModel, width: int) -> Text:
    """One mark per prompt in the order they started, the latest that fit in `width`, and how
    many are in flight."""
    verdicts = list(m.requests.values())
    running = verdicts.count("running")
    text = Text("requests ", style="dim")
    tail = f"  {running} in flight" if running else ""
    room = max(2, width - len(text) - len(tail))
    if not verdicts:
        text.append("–")
    elif len(verdicts) > room:
        text.append("…", style="dim")
        verdicts = verdicts[len(verdicts) - room + 1 :]
    for verdict in verdicts:
        mark, style = MARKS[verdict]
        text.append(mark, style=style)
    text.append(tail)
    return text


def root_cause_label(d: Divergence) -> str:
    rc = d.root_cause
    if rc is None:
        return "–"
    if rc.reproduced is False:
        return "not reproduced"
    layer = "?" if rc.layer is None else str(rc.layer)
    return f"L{layer} {rc.sub_op}"


def prefix_cached_text(cached: tuple[int, int]) -> str:
    """The prompt tokens each engine read from its prefix cache, and what unequal counts mean."""
    spec, shadow = cached
    text = f"{spec} prompt tokens cached (spec), {shadow} (shadow)"
    return text + (": the prefills differed" if spec != shadow else "")


def margin_text(d: Divergence) -> str:
    """The shadow's top-1 / top-2 margin at the divergence, and what it says."""
    if d.shadow_margin is None:
        return "not known (this engine does not report the shadow's top two)"
    return d.shadow_margin.text(flipped=d.what == "token")


def margin_cell(d: Divergence) -> str:
    """The table's word for the margin (the detail gives the gap and its ulps)."""
    m = d.shadow_margin
    return "–" if m is None else "tie" if m.near_tie else "wide"


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def row(d: Divergence, narrow: bool) -> tuple[str, ...]:
    spec = repr(d.spec_text or str(d.spec_token))
    shadow = repr(d.shadow_text or str(d.shadow_token))
    cause = root_cause_label(d)
    if narrow:
        return (
            str(d.prompt_index),
            str(d.position),
            d.what,
            cut(spec, NARROW_TEXT),
            cut(shadow, NARROW_TEXT),
            cut(cause, NARROW_CAUSE),
        )
    return (
        str(d.prompt_index),
        str(d.position),
        d.what,
        spec,
        shadow,
        str(d.k),
        d.verify_mode,
        d.gemm_backend,
        margin_cell(d),
        cause,
    )


class DivergenceTable(DataTable):
    """The table, its Enter named in the footer (DataTable's own hides it) once there is a
    row to open."""

    BINDINGS = [Binding("enter", "select_cursor", "detail")]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.row_count > 0 if action == "select_cursor" else True


class DivergencePanel(Panel):
    TITLE, ID = "divergence", "divergence"
    _shown = 0
    """Divergences ever added to the table (its row keys are 0.._shown-1)."""
    _narrow = False
    _model: DashboardModel | None = None

    def compose(self) -> ComposeResult:
        yield Readout("requests –", id="requests")
        yield Readout("divergences (session): none", id="divergence-count")
        table = DivergenceTable(id="divergence-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table

    def on_resize(self) -> None:
        if self._model is not None:  # the marks that fit depend on the width
            self.show_requests(self._model)
        narrow = 0 < self.size.width < WIDE_WIDTH
        if narrow == self._narrow:
            return
        self._narrow = narrow
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns(*(NARROW_COLUMNS if narrow else COLUMNS))
        self._shown = 0
        if self._model is not None:
            self._shown = self._model.divergence_count - len(self._model.divergences)
            self.show_numbers(self._model)

    def show_numbers(self, m: DashboardModel) -> None:
        """Append rows for new divergences; start over when the model did (a replay seek).

        Row i is always `m.divergences[i]`: rows the model evicted are removed too.
        """
        self._model = m
        table = self.query_one(DataTable)
        if m.divergence_count < self._shown:
            table.clear()
            self._shown = 0
        new = m.divergence_count - self._shown
        for d in list(m.divergences)[-new:] if new else []:
            table.add_row(*row(d, self._narrow), key=str(self._shown))
            self._shown += 1
        if new and table.row_count == new:
            table.refresh_bindings()  # the first row: Enter now opens something
        while table.row_count > len(m.divergences):
            table.remove_row(str(self._shown - table.row_count))
        count = m.divergence_count
        label = "none" if count == 0 else f"{count}   Enter: detail"
        self.query_one("#divergence-count", Readout).show_text(f"divergences (session): {label}")
        self.show_requests(m)

    def show_requests(self, m: DashboardModel) -> None:
        self.query_one("#requests", Readout).show_text(requests_text(m, self.content_size.width))

    def selected(self, m: DashboardModel) -> Divergence | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return list(m.divergences)[table.cursor_row]


class DivergenceDetail(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter,q", "dismiss", "close")]

    def __init__(self, divergence: Divergence) -> None:
        super().__init__()
        self.divergence = divergence

    def compose(self) -> ComposeResult:
        d = self.divergence
        rc = d.root_cause
        if rc is None:
            cause = "not analysed"
        else:
            found = f"layer {rc.layer}, {escape(rc.sub_op)}, max |diff| {rc.max_abs_diff:.3g}"
            cause = root_cause_label(d) if rc.reproduced is False else found
            cause += f"\n  {escape(rc.detail)}" if rc.detail else ""
            origin = rc.origin_text(d.position)
            cause += f"\n  {escape(origin)}" if origin else ""
        lines = [
            f"[b]Divergence[/b] prompt {d.prompt_index}, token {d.position}, step {d.step} "
            f"({d.what} differs)",
            f"k {d.k}   verify {d.verify_mode}   GEMM {escape(d.gemm_backend)}",
            "",
            f"[b]spec  [/b] token {d.spec_token:>7} {escape(repr(d.spec_text))}   "
            f"logprob {d.spec_logprob!r} ({d.spec_logprob.hex()})",
            f"[b]shadow[/b] token {d.shadow_token:>7} {escape(repr(d.shadow_text))}   "
            f"logprob {d.shadow_logprob!r} ({d.shadow_logprob.hex()})",
            "",
            f"[b]shadow margin[/b] {escape(margin_text(d))}",
            f"[b]root cause[/b] {cause}",
            *(
                [f"[b]prefix cache[/b] {prefix_cached_text(d.prefix_cached)}"]
                if d.prefix_cached is not None
                else []
            ),
            "",
            "[b]context[/b]",
            escape(d.context) or "–",
            "",
            "[dim]Esc to close[/dim]",
        ]
        with VerticalScroll(id="divergence-detail"):
            yield Static("\n".join(lines))
