"""Status bar: the exactness verdict so far and the session's progress on the first line,
what is running (engine, model, drafter, k, verify mode, GEMM backend, device) on the second.

Until the session starts it says what is loading and for how long; until the first token
has been compared with the shadow it gives no verdict. Each line is cut at the terminal's
width (app.tcss), the least important text last.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.readout import Readout

NEUTRAL = "bold black on grey70"


def _verdict_style(m: DashboardModel) -> str:
    if m.first_divergence is not None:
        return "bold white on red"
    if m.exactness.startswith("EXACT"):
        return "bold black on green"
    return NEUTRAL


CONTROL_NAMES = {
    "gemm_backend": "GEMM backend",
    "speculation": "speculation",
    "k": "k",
    "verify_mode": "verify mode",
    "paused": "pause",
}


def changes_text(changes: dict[str, object]) -> str:
    """Control changes as a note says them: "k → 5, speculation off" (no Python True/False)."""
    said = {True: "on", False: "off"}
    return ", ".join(
        f"{CONTROL_NAMES[name]} {said[v] if isinstance(v, bool) else f'→ {v}'}"
        for name, v in changes.items()
    )


def still_asked(m: DashboardModel, asked: dict[str, object], errors: int) -> dict[str, object]:
    """The control changes asked for (`asked`, by control name) that the engine has not yet
    reported applied: it applies them at its next step, which an idle or paused engine has not
    taken. A change refused (an error since it was asked, `errors` then) is dropped."""
    if len(m.errors) > errors:
        return {}
    now = {"k": m.k, "verify_mode": m.verify_mode, "gemm_backend": m.gemm_backend,
           "speculation": m.speculation}  # fmt: skip
    return {name: value for name, value in asked.items() if now.get(name, value) != value}


def _value(current: object, asked: dict[str, object], name: str) -> str:
    """A control's value, and the value asked for while it waits for the next step."""
    if name not in asked:
        return str(current)
    new = asked[name]
    return f"{current}→{'off' if new is False else 'on' if new is True else new}"


class StatusBar(Readout):
    def show(
        self,
        m: DashboardModel,
        paused: bool,
        recording: str = "",
        loading: str = "",
        phase_s: float = 0.0,
        asked: dict[str, object] | None = None,
    ) -> None:
        """`paused`: what the user asked for live (the engine pauses at its next step), or the
        recorded state in a replay. `loading`: what is loading before the session starts;
        `phase_s`: seconds the current loading or prefill has taken so far; `asked`: control
        changes waiting for the engine's next step (`still_asked`), shown as "k 4→5"."""
        asked = asked or {}
        text = Text()
        if not m.started and any(e.fatal for e in m.errors):
            text.append(" FAILED ", style="bold white on red")
            text.append(f"  {loading}: stopped by an engine error, shown below", style="bold")
            self.show_text(text)
            return
        if not m.started:
            text.append(" LOADING ", style=NEUTRAL)
            text.append(f"  {loading} … {phase_s:.0f} s\n", style="bold")
            for phase in m.start_phases.values():
                text.append(f"{phase.text} · ", style="bold")
            text.append("the verdict and the numbers appear once the first prompt runs", "dim")
            self.show_text(text)
            return
        text.append(f" {m.exactness} ", style=_verdict_style(m))
        text.append("  ")
        idle = m.idle and not m.finished
        for flag, on in (("PAUSED", paused), ("IDLE", idle), ("FINISHED", m.finished)):
            if on:
                text.append(f" {flag} ", style="bold black on yellow")
                text.append("  ")
        if idle:
            text.append("/ prompt  ", style="bold")  # (the footer's word for it)
        if m.prefill is not None and not m.finished:
            text.append(f"prefill {m.prefill} … {phase_s:.0f} s  ", style="bold")
        elif not idle and not m.finished:  # (nothing runs: no current prompt to name)
            prompt = "–" if m.prompt_index is None else str(m.prompt_index)
            text.append("prompt ", style="dim")
            text.append(f"{prompt}  ", style="bold")
        if recording:  # before the counts: a trace's name stays whole at 100 columns
            text.append(f"{recording}  ", style="dim")
        exact = f"{m.exact_prompts} exact" if m.shadow else "not checked"
        text.append(f"{m.prompts_done} done, {exact} (session)\n")
        model = Path(m.model).name if "/" in m.model else m.model
        drafter = m.drafter if m.speculation else "off (no speculation)"
        if "speculation" in asked:
            drafter = f"{drafter}→{m.drafter if asked['speculation'] else 'off'}"
        fields = [
            ("engine", m.engine),
            ("model", model),
            ("drafter", drafter),
            ("k", _value(m.k, asked, "k")),
            ("verify", _value(m.verify_mode, asked, "verify_mode")),
            ("GEMM", _value(m.gemm_backend, asked, "gemm_backend")),
            ("device", m.device),
        ]
        if m.gemm_kernel and m.verify_mode == "exact" and "gemm_backend" not in asked:
            fields[5] = ("GEMM", f"{m.gemm_kernel} ({m.gemm_backend})")  # what really runs
        if asked:
            fields.append(("", "(at the next step)"))
        for name, value in fields:
            text.append(f"{name} " if name else "", style="dim")
            text.append(f"{value}  ", style="bold")
        self.show_text(text)
