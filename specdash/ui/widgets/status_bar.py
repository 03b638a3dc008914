"""Status bar: the exactness verdict so far and the session's progress on the first line,
what is running (engine, model, drafter, k, verify mode, GEMM backend, device) on the second."""

from __future__ import annotations

from rich.text import Text

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.readout import Readout


class StatusBar(Readout):
    def show(self, m: DashboardModel, paused: bool, recording: str = "") -> None:
        """`paused`: what the user asked for live (the engine pauses at its next step), or the
        recorded state in a replay."""
        text = Text()
        verdict_style = "bold white on red" if m.first_divergence else "bold black on green"
        text.append(f" {m.exactness} ", style=verdict_style)
        text.append("  ")
        for flag, on in (("PAUSED", paused), ("FINISHED", m.finished)):
            if on:
                text.append(f" {flag} ", style="bold black on yellow")
                text.append("  ")
        prompt = "–" if m.prompt_index is None else str(m.prompt_index)
        text.append("prompt ", style="dim")
        text.append(f"{prompt}  ", style="bold")
        text.append(f"{m.prompts_done} done, {m.exact_prompts} exact (session)  ")
        text.append(recording, style="dim")
        text.append("\n")
        fields = [
            ("engine", m.engine),
            ("model", m.model),
            ("drafter", m.drafter if m.speculation else "off (no speculation)"),
            ("k", str(m.k)),
            ("verify", m.verify_mode),
            ("GEMM", m.gemm_backend),
            ("device", m.device),
        ]
        for name, value in fields:
            text.append(f"{name} ", style="dim")
            text.append(f"{value}  ", style="bold")
        self.show_text(text)
