"""A seeded fake event stream: a whole session of plausible events with fixed timestamps,
so the dashboard can be driven (and snapshotted) without an engine or a clock."""

from __future__ import annotations

import random
from collections.abc import Iterable

from specdash.controls import Controls
from specdash.events import (
    Divergence,
    Event,
    Idle,
    Margin,
    PromptDone,
    PromptStart,
    RootCause,
    SessionStart,
    TelemetrySample,
    Token,
    VerifyStep,
)
from specdash.settings import SessionSettings
from specdash.ui.dashboard_model import DashboardModel
from specdash.ui.sources import Sink

WORDS = ["the", " cat", " sat", " on", " a", " mat", ",", " and", " then", " it", " slept", "."]
STEP_NS = 20_000_000


def folded(events: Iterable[Event]) -> DashboardModel:
    """The dashboard's model after `events`, in order."""
    model = DashboardModel()
    for event in events:
        model.consume(event)
    return model


def fake_session(
    seed: int = 0,
    prompts: int = 2,
    steps_per_prompt: int = 30,
    k: int = 4,
    divergence_at: tuple[int, int] | None = (1, 37),
    telemetry: str = "gpm",
) -> list[Event]:
    """Events of a session; `divergence_at` = (prompt, token position) that diverges."""
    rng = random.Random(seed)
    t = 1_000_000_000
    config = {
        "engine": "native",
        "model": "tiny-fake",
        "drafter": "model",
        "k": k,
        "verify_mode": "exact",
        "speculation": True,
        "gemm_backends": ["rowwise", "torch"],
    }
    events: list[Event] = [
        SessionStart(
            t_ns=t,
            config=config,
            versions={"specdash": "0.1.0"},
            device="cpu",
            gemm_backend="rowwise",
            wall_time=0.0,
        )
    ]
    step = 0
    for p in range(prompts):
        t += STEP_NS
        events.append(PromptStart(t_ns=t, prompt_index=p, prompt_tokens=12, text=f"Prompt {p}:"))
        position = 0
        accepted_total = 0
        diverged = False
        for _ in range(steps_per_prompt):
            t += STEP_NS
            accepted = min(k, max(0, round(rng.gauss(2.5, 1.5))))
            drafts = [rng.randrange(1000) for _ in range(k)]
            emitted = drafts[:accepted] + [rng.randrange(1000)]
            events.append(
                VerifyStep(
                    t_ns=t,
                    prompt_index=p,
                    step=step,
                    k=k,
                    accepted=accepted,
                    draft_tokens=drafts,
                    emitted_tokens=emitted,
                    verify_mode="exact",
                    gemm_backend="rowwise",
                    draft_s=0.004,
                    verify_s=0.008 + 0.001 * accepted,
                    shadow_s=0.006 * (accepted + 1),
                    rollback_s=0.0005,
                )
            )
            for i, token_id in enumerate(emitted):
                events.append(
                    Token(
                        t_ns=t,
                        prompt_index=p,
                        position=position,
                        token_id=token_id,
                        logprob=-rng.random(),
                        text=rng.choice(WORDS),
                        source="draft" if i < accepted else "bonus",
                        step=step,
                    )
                )
                if divergence_at == (p, position):
                    diverged = True
                    events.append(
                        Divergence(
                            t_ns=t,
                            prompt_index=p,
                            position=position,
                            step=step,
                            k=k,
                            verify_mode="exact",
                            gemm_backend="rowwise",
                            what="logprob",
                            spec_token=token_id,
                            shadow_token=token_id,
                            spec_logprob=-0.6931471805599453,
                            shadow_logprob=-0.6931471805599454,
                            spec_text=" mat",
                            shadow_text=" mat",
                            context="the cat sat on a mat",
                            root_cause=RootCause(
                                layer=3, sub_op="mlp.down_proj", max_abs_diff=6e-8
                            ),
                            shadow_margin=Margin(
                                top1_token=token_id,
                                top2_token=7,
                                gap=0.035,
                                ulps=147435,
                                near_tie=False,
                            ),
                        )
                    )
                position += 1
            accepted_total += accepted
            step += 1
            if telemetry != "none" and step % 5 == 0:
                events.append(_telemetry(t, telemetry, rng))
        events.append(
            PromptDone(
                t_ns=t,
                prompt_index=p,
                new_tokens=position,
                seconds=steps_per_prompt * 0.02,
                verify_steps=steps_per_prompt,
                accepted_drafts=accepted_total,
                proposed_drafts=k * steps_per_prompt,
                exact=not diverged,
            )
        )
    if telemetry == "none":
        events.insert(1, _telemetry(events[0].t_ns, "none", rng))  # sampled at the start
    return events


def _telemetry(t: int, source: str, rng: random.Random) -> TelemetrySample:
    if source == "none":
        return TelemetrySample(t_ns=t, window_s=0.0, source="none", note="no NVIDIA GPU")
    if source == "mem_busy":
        return TelemetrySample(
            t_ns=t,
            window_s=0.25,
            source="mem_busy",
            mem_busy_pct=float(rng.randrange(40, 90)),
            power_w=300.0,
            mem_used_gb=20.5,
            note="GPM not supported on this GPU: showing mem busy %",
        )
    pct = rng.uniform(60, 90)
    return TelemetrySample(
        t_ns=t,
        window_s=0.25,
        source="gpm",
        dram_bw_util_pct=pct,
        dram_gbps=pct / 100 * 4810,
        sm_util_pct=rng.uniform(50, 99),
        power_w=550.0,
        mem_used_gb=60.2,
        note="DRAM BW % (GPM), GB/s derived from peak",
    )


class ScriptedSource:
    """An EventSource that pushes a fixed list of events synchronously in `start`."""

    def __init__(self, events: list[Event], controls: Controls | None = None) -> None:
        self.events = events
        self.controls = controls
        self.stopped = False

    @classmethod
    def live_like(cls, events: list[Event]) -> ScriptedSource:
        return cls(events, Controls.from_settings(SessionSettings(gemm_backend="rowwise")))

    def start(self, sink: Sink) -> None:
        for event in self.events:
            sink(event)

    def stop(self) -> None:
        self.stopped = True


def with_idle_gap(events: list[Event], gap_s: float, seed: int = 1) -> list[Event]:
    """`events`, then the engine idle for `gap_s` (GPU samples still arriving), then one typed
    prompt decoded: the session after its set, waiting, and a prompt typed by hand."""
    rng = random.Random(seed)
    t = events[-1].t_ns
    out = [*events, Idle(t_ns=t)]
    for i in range(1, int(gap_s)):  # the sampler keeps sampling an idle GPU
        out.append(_telemetry(t + i * 1_000_000_000, "gpm", rng))
    typed = fake_session(seed=seed, prompts=1, divergence_at=None)
    shift = t + int(gap_s * 1e9) - typed[0].t_ns
    prompt = 1 + max(e.prompt_index for e in events if isinstance(e, PromptDone))
    steps = sum(isinstance(e, VerifyStep) for e in events)
    for e in typed[1:]:
        update: dict[str, object] = {"t_ns": e.t_ns + shift}
        if hasattr(e, "prompt_index"):
            update["prompt_index"] = prompt
        if hasattr(e, "step"):
            update["step"] = e.step + steps
        out.append(e.model_copy(update=update))
    return out
