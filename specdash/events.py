"""Typed events: the one stream from an engine to its consumers.

Every engine (native, sglang) emits these and nothing else; the dashboard, the
trace writer and the headless summary only ever read them. Keeping the core
free of any consumer is what lets a trace replay drive the same widgets as a
live run. Times are integer nanoseconds from `time.monotonic_ns()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from specdash import metrics
from specdash.registry import drafters
from specdash.settings import MAX_K, VerifyMode

SCHEMA = "specdash/v3"
"""v3: the header says in typed fields what every reader reads (engine, GEMM backends,
algorithm, quantization, shadow; v1/v2 headers kept them in `config`, and `SessionStart` maps
them on read). v2: `position` is the generated-token index, 0-based, for every engine (v1
native traces counted the prompt too; `read_trace` converts them)."""


Seconds = Annotated[float, Field(allow_inf_nan=False)]
"""A measured duration: a finite number, which every reader (a Perfetto slice, a rate) can use."""
DraftCount = Annotated[int, Field(ge=0, le=MAX_K)]
"""A step's k or its accepted drafts: bounded as `SessionSettings.k` is, so a trace's reader
never sizes anything by a number no session could have run."""

TokenSource = Literal["draft", "bonus", "decode"]
"""Where a token came from: an accepted draft, a verify step's bonus row, or a decode row."""


def now_ns() -> int:
    return time.monotonic_ns()


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    t_ns: int = Field(default_factory=now_ns)


class GemmChoice(BaseModel):
    """A GEMM backend an engine can switch to live."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    unavailable: str | None = None
    """Why it cannot run here (one line); None when it can."""


class SessionStart(_Event):
    """First event of a session: what ran, and everything needed to reproduce it. Every view
    reads the typed fields; `config` is the record (the settings as asked, and what the engine
    adds: the checkpoints loaded, SGLang's arguments and patches)."""

    kind: Literal["session_start"] = "session_start"
    schema_version: str = SCHEMA
    engine: str
    """The engine that ran (`specdash.registry.engines`)."""
    gemm_backend: str
    """The GEMM backend at the start (`auto` resolved where the engine resolves it)."""
    gemm_backends: list[GemmChoice]
    """Every GEMM backend the engine can switch to live, usable or not (`g` cycles the usable
    ones): the native engine's of its device, SGLang's routes (`gemm_routing`)."""
    speculative_algorithm: str | None
    """The algorithm speculation runs (`specdash.registry.algorithms`; native: its drafter's),
    also when it starts switched off and can be switched on; None: the engine runs none (SGLang
    started without speculation)."""
    quantization: str | None = None
    """The weights' quantization; None: none (the weights are in the dtype they compute in)."""
    shadow: bool = True
    """A shadow compares the output (the settings ask for one and the engine runs it)."""
    rate_includes_prefill: bool = False
    """The engine times whole requests, prefill inside (SGLang), not decode steps."""
    config: dict[str, Any]
    versions: dict[str, str]
    device: str
    wall_time: float = Field(default_factory=time.time)
    git_revision: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _typed_from_config(cls, data: Any) -> Any:
        """A v1/v2 header kept the typed fields in `config` (the GEMM backends as name -> why
        not, or a list of names; no algorithm for the native engine, whose drafter is it)."""
        if (
            not isinstance(data, dict)
            or "engine" in data
            or not isinstance(data.get("config"), dict)
        ):
            return data
        c = data["config"]
        engine = str(c.get("engine", "native"))
        table = c.get("gemm_backends") or [data.get("gemm_backend", "?")]
        if isinstance(table, dict):
            choices = [{"name": n, "unavailable": why} for n, why in table.items()]
        else:
            choices = [{"name": str(n)} for n in table]
        if engine == "sglang":
            algorithm = c.get("speculative_algorithm") if c.get("speculation", True) else None
        else:
            algorithm = drafters.algorithm(str(c.get("drafter", "model")))
        return data | {
            "engine": engine,
            "gemm_backends": choices,
            "speculative_algorithm": algorithm,
            "shadow": bool(c.get("shadow", True)),
            "rate_includes_prefill": bool(c.get("rate_includes_prefill", False)),
        }

    @property
    def usable_gemm_backends(self) -> list[str]:
        """The GEMM backends that can run here, in the engine's order (the active one at least)."""
        return [c.name for c in self.gemm_backends if c.unavailable is None] or [self.gemm_backend]


class StartPhase(_Event):
    """A step of an engine's start, before the session's header (SGLang: spawning its
    processes, loading weights, capturing each set of CUDA graphs): what the wait is for.
    `done`/`total` count a capture's batch sizes where SGLang shows a bar."""

    kind: Literal["start_phase"] = "start_phase"
    engine: str
    """Which engine of the session: "spec", "shadow", or "plain" (speculation off)."""
    phase: str
    done: int | None = None
    total: int | None = None
    since_start_s: float
    """Seconds since this engine's start began."""

    @property
    def text(self) -> str:
        """What every view prints: "spec engine: capture target verify CUDA graphs 3/8"."""
        count = f" {self.done}/{self.total}" if self.total else ""
        return f"{self.engine} engine: {self.phase}{count}"


class PromptStart(_Event):
    kind: Literal["prompt_start"] = "prompt_start"
    prompt_index: int
    prompt_tokens: int
    text: str


class Prefill(_Event):
    kind: Literal["prefill"] = "prefill"
    prompt_index: int
    tokens: int
    seconds: Seconds
    run: Literal["spec", "shadow", "draft"]


class Draft(_Event):
    kind: Literal["draft"] = "draft"
    prompt_index: int
    step: int
    k: DraftCount
    drafter: str
    tokens: Annotated[list[int], Field(max_length=MAX_K)]
    seconds: Seconds


class VerifyStep(_Event):
    """One speculative step: k drafts verified, `accepted` of them kept, plus one bonus.

    `accepted` counts drafts only (0..k); the step emits accepted + 1 tokens, or accepted when
    the last of them is an end-of-text (no bonus, and the drafts after it are not accepted).
    Timings are host wall-clock seconds of each phase of this step.
    With speculation off (k == 0) the step is a plain decode step (`plain`): its tokens and
    timings count towards throughput, but it is not a verify step, so every acceptance number
    (rate, histogram, by position, mean accepted length, verify-step counts) skips it.

    `step` is the session's step counter, on every engine, the one `ControlChange.applied_step`
    counts (as `Draft`, `Token` and `Divergence` say it): a change applied at step n governs
    every step from n on. The native engine's session step is one verify (or plain decode) step
    of every prompt in flight; SGLang's is one batch of requests run to the end, so all of a
    request's verify steps carry its batch's step, in the order they ran.
    """

    kind: Literal["verify_step"] = "verify_step"
    prompt_index: int
    step: int
    k: DraftCount
    accepted: DraftCount
    draft_tokens: Annotated[list[int], Field(max_length=MAX_K)]
    emitted_tokens: Annotated[list[int], Field(max_length=MAX_K + 1)]
    verify_mode: VerifyMode
    gemm_backend: str
    draft_s: Seconds
    verify_s: Seconds
    shadow_s: Seconds
    rollback_s: Seconds

    @property
    def plain(self) -> bool:
        """Speculation was off for this step: one token by plain decode, nothing verified."""
        return self.k == 0

    @property
    def proposed(self) -> int:
        """Drafts actually proposed: at most k, fewer when the drafter found fewer."""
        return len(self.draft_tokens)

    @property
    def spec_s(self) -> float:
        """What the speculative path spent on this step: draft + verify + rollback."""
        return self.draft_s + self.verify_s + self.rollback_s

    @property
    def acceptance_rate(self) -> float | None:
        return metrics.acceptance_rate(self.accepted, self.proposed)


class Token(_Event):
    """One emitted token of the speculative run. `source` says how it got there; `position`
    is its generated-token index, 0-based (the prefill's token is 0), as in every event."""

    kind: Literal["token"] = "token"
    prompt_index: int
    position: int
    token_id: int
    logprob: float
    text: str
    source: TokenSource
    step: int


class RootCause(BaseModel):
    """First sub-op whose bits differ. `origin_position` is the token whose computation first
    differed: an earlier row of the same verify step when the difference reached the flagged
    token through attention or the GDN state."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    layer: int | None
    sub_op: str
    max_abs_diff: float
    detail: str = ""
    origin_position: int | None = None
    reproduced: bool | None = None
    """Whether the replay gave the flagged token the id and fp32 logprob bits both runs
    emitted. False: it did not, so it names no sub-op (`sub_op` "none") and `detail` says what
    it got. None: not checked (traces recorded before the check)."""

    def origin_text(self, position: int) -> str | None:
        """Why the cause names another token than the flagged `position` (every view says it),
        None where it names that one."""
        if self.origin_position is None or self.origin_position == position:
            return None
        return (
            f"the bits first differed at token {self.origin_position}, an earlier row of the "
            f"same verify step; they reached token {position} through attention or the GDN state"
        )


MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
NEAR_TIE_STEPS = 64
"""A gap within this many rounding steps of the compute dtype (a logit is rounded at its own
magnitude, up to ~2^6 times a logprob's) is a near-tie: the paths' last bits can decide it."""


class Margin(BaseModel):
    """The shadow's own choice at a divergence: its top-1 and top-2 tokens and how far apart
    their logprobs were (`gap`, in nats: the same as their logit gap; `ulps`: fp32 values
    between the two logprobs). `near_tie`: within a few rounding steps of the dtype the model
    computes in, so the two paths' last bits could decide it; a flip across a wide gap means the
    speculative path computed materially different values (a broken kernel)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    top1_token: int
    top2_token: int
    gap: float
    ulps: int
    near_tie: bool

    @classmethod
    def between(cls, top1: tuple[int, float], top2: tuple[int, float], dtype: str) -> Margin:
        """The margin from the shadow's top two (token id, logprob) there, judged by the dtype
        the model computes in ("float32", "bfloat16", "float16"). Every backend builds it
        here: the native one from the shadow's logprob row, SGLang from the shadow request's
        top logprobs."""
        (id1, lp1), (id2, lp2) = top1, top2
        ulps = metrics.fp32_ulps(lp1, lp2)
        step = 2 ** (23 - MANTISSA_BITS[dtype])  # one rounding step of `dtype`, in fp32 ulps
        return cls(
            top1_token=id1, top2_token=id2, gap=lp1 - lp2, ulps=ulps,
            near_tie=ulps <= NEAR_TIE_STEPS * step,
        )  # fmt: skip

    def text(self, flipped: bool) -> str:
        """What every view prints; `flipped`: the token ids differ there (else only bits)."""
        gap = f"shadow top-1 − top-2 {self.gap:.3g} nats ({self.ulps:,} fp32 ulps)"
        if flipped:
            why = (
                "a near-tie: rounding can flip it"
                if self.near_tie
                else "wide: rounding cannot flip it, a kernel computed other values"
            )
        else:
            why = "a near-tie: the ids could flip" if self.near_tie else "wide: ids not in doubt"
        return f"{gap}, {why}"


class Divergence(_Event):
    """First position where the speculative run and the shadow disagree.

    A logprob divergence means the ids match but the fp32 logprob bits do not.
    """

    kind: Literal["divergence"] = "divergence"
    prompt_index: int
    position: int
    step: int
    k: DraftCount
    verify_mode: VerifyMode
    gemm_backend: str
    what: Literal["token", "logprob"]
    spec_token: int
    shadow_token: int
    spec_logprob: float
    shadow_logprob: float
    spec_text: str = ""
    shadow_text: str = ""
    context: str = ""
    root_cause: RootCause | None = None
    shadow_margin: Margin | None = None
    """The shadow's top-1 / top-2 at this position; None where the engine did not report it."""
    prefix_cached: tuple[int, int] | None = None
    """Prompt tokens the speculative engine and the shadow read from their prefix caches
    instead of prefilling them (SGLang's `cached_tokens`); None where the engine does not say.
    A prefill over a cached prefix starts its kernels' tiles and chunks elsewhere than one over
    the whole prompt, so unequal counts can change a prefill token's bits."""


class PromptDone(_Event):
    kind: Literal["prompt_done"] = "prompt_done"
    prompt_index: int
    new_tokens: int
    seconds: Seconds
    verify_steps: int
    accepted_drafts: int
    proposed_drafts: int
    exact: bool
    """Ids and fp32 logprob bits equal to the shadow's, every token."""
    shadow_seconds: Seconds = 0.0
    """The shadow's plain greedy decode of the same tokens, timed as `seconds` is (0: no
    shadow ran)."""
    same_text: bool | None = None
    """Token ids equal to the shadow's, every token (the bits may differ); None: not checked."""
    skipped: bool = False
    """Cut short by `n` (next prompt): its verdict covers the tokens it got to."""


class TelemetrySample(_Event):
    """One GPU sampler window. `source` labels what the bandwidth number means."""

    kind: Literal["telemetry"] = "telemetry"
    window_s: float
    source: Literal["gpm", "mem_busy", "none"]
    dram_bw_util_pct: float | None = None
    dram_gbps: float | None = None
    mem_busy_pct: float | None = None
    sm_util_pct: float | None = None
    power_w: float | None = None
    mem_used_gb: float | None = None
    note: str = ""


class ControlChange(_Event):
    """A live setting changed; it took effect at `applied_step` (never mid-step), the engine's
    step counter (every step, speculation on or off). `prompt`: `n` skipped prompt `old`
    (`new` is "skipped"); `trace`: a recording started (`new` is its path)."""

    kind: Literal["control"] = "control"
    name: Literal["gemm_backend", "speculation", "k", "verify_mode", "paused", "prompt", "trace"]
    old: str
    new: str
    applied_step: int


class Idle(_Event):
    """The engine has decoded every prompt it was given and waits for one typed in the
    dashboard (the session stays open until `q`); the next `PromptStart` ends the wait.
    Idle time is not session time: the wall clock stops."""

    kind: Literal["idle"] = "idle"


class EngineError(_Event):
    """An engine problem. A fatal one ended the session; `exit_code` is the documented exit
    code of its cause (`specdash.errors`: 2 usage, 3 checkpoint, 4 environment), None for an
    unexpected exception."""

    kind: Literal["error"] = "error"
    message: str
    fatal: bool = True
    exit_code: int | None = None
    engine_lost: bool = Field(default=False, exclude=True)
    """Not the engine's report: its process died or stopped sending, which whoever read its
    stream says here, so the events it had not sent are lost and no recording of the session
    is whole (`TraceWriter`). Not written to a trace: the message says it there."""


class Summary(_Event):
    """Session totals. `checked` is whether a shadow decode compared the output (False with
    --no-shadow); `exact_prompts` is None then: not checked, not zero exact."""

    kind: Literal["summary"] = "summary"
    prompts: int
    exact_prompts: int | None
    checked: bool = True
    new_tokens: int
    seconds: float
    tokens_per_s: float
    mean_accepted_length: float
    acceptance_rate: float
    verify_steps: int
    divergences: int
    same_text_prompts: int | None = None
    """Prompts whose token ids equal the shadow's to the end (None: not checked)."""
    shadow_tokens_per_s: float | None = None
    """New tokens / the seconds the shadow's plain greedy decode spent on them, timed as
    `tokens_per_s` is (prefill excluded, or inside where `rate_includes_prefill`); None without
    a shadow."""
    wall_seconds: float | None = None
    """The session's wall time from its header: prefill, speculative and shadow decode, less
    the time it was paused or idle (loading the weights comes before the header)."""

    @property
    def speedup(self) -> float | None:
        """Speculative decode t/s over the shadow's plain decode t/s of the same tokens."""
        if not self.shadow_tokens_per_s or not self.tokens_per_s:
            return None
        return self.tokens_per_s / self.shadow_tokens_per_s

    @property
    def wall_tokens_per_s(self) -> float | None:
        return metrics.tokens_per_s(self.new_tokens, self.wall_seconds or 0.0)

    unreproduced_root_causes: int = 0
    """Divergences whose root-cause replay did not reproduce the flagged bits (no sub-op
    named: `RootCause.reproduced` False)."""
    rate_includes_prefill: bool = False
    """`seconds` (so `tokens_per_s`) holds each request's prefill: the engine times whole
    requests (SGLang), not decode steps."""

    @property
    def exact_text(self) -> str:
        """What every view prints: "15/24 identical text, 9/24 identical bits", or "not
        checked (--no-shadow)"."""
        if not self.checked:
            return "not checked (--no-shadow)"
        text = f"{self.exact_prompts}/{self.prompts} identical bits"
        if self.same_text_prompts is not None:
            text = f"{self.same_text_prompts}/{self.prompts} identical text, {text}"
        if self.verify_steps == 0 and self.new_tokens:
            text += " (nothing was speculated: plain decode against plain decode)"
        return text


Event = Annotated[
    SessionStart
    | StartPhase
    | PromptStart
    | Prefill
    | Draft
    | VerifyStep
    | Token
    | Divergence
    | PromptDone
    | TelemetrySample
    | ControlChange
    | Idle
    | EngineError
    | Summary,
    Field(discriminator="kind"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

Sink = Callable[[Event], None]
"""Where a producer (a runner, the GPU sampler, a replay) sends each event."""


def parse_event(line: str | bytes) -> Event:
    """One JSON object (a trace line) back to its typed event."""
    return EVENT_ADAPTER.validate_json(line)
