"""Status bar: what is running (engine, model, drafter, k, verify mode, GEMM backend, device)
and the exactness verdict so far."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from specdash.dashboard_model import DashboardModel


class StatusBar(Static):
    def show(self, m: DashboardModel) -> None:
        text = Text()
        fields = [
            ("engine", m.engine),
            ("model", m.model),
            ("drafter", m.drafter if m.speculation else "off"),
            ("k", str(m.k)),
            ("verify", m.verify_mode),
            ("GEMM", m.gemm_backend),
            ("device", m.device),
        ]
        for name, value in fields:
            text.append(f"{name} ", style="dim")
            text.append(f"{value}  ", style="bold")
        prompt = "–" if m.prompt_index is None else str(m.prompt_index)
        text.append("prompt ", style="dim")
        text.append(f"{prompt} ({m.prompts_done} done, {m.exact_prompts} exact)  ")
        if m.paused:
            text.append(" PAUSED ", style="bold black on yellow")
            text.append(" ")
        if m.finished:
            text.append(" FINISHED ", style="bold black on bright_white")
            text.append(" ")
        verdict_style = "bold white on red" if m.first_divergence else "bold black on green"
        text.append(f" {m.exactness} ", style=verdict_style)
        self.update(text)
