"""The specdash dashboard: one Textual app over any event source (live session or replay).

Threads never touch widgets. Producers (engine, GPU sampler, replay) put events into an
`EventBuffer`; a 1 Hz timer drains it into the `DashboardModel` and updates the numbers (a key
redraws them at once), a 0.5 Hz timer redraws the plots, and each only when something changed.
Slow on purpose: the engine runs in a process of its own (`LiveSession`), but on a machine
with few cores the UI's CPU is still the engine's (docs/PERF.md, the dashboard's cost). Keys write
`Controls`, which the engine reads at its next step and answers with a `ControlChange` event.
The same timer hands each event to a `TraceRecorder` (`--trace`, and `e` to export
mid-session); the app only shows what it says. `specdash.cli.dashboard` builds the app from the
command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path

from textual import events, on
from textual.actions import SkipAction
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from specdash.controls import Controls
from specdash.errors import EXIT_INTERRUPTED
from specdash.events import EngineError, Event
from specdash.settings import MAX_K
from specdash.trace.event_log import EventLog
from specdash.trace.jsonl import TraceWriter
from specdash.trace.recorder import Notice, TraceRecorder
from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.sources import EventBuffer, EventSource
from specdash.ui.widgets.acceptance import AcceptancePanel
from specdash.ui.widgets.divergence import DivergenceDetail, DivergencePanel
from specdash.ui.widgets.error_panel import ErrorPanel
from specdash.ui.widgets.gpu import GpuPanel
from specdash.ui.widgets.help_screen import HelpScreen
from specdash.ui.widgets.panel import Panel
from specdash.ui.widgets.prompt_input import PromptInput
from specdash.ui.widgets.status_bar import StatusBar, changes_text, still_asked
from specdash.ui.widgets.throughput import ThroughputPanel
from specdash.ui.widgets.token_stream import TokenStream

UI_HZ = 1
PLOT_HZ = 0.5
TEARDOWN = contextlib.suppress(NoMatches)
"""A timer tick while the app quits finds the panels gone: nothing left to draw."""
PANELS: tuple[type[Panel], ...] = (
    ThroughputPanel,
    AcceptancePanel,
    GpuPanel,
    DivergencePanel,
    TokenStream,
)
"""The grid's panels in reading order (app.tcss places them): each redraws itself."""
MIN_SIZE = (100, 30)
"""Below this the panels cannot show their numbers; the app says so instead of drawing."""

CONTROL_ACTIONS = (
    ("g", "cycle_gemm", "GEMM", "Cycle the GEMM backend (next step)"),
    ("s", "toggle_speculation", "spec", "Speculation on / off (next step)"),
    ("plus", "k_up", "k+", "Draft one more token per verify step (next step)"),
    ("minus", "k_down", "k-", "Draft one token fewer per verify step (next step)"),
    ("v", "toggle_verify", "verify", "Verify mode exact / fast (next step)"),
    ("space", "toggle_pause", "pause", "Pause / resume the engine"),
    ("n", "next_prompt", "next", "Skip to the next prompt"),
    ("e", "export_trace", "export", "Export the session to a JSONL trace, keep recording"),
    ("slash", "type_prompt", "prompt", "Type a prompt of your own"),
    ("question_mark", "help", "help", "Keys and a glossary of every metric"),
    ("q", "quit", "quit", "Quit specdash"),
)
"""(key, action, footer label, what it does: the palette entry and the help)."""

FOOTER_FIRST = ("help", "quit")
TYPED_OVER = {action for key, action, _, _ in CONTROL_ACTIONS} | {"show_divergence"}
"""Actions whose keys a prompt being typed takes as text (Ctrl+P and the prompt's own keys
still act)."""
FOOTER_SHOWS: dict[str, dict] = {
    "k_up": {"key_display": "+/-", "description": "k"},
    "k_down": {"show": False},
    "type_prompt": {"priority": True},
}
"""`+` and `-` share one footer entry. `/` is handled before the key after it is passed on,
so text typed right behind it lands in the prompt line (a non-priority binding runs only
once the focused widget has passed `/` back, by when the next keys have gone there too)."""


class SpecdashApp(App[int]):
    """`SpecdashApp(source=...)`: the dashboard over any `specdash.ui.sources.EventSource`."""

    CSS_PATH = "app.tcss"
    TITLE = "specdash"
    AUTO_FOCUS = "#divergence-table"
    BINDINGS = [
        *sorted(
            (
                Binding(key, action, **({"description": label} | FOOTER_SHOWS.get(action, {})))
                for key, action, label, _ in CONTROL_ACTIONS
            ),
            key=lambda b: b.action not in FOOTER_FIRST,
        ),
        Binding("enter", "show_divergence", "detail"),
        # Textual's own Ctrl-C only says "press ctrl+q"; a terminal program stops (README)
        Binding("ctrl+c", "interrupt", show=False, system=True),
    ]
    """In CONTROL_ACTIONS order, but help and quit first: a narrow footer cuts the tail. Enter
    opens the selected divergence wherever the focus is (the table's own Enter does too)."""

    def __init__(
        self,
        source: EventSource,
        trace_dir: Path | None = None,
        trace_writer: TraceWriter | None = None,
        ui_hz: float = UI_HZ,
        plot_hz: float = PLOT_HZ,
    ) -> None:
        super().__init__()
        self.source = source
        self.trace_dir = trace_dir or Path.cwd()
        self.buffer = EventBuffer()
        self.model = DashboardModel()
        self.recorder = TraceRecorder(trace_writer)
        """Traces of this session: `--trace` from the start, `e` from mid-session."""
        self._ui_hz, self._plot_hz = ui_hz, plot_hz
        self._shown_revision = -1
        self._plotted_revision = -1
        self.clock = time.monotonic
        """Seconds on the events' clock (`time.monotonic`, what `t_ns` counts) for "loading … N
        s" and "prefill … N s"; a replay's is the trace's (tests replace it)."""
        self._phase: tuple[str | None, float] = ("loading", self.clock())
        """What the status bar counts seconds for (loading, a prefill; None: nothing), since."""
        self._gemm_offered = False
        self._asked: tuple[dict[str, object], int] = ({}, 0)
        """Control changes not yet applied (`still_asked`), and the errors seen when asked."""

    @property
    def event_log(self) -> EventLog:
        """The session's bounded memory, what an export mid-session is built from."""
        return self.recorder.log

    @event_log.setter
    def event_log(self, log: EventLog) -> None:
        self.recorder.log = log

    @property
    def trace_writer(self) -> TraceWriter | None:
        """The trace recording now, if any."""
        return self.recorder.writer

    # -- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield ErrorPanel(id="error")
        with Grid(id="main"):
            yield from (panel() for panel in PANELS)
        yield Static(id="too-small")
        yield PromptInput(placeholder="/ to type a prompt, Enter queues it, Esc leaves",
                          id="prompt")  # fmt: skip
        yield Footer(compact=True)

    @property
    def dashboard(self) -> Screen:
        """The screen with the panels (a modal may be on top of it)."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        self._fit_to_terminal(self.size.width, self.size.height)
        self.set_interval(1 / self._ui_hz, self.refresh_numbers)
        self.set_interval(1 / self._plot_hz, self.refresh_plots)
        self.source.start(self.buffer.put)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_to_terminal(event.size.width, event.size.height)

    def _fit_to_terminal(self, width: int, height: int) -> None:
        too_small = width < MIN_SIZE[0] or height < MIN_SIZE[1]
        self.dashboard.set_class(too_small, "-too-small")  # app.tcss: all but the line, hidden
        if too_small:
            message = self.dashboard.query_one("#too-small", Static)
            message.update(
                f"terminal too small: {width}x{height}, specdash needs at least "
                f"{MIN_SIZE[0]}x{MIN_SIZE[1]} (q quits)"
            )

    # -- event flow --------------------------------------------------------------------

    def refresh_numbers(self) -> None:
        """Drain the buffer into the model and redraw every number that changed (UI_HZ)."""
        ended = not getattr(self.source, "running", True)  # before the drain: no event after
        self._consume(self.buffer.drain())
        if ended and not self.model.finished and not self.model.errors:
            gone = "the engine ended without finishing the session"
            self._consume([EngineError(message=gone, engine_lost=True)])
        if not self.screen_stack:
            return  # a tick while the app quits: the screens are gone, the events are recorded
        m, screen = self.model, self.dashboard
        phase = None if m.finished or m.errors else "loading" if not m.started else m.prefill
        if phase != self._phase[0]:  # a prefill counts from its prompt's start event
            began = m.prefill_t_ns / 1e9 if m.started and phase is not None else self.clock()
            self._phase = (phase, began)
        if m.revision == self._shown_revision and phase is None:
            return  # nothing new, and no seconds counting on the status bar
        self._shown_revision = m.revision
        controls = self.source.controls
        paused = m.paused if controls is None else controls.snapshot().paused
        if m.started and not self._gemm_offered:
            self._offer_gemm()
        asked = still_asked(m, *self._asked)
        self._asked = (asked, self._asked[1])
        recording, path = self.recorder.note, self.recorder.path
        if path is not None:  # its name fits 100 columns; the toast has its path
            recording = recording.replace(str(path), path.name)
        with self.batch_update(), TEARDOWN:
            screen.query_one(StatusBar).show(
                m,
                paused,
                recording,
                self.recorder.brief,
                loading=getattr(self.source, "loading", "waiting for the first event"),
                phase_s=max(0.0, self.clock() - self._phase[1]),
                asked=asked,
            )
            screen.query_one(ErrorPanel).show(m.errors, self.recorder.note)
            for panel in screen.query(Panel):
                panel.show_numbers(m)

    def _consume(self, events: list[Event]) -> None:
        for event in events:
            self.model.consume(event)
            if (notice := self.recorder.consume(event)) is not None:
                self._tell(notice)

    def refresh_plots(self) -> None:
        """Redraw the plots if anything changed (PLOT_HZ); skipped while they are hidden."""
        if not self.screen_stack:
            return
        m, screen = self.model, self.dashboard
        with self.batch_update(), TEARDOWN:
            if m.revision == self._plotted_revision or not screen.query_one("#main").display:
                return
            self._plotted_revision = m.revision
            for panel in screen.query(Panel):
                panel.show_plot(m)

    # -- controls ----------------------------------------------------------------------

    def _controls(self) -> Controls | None:
        """The live controls, or None with a note saying why there are none to change."""
        if self.source.controls is None:
            self.notify("read-only: this session is a replay", severity="warning")
            return None
        ended = "finished" if self.model.finished else None
        if any(e.fatal for e in self.model.errors):
            ended = "ended with an engine error"
        if ended:
            self.notify(f"the session has {ended}: there is no next step to apply this to")
            return None
        return self.source.controls

    def _change(self, **changes: object) -> None:
        controls = self._controls()
        if controls is None:
            return
        controls.update(**changes)
        self._asked = (self._asked[0] | changes, len(self.model.errors))
        self._shown_revision = -1  # the status bar says it now, not at the next tick
        self.refresh_numbers()
        # one note for what is pending: seven `+` presses make one note, not seven stacked
        # over the panels (the status bar shows the whole pending change as well)
        self.clear_notifications()
        self.notify(f"{changes_text(changes)} (applies at the next step)")

    def _offer_gemm(self) -> None:
        """With a single GEMM backend (the CPU's) `g` has nothing to cycle: its footer entry
        says so ("1 GEMM", short enough for the 100-column footer) instead of offering a switch."""
        self._gemm_offered = True
        if self.source.controls is None or len(self.model.gemm_backends) > 1:
            return
        table = self._bindings.key_to_bindings
        table["g"] = [dataclasses.replace(b, description="1 GEMM") for b in table.get("g", [])]
        self.refresh_bindings()

    def action_cycle_gemm(self) -> None:
        controls = self._controls()
        if controls is None:
            return
        backends = self.model.gemm_backends
        current = controls.snapshot().gemm_backend
        if current not in backends:  # "auto": the engine says what it resolved to
            current = self.model.gemm_backend
        if len(backends) < 2:
            self.notify(f"{current} is the only GEMM backend available here", severity="warning")
            return
        index = backends.index(current) if current in backends else -1
        self._change(gemm_backend=backends[(index + 1) % len(backends)])

    def action_toggle_speculation(self) -> None:
        if (controls := self._controls()) is not None:
            self._change(speculation=not controls.snapshot().speculation)

    def action_k_up(self) -> None:
        self._step_k(+1)

    def action_k_down(self) -> None:
        self._step_k(-1)

    def _step_k(self, delta: int) -> None:
        if (controls := self._controls()) is None:
            return
        k = controls.snapshot().k + delta
        if not 1 <= k <= MAX_K:
            self.notify(f"k stays in 1..{MAX_K}", severity="warning")
            return
        self._change(k=k)

    def action_toggle_verify(self) -> None:
        if (controls := self._controls()) is not None:
            mode = "fast" if controls.snapshot().verify_mode == "exact" else "exact"
            self._change(verify_mode=mode)

    def action_toggle_pause(self) -> None:
        if (controls := self._controls()) is not None:
            self._change(paused=not controls.snapshot().paused)

    def action_next_prompt(self) -> None:
        if (controls := self._controls()) is not None:
            if self.model.idle:
                self.notify("no prompt is running: / types one")
                return
            controls.request_next_prompt()
            self.notify("next prompt requested (applies at the next step)")

    def action_type_prompt(self) -> None:
        """Focus the prompt line at once (`Widget.focus` waits for the message queue, and the
        keys typed right behind `/` would act as dashboard keys before it applies). In the
        prompt line `/` is text: the key goes on to it."""
        prompt = self.dashboard.query_one("#prompt", Input)
        if self.dashboard.focused is prompt:  # (`has_focus` follows a message later)
            raise SkipAction()
        if self._controls() is not None:
            self.dashboard.set_focus(prompt)

    @on(Input.Submitted, "#prompt")
    def queue_prompt(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:  # the line stays open, so the person sees why nothing happened
            event.input.clear()
            self.notify(
                "the prompt is empty: type one, then Enter (Esc leaves)", severity="warning"
            )
            return
        event.input.clear()
        self.dashboard.query_one(DataTable).focus()
        if (controls := self._controls()) is None:
            return
        controls.submit_prompt(text)
        when = "now" if self.model.idle else "after the current prompt"
        self.notify(f"prompt queued: decoded {when}")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a prompt is being typed its keys are letters, so the footer shows only the
        prompt's own keys; Enter opens a divergence only when there is one."""
        if self.screen_stack and self.dashboard.query_one("#prompt", Input).has_focus:
            return action not in TYPED_OVER
        if action == "show_divergence":
            return self.model.divergence_count > 0
        return True

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()

    def on_descendant_blur(self) -> None:
        self.refresh_bindings()

    def action_show_divergence(self) -> None:
        self.show_divergence()

    def action_export_trace(self) -> None:
        """Record the session to a new trace and keep recording (`TraceRecorder.export`)."""
        notice, announce = self.recorder.export(self.trace_dir, self.model.next_step)
        if announce is not None:
            self.buffer.put(announce)
        self._tell(notice)

    def _tell(self, notice: Notice) -> None:
        self.notify(notice.text, severity=notice.severity)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.exit(self.exit_code)

    def action_interrupt(self) -> None:
        """Ctrl-C (no text selected: then it copies): stop, exit 130; the trace so far is
        kept, closed as on `q`."""
        self.exit(EXIT_INTERRUPTED)

    @property
    def exit_code(self) -> int:
        """What the session came to, as the README's exit codes: the code of the fatal engine
        error that ended it (1 for an unexpected exception), 4 when a recording stopped on an
        I/O error, else 0."""
        fatal = next((e for e in self.model.errors if e.fatal), None)
        if fatal is not None:
            return fatal.exit_code if fatal.exit_code is not None else 1
        return self.recorder.exit_code

    @property
    def exit_message(self) -> str | None:
        """The one line `specdash` prints after the dashboard closes with a non-zero code."""
        fatal = next((e for e in self.model.errors if e.fatal), None)
        return fatal.message if fatal is not None else self.recorder.failure

    def on_unmount(self) -> None:
        """Stop the engine, then record what it sent while ending (the running prompt's end
        and the summary) before the trace closes."""
        self.source.stop()
        self._consume(self.buffer.drain())
        self.recorder.close("quit")

    @on(DataTable.RowSelected, "#divergence-table")
    def show_divergence(self) -> None:
        divergence = self.dashboard.query_one(DivergencePanel).selected(self.model)
        if divergence is not None:
            self.push_screen(DivergenceDetail(divergence))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every key is also a palette entry."""
        yield from super().get_system_commands(screen)
        for key, action, label, help_text in CONTROL_ACTIONS:
            if action != "quit":
                shown = self.get_key_display(Binding(key, action, label))
                yield SystemCommand(
                    f"{help_text} ({shown})", f"key {shown}", getattr(self, f"action_{action}")
                )
