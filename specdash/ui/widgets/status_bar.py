"""Status bar: the exactness verdict so far and the session's progress on the first line,
what is running (engine, model, drafter, k, verify mode, GEMM backend, device) on the second.

Until the session starts it says what is loading and for how long; until the first token
has been compared with the shadow it gives no verdict. Each line fits the terminal's width
(`FittedLines`): where it is too long the least important text shortens first (the word
"(session)", the `/ prompt` hint, the labels a value says itself, the card's vendor), so the
verdict, the counts, the trace's name and the device stay on screen at 100 columns.
"""

from __future__ import annotations

import re
from pathlib import Path

from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.widgets.fitted_lines import FittedLines, Part

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


# The order in which a status line too long for the terminal gives up its text (lower first)
RANK_SESSION_WORD, RANK_NEXT_STEP, RANK_LOADING_HINT, RANK_VENDOR, RANK_PROMPT_HINT = 0, 0, 0, 1, 1
RANK_NOTE, RANK_DEVICE_LABEL, RANK_LABELS, RANK_VERDICT, RANK_DEVICE = 2, 2, 3, 3, 4
RANK_GEMM_BACKEND, RANK_NEXT_STEP_NOTE = 5, 6


def _shorter(text: str, *forms: tuple[int, str]) -> tuple[tuple[int, str], ...]:
    """The forms of `forms` that are shorter than `text` and than each other, in order."""
    kept: list[tuple[int, str]] = []
    for rank, form in forms:
        if len(form) < len(kept[-1][1] if kept else text):
            kept.append((rank, form))
    return tuple(kept)


def _device(device: str) -> Part:
    """The device, shortened to its card without the vendor ("cuda:0 H100 80GB HBM3"), then to
    its kind and model alone ("cuda:0 H100", "cpu, 2 threads")."""
    plain = device.replace("NVIDIA ", "")
    threads = re.search(r"\d+ threads", plain)
    short = f"{plain.split(' (')[0]}, {threads[0]}" if threads else " ".join(plain.split()[:2])
    return Part(device, "bold", _shorter(device, (RANK_VENDOR, plain), (RANK_DEVICE, short)))


SEPARATOR = Part("  ")


def _joined(*groups: list[Part]) -> list[Part]:
    """The groups two spaces apart; a group of one part that may go entirely takes its
    separator with it."""
    parts: list[Part] = []
    for group in groups:
        if not group:
            continue
        if parts and len(group) == 1 and group[0].shorter[-1:] and not group[0].shorter[-1][1]:
            (p,) = group
            forms = tuple((rank, f"  {form}" if form else "") for rank, form in p.shorter)
            group = [Part(f"  {p.text}", p.style, forms, p.elastic)]
        elif parts:
            group = [SEPARATOR, *group]
        parts += group
    return parts


class StatusBar(FittedLines):
    def show(
        self,
        m: DashboardModel,
        paused: bool,
        recording: str = "",
        recording_brief: str = "",
        loading: str = "",
        phase_s: float = 0.0,
        asked: dict[str, object] | None = None,
    ) -> None:
        """`paused`: what the user asked for live (the engine pauses at its next step), or the
        recorded state in a replay. `recording`: the note on the trace (its file by name),
        `recording_brief` the same in a few words. `loading`: what is loading before the
        session starts; `phase_s`: seconds the current loading or prefill has taken so far;
        `asked`: control changes waiting for the engine's next step (`still_asked`), shown as
        "k 4→5"."""
        asked = asked or {}
        if not m.started and any(e.fatal for e in m.errors):
            self.show_lines([[
                Part(" FAILED ", "bold white on red"),
                Part(f"  {loading}: stopped by an engine error, shown below", "bold"),
            ]])  # fmt: skip
            return
        if not m.started:
            phases = " · ".join(phase.text for phase in m.start_phases.values())
            hint, short = (
                "the verdict and the numbers appear once the first prompt runs",
                "verdict and numbers once a prompt runs",
            )
            if phases:  # the hint shortens, then goes, where the phases need the room
                hint, short = f" · {hint}", f" · {short}"
            fewer = ((RANK_LOADING_HINT, short), (RANK_LOADING_HINT, ""))
            self.show_lines([
                [Part(" LOADING ", NEUTRAL), Part(f"  {loading} … {phase_s:.0f} s", "bold")],
                [Part(phases, "bold"), Part(hint, "dim", fewer)],
            ])  # fmt: skip
            return
        self.show_lines([self._progress(m, paused, recording, recording_brief, phase_s),
                         self._what_runs(m, asked)])  # fmt: skip

    @staticmethod
    def _progress(
        m: DashboardModel, paused: bool, recording: str, recording_brief: str, phase_s: float
    ) -> list[Part]:
        """The verdict, the state, the prompt and the counts; the trace's note last, its few
        words where the whole note does not fit."""
        idle = m.idle and not m.finished
        flags = [
            Part(f" {flag} ", "bold black on yellow")
            for flag, on in (("PAUSED", paused), ("IDLE", idle), ("FINISHED", m.finished))
            if on
        ]
        state: list[Part] = []
        if idle:  # (the footer's word for it)
            state = [Part("/ prompt", "bold", _shorter("/ prompt", (RANK_PROMPT_HINT, "")))]
        if m.prefill is not None and not m.finished:
            state = [Part(f"prefill {m.prefill} … {phase_s:.0f} s", "bold")]
        elif not idle and not m.finished:  # (nothing runs: no current prompt to name)
            prompt = "–" if m.prompt_index is None else str(m.prompt_index)
            state = [Part("prompt ", "dim"), Part(prompt, "bold")]
        exact = f"{m.exact_prompts} exact" if m.shadow else "not checked"
        counts = [
            Part(f"{m.prompts_done} done, {exact}"),
            Part(" (session)", shorter=((RANK_SESSION_WORD, ""),)),
        ]
        brief = _shorter(recording, (RANK_NOTE, recording_brief)) if recording_brief else ()
        note = [Part(recording, "dim", brief, elastic=True)]
        verdict = Part(f" {m.exactness} ", _verdict_style(m))
        if (d := m.first_divergence) is not None:  # its prompt is in the divergence table
            short = f" DIVERGED at token {d.position} "
            verdict = Part(
                verdict.text, verdict.style, _shorter(verdict.text, (RANK_VERDICT, short))
            )
        return _joined([verdict], flags, state, counts, note if recording else [])

    @staticmethod
    def _what_runs(m: DashboardModel, asked: dict[str, object]) -> list[Part]:
        """Engine, model, drafter, k, verify mode, GEMM and device; where they do not fit, the
        labels a value says itself go, the device shortens to its card and the GEMM to the
        kernel that runs."""
        model = Path(m.model).name if "/" in m.model else m.model
        drafter = m.drafter if m.speculation else "off (no speculation)"
        if "speculation" in asked:
            drafter = f"{drafter}→{m.drafter if asked['speculation'] else 'off'}"
        gemm = Part(_value(m.gemm_backend, asked, "gemm_backend"), "bold")
        if m.gemm_kernel and m.verify_mode == "exact" and "gemm_backend" not in asked:
            full = f"{m.gemm_kernel} ({m.gemm_backend})"  # what really runs, and what `g` names
            gemm = Part(full, "bold", _shorter(full, (RANK_GEMM_BACKEND, m.gemm_kernel)))
        fields = [
            (Part("engine ", "dim", ((RANK_LABELS, ""),)), Part(m.engine, "bold")),
            (Part("model ", "dim", ((RANK_LABELS, ""),)), Part(model, "bold", elastic=True)),
            (Part("drafter ", "dim", ((RANK_LABELS, "draft "),)), Part(drafter, "bold")),
            (Part("k ", "dim"), Part(_value(m.k, asked, "k"), "bold")),
            (Part("verify ", "dim"), Part(_value(m.verify_mode, asked, "verify_mode"), "bold")),
            (Part("GEMM ", "dim"), gemm),
            (Part("device ", "dim", ((RANK_DEVICE_LABEL, ""),)), _device(m.device)),
        ]
        groups = [list(field) for field in fields]
        if asked:
            later = "(at the next step)"
            groups.append(
                [
                    Part(
                        later,
                        "dim",
                        _shorter(later, (RANK_NEXT_STEP, "(next step)"), (RANK_NEXT_STEP_NOTE, "")),
                    )
                ]
            )
        return _joined(*groups)
