"""Deterministic synthetic sessions: the event stream an engine would emit, without an engine.

Trace tests build their files from these so that every field the trace tools read is present
with known values (e.g. where a divergence was planted).
"""

from __future__ import annotations

import errno
import io
import os
import random
from dataclasses import dataclass, field

import numpy as np

from specdash.events import (
    ControlChange,
    Divergence,
    Draft,
    Event,
    Margin,
    Prefill,
    PromptDone,
    PromptStart,
    SessionStart,
    Summary,
    TelemetrySample,
    Token,
    VerifyStep,
)

T0_NS = 1_000_000_000_000
PROMPT_TOKENS = 6
"""Token positions count the prompt, as the engine's do; plans index generated tokens."""
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time")


@dataclass
class Plan:
    """What to generate. `change` plants a different token (or only logprob bits) at
    (prompt, generated-token index); `divergence_at` adds a Divergence event there."""

    prompts: int = 3
    new_tokens: int = 24
    k: int = 4
    seed: int = 0
    telemetry: bool = True
    change: tuple[int, int, str] | None = None  # (prompt, index, "token" | "logprob")
    divergence_at: tuple[int, int] | None = None
    engine: str = "native"
    extra: dict = field(default_factory=dict)


def header(plan: Plan) -> SessionStart:
    return SessionStart(
        t_ns=T0_NS,
        config={"engine": plan.engine, "k": plan.k, "max_new_tokens": plan.new_tokens,
                "verify_mode": "exact", "drafter": "model", **plan.extra},
        versions={"specdash": "0.1.0", "torch": "2.13.0+cpu", "textual": "8.2.8"},
        device="cpu",
        gemm_backend="triton",
        wall_time=1_780_000_000.0,
        git_revision="0123456789ab",
    )  # fmt: skip


def session(plan: Plan | None = None) -> list[Event]:
    """Header first, then the whole session as the engine would emit it."""
    plan = plan or Plan()
    rng = random.Random(plan.seed)
    t = T0_NS
    events: list[Event] = [header(plan)]
    total_steps = total_acc = total_prop = 0

    def tick(seconds: float) -> int:
        nonlocal t
        t += int(seconds * 1e9)
        return t

    for p in range(plan.prompts):
        text = PROMPTS[p % len(PROMPTS)]
        events.append(
            PromptStart(t_ns=tick(0.001), prompt_index=p, prompt_tokens=PROMPT_TOKENS, text=text)
        )
        for run in ("spec", "shadow", "draft"):
            events.append(Prefill(t_ns=tick(0.01), prompt_index=p, tokens=PROMPT_TOKENS,
                                  seconds=0.01, run=run))  # fmt: skip
        pos = step = acc_sum = prop_sum = 0
        while pos < plan.new_tokens:
            k = plan.k if step < 3 or p != 1 else 2
            if p == 1 and step == 3:
                events.append(
                    ControlChange(t_ns=tick(0.0001), name="k", old=str(plan.k), new="2",
                                  applied_step=step)
                )  # fmt: skip
            accepted = min(rng.randint(0, k), plan.new_tokens - pos - 1)
            drafts = [rng.randrange(1000) for _ in range(k)]
            emitted = drafts[:accepted] + [rng.randrange(1000)]
            d_s, v_s, s_s, r_s = 0.002 * k, 0.008, 0.006, 0.0005
            events.append(Draft(t_ns=tick(d_s), prompt_index=p, step=step, k=k, drafter="model",
                                tokens=drafts, seconds=d_s))  # fmt: skip
            events.append(
                VerifyStep(t_ns=tick(v_s + s_s + r_s), prompt_index=p, step=step, k=k,
                           accepted=accepted, draft_tokens=drafts, emitted_tokens=emitted,
                           verify_mode="exact", gemm_backend="triton", draft_s=d_s, verify_s=v_s,
                           shadow_s=s_s, rollback_s=r_s)
            )  # fmt: skip
            for i, tok in enumerate(emitted):
                logprob = float(np.float32(-rng.random() * 3))  # engines report fp32 logprobs
                if plan.change is not None and plan.change[:2] == (p, pos):
                    if plan.change[2] == "token":
                        tok, logprob = tok + 1, logprob - 0.5
                    else:
                        logprob = _next_float_down(logprob)
                if plan.divergence_at == (p, pos):
                    events.append(
                        Divergence(t_ns=tick(0.00001), prompt_index=p, position=pos,
                                   step=step,
                                   k=k, verify_mode="exact", gemm_backend="triton", what="token",
                                   spec_token=tok, shadow_token=tok + 1, spec_logprob=logprob,
                                   shadow_logprob=logprob - 0.25, spec_text=f"<{tok}>",
                                   shadow_text=f"<{tok + 1}>", context="… the quick brown",
                                   shadow_margin=Margin(top1_token=tok + 1, top2_token=tok,
                                                        gap=0.25, ulps=2097152,
                                                        near_tie=False))
                    )  # fmt: skip
                source = "bonus" if i == len(emitted) - 1 else "draft"
                events.append(
                    Token(t_ns=tick(0.00001), prompt_index=p, position=pos,
                          token_id=tok,
                          logprob=logprob, text=f"<{tok}>", source=source, step=step)
                )  # fmt: skip
                pos += 1
            if plan.telemetry and step % 2 == 0:
                events.append(
                    TelemetrySample(t_ns=tick(0.0001), window_s=0.1, source="gpm",
                                    dram_bw_util_pct=40 + rng.random() * 40,
                                    dram_gbps=2000 + rng.random() * 1000, sm_util_pct=70.0,
                                    power_w=350.0, mem_used_gb=60.5)
                )  # fmt: skip
            step += 1
            acc_sum += accepted
            prop_sum += k
        events.append(
            PromptDone(t_ns=tick(0.001), prompt_index=p, new_tokens=pos, seconds=0.2,
                       verify_steps=step, accepted_drafts=acc_sum, proposed_drafts=prop_sum,
                       exact=plan.divergence_at is None or plan.divergence_at[0] != p)
        )  # fmt: skip
        total_steps, total_acc, total_prop = (
            total_steps + step,
            total_acc + acc_sum,
            total_prop + prop_sum,
        )
    seconds = (t - T0_NS) / 1e9
    new_tokens = plan.prompts * plan.new_tokens
    events.append(
        Summary(t_ns=tick(0.001), prompts=plan.prompts,
                exact_prompts=plan.prompts - (plan.divergence_at is not None),
                new_tokens=new_tokens, seconds=seconds, tokens_per_s=new_tokens / seconds,
                mean_accepted_length=1 + total_acc / total_steps,
                acceptance_rate=total_acc / total_prop, verify_steps=total_steps,
                divergences=int(plan.divergence_at is not None))
    )  # fmt: skip
    return events


def _next_float_down(x: float) -> float:
    """The float32 just below x: a logprob that differs only in its last bit."""
    return float(np.nextafter(np.float32(x), np.float32(-np.inf)))


class FullDisk(io.StringIO):
    """A stream that accepts `room` characters, then fails like a full disk."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(s)
