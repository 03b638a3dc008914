"""`specdash replay`: the live dashboard, unchanged, over a `TraceReplay`.

Only playback is added: engine control keys stay and say "read-only". Space plays and
pauses, `.` steps one verify step, `,` steps back, `[` / `]` seek 10 s, `<` / `>` halve or
double the speed, `0` restarts, `n` jumps to the next prompt. The bar above the footer says
where in the recording the replay is (recorded seconds), and where a cut-off recording ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding

from specdash.events import Event, Summary
from specdash.trace.event_log import EventLog
from specdash.trace.replay import TraceReplay
from specdash.ui.app import CONTROL_ACTIONS, TEARDOWN, SpecdashApp
from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.fitted_lines import FittedLines, Part

TICK_HZ = 30
SEEK_S = 10.0
REFUSED = [
    c
    for c in CONTROL_ACTIONS
    if c[1]
    in (
        "cycle_gemm",
        "toggle_speculation",
        "k_up",
        "k_down",
        "toggle_verify",
        "type_prompt",
        "export_trace",
    )
]
"""Keys a replay answers with a note: the engine controls, and `e` (a replay writes nothing:
the trace it plays is already the recording)."""


class ReplayApp(SpecdashApp):
    CSS = """
    #replay-bar { height: 1; padding: 0 1; background: $boost; }
    #prompt { display: none; }
    """
    """The bar says where the replay is; a recording takes no typed prompt."""
    # one word a key: the footer holds them all beside the palette's at 100 columns
    BINDINGS = [
        Binding("space", "toggle_pause", "play"),
        Binding("full_stop", "step", "step"),
        Binding("comma", "step_back", "back"),
        Binding("left_square_bracket", f"seek({-SEEK_S})", f"-{SEEK_S:g} s"),
        Binding("right_square_bracket", f"seek({SEEK_S})", f"+{SEEK_S:g} s"),
        Binding("less_than_sign", "speed(0.5)", "slow"),
        Binding("greater_than_sign", "speed(2)", "fast"),
        Binding("0", "restart", "restart"),
        # the engine controls a replay refuses: still answered ("read-only"), not advertised
        *(Binding(key, action, label, show=False) for key, action, label, _ in REFUSED),
    ]

    def __init__(self, replay: TraceReplay, name: str, warnings: Sequence[str] = ()) -> None:
        super().__init__(source=replay)
        self.replay = replay
        # never more events between two drains of the buffer than it holds (half, for a late
        # timer): a dense trace at a high speed plays slower instead of losing events
        replay.max_per_tick = max(1, int(self.buffer.capacity * self._ui_hz / TICK_HZ / 2))
        header_s = replay.events[0].t_ns / 1e9
        self.clock = lambda: header_s + replay.position_s  # trace time: stops while paused
        self.trace_name = name
        self._warnings = list(warnings)
        self._bar_line: list[Part] = []

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield FittedLines(id="replay-bar")

    def on_mount(self) -> None:
        self.set_interval(1 / TICK_HZ, self.tick)
        for warning in self._warnings:
            self.notify(warning, severity="warning", timeout=10)

    def tick(self) -> None:
        self.replay.tick()
        self._show_position()

    def _show_position(self) -> None:
        """Where the replay is, fitted to the terminal (the keys are in the footer): at 100
        columns the trace's name and the position stay whole, the words around them go."""
        r = self.replay
        if r.finished:
            cut = "" if isinstance(r.events[-1], Summary) else ": recording cut off here"
            recorded = f"  {r.duration_s:.2f} s recorded"
            where = [
                Part(f"■ end{cut}"),
                Part(recorded, shorter=((0, f"  {r.duration_s:.2f} s"),)),
                Part(f"  {len(r.events)} events", shorter=((1, ""),)),
            ]
        else:
            share = r.position_s / r.duration_s if r.duration_s else 1.0
            at = f"  {r.position_s:.2f}/{r.duration_s:.2f} s"
            where = [
                Part(f"{'▶' if r.playing else '❚❚'}"),
                Part(f"{at} recorded ({share:.0%})", shorter=((0, f"{at} ({share:.0%})"),)),
                Part(f"  {r.speed:g}x"),
                Part(f"  event {r.cursor}/{len(r.events)}", shorter=((1, ""),)),
            ]
        line = [Part("REPLAY "), Part(self.trace_name, elastic=True), Part("  "), *where]
        if line != self._bar_line and self.screen_stack:
            with TEARDOWN:  # a tick while the app quits finds the bar gone
                self.dashboard.query_one("#replay-bar", FittedLines).show_lines([line])
                self._bar_line = line

    def show_history(self, history: list[Event]) -> None:
        """Rebuild every panel from the session's start up to the new position."""
        self.buffer.drain()  # already inside `history`
        self.model = DashboardModel(revision=self.model.revision + 1)
        self.event_log = EventLog()  # not recorded again: a recording has them already
        for event in history:
            self.model.consume(event)
            self.event_log.append(event)
        self.refresh_numbers()
        self.refresh_plots()
        self._show_position()

    def action_export_trace(self) -> None:
        self.notify(
            "read-only: a replay writes nothing, the trace is the recording "
            "(specdash export converts it)",
            severity="warning",
        )

    # -- playback keys (the live app's pause and next-prompt keys drive the replay) ----

    def action_toggle_pause(self) -> None:
        if self.replay.finished:
            self.action_restart()
        else:
            self.replay.toggle()
        self._show_position()

    def action_step(self) -> None:
        self.replay.step()
        self._show_position()

    def action_step_back(self) -> None:
        self.show_history(self.replay.step_back())

    def action_seek(self, seconds: float) -> None:
        self.show_history(self.replay.seek(self.replay.position_s + seconds))

    def action_restart(self) -> None:
        self.show_history(self.replay.seek(0.0))
        self.replay.play()

    def action_next_prompt(self) -> None:
        self.show_history(self.replay.seek(self.replay.next_prompt_s()))

    def action_speed(self, factor: float) -> None:
        self.replay.set_speed(min(64.0, max(1 / 64, self.replay.speed * factor)))
        self._show_position()
