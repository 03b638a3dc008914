"""`specdash export`: a recorded trace as Chrome Trace Event JSON (Perfetto) or per-step CSV.

Perfetto layout (docs/traces.md): pid 1 "engine" with draft / verify / shadow threads of
complete (`X`) slices, divergences and control changes as global instant events, prompt
starts as process instants, per-step counters; pid 2 the GPU with one counter track per
metric. Timestamps are µs since the session header.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

from specdash import metrics
from specdash.events import (
    ControlChange,
    Divergence,
    Event,
    Prefill,
    PromptStart,
    SessionStart,
    TelemetrySample,
    VerifyStep,
)

ENGINE_PID, GPU_PID = 1, 2
TIDS = {"draft": 1, "verify": 2, "shadow": 3}
GPU_COUNTERS = ("dram_bw_util_pct", "dram_gbps", "mem_busy_pct", "sm_util_pct", "power_w")


@dataclass(frozen=True, slots=True)
class StepRow:
    """One verify step with its rates; the unit of the CSV export and the report.

    `drafted` is how many drafts the step really proposed: at most k, fewer when a drafter
    (n-gram) found nothing to propose. `plain`: speculation was off (k = 0), a plain decode
    step that acceptance numbers skip (`VerifyStep.plain`). Rates: `specdash.metrics`; the
    speculative path costs draft + verify + rollback, the shadow (plain greedy decode of the
    same tokens) costs `shadow_s`. A session without a shadow (`--no-shadow`) has no shadow
    time (0) and no shadow rate (None, an empty CSV cell).
    """

    t_s: float
    prompt_index: int
    step: int
    k: int
    plain: bool
    drafted: int
    accepted: int
    emitted: int
    verify_mode: str
    gemm_backend: str
    draft_s: float
    verify_s: float
    rollback_s: float
    shadow_s: float
    tokens_per_s: float
    shadow_tokens_per_s: float | None

    @property
    def spec_s(self) -> float:
        return self.draft_s + self.verify_s + self.rollback_s


def step_row(header: SessionStart, e: VerifyStep) -> StepRow:
    emitted = len(e.emitted_tokens)
    shadow = header.shadow
    return StepRow(
        t_s=(e.t_ns - header.t_ns) / 1e9,
        prompt_index=e.prompt_index,
        step=e.step,
        k=e.k,
        plain=e.plain,
        drafted=e.proposed,
        accepted=e.accepted,
        emitted=emitted,
        verify_mode=e.verify_mode,
        gemm_backend=e.gemm_backend,
        draft_s=e.draft_s,
        verify_s=e.verify_s,
        rollback_s=e.rollback_s,
        shadow_s=e.shadow_s if shadow else 0.0,
        tokens_per_s=metrics.tokens_per_s(emitted, e.spec_s) or 0.0,
        shadow_tokens_per_s=(metrics.tokens_per_s(emitted, e.shadow_s) or 0.0) if shadow else None,
    )


def step_rows(header: SessionStart, events: Iterable[Event]) -> list[StepRow]:
    return [step_row(header, e) for e in events if isinstance(e, VerifyStep)]


def write_csv(header: SessionStart, events: Iterable[Event], out: IO[str]) -> None:
    """One row per verify step, written as each step is read: the events may be a stream."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([f.name for f in fields(StepRow)])
    for e in events:
        if isinstance(e, VerifyStep):
            writer.writerow(asdict(step_row(header, e)).values())


def _us(t_ns: int, t0_ns: int) -> float:
    return (t_ns - t0_ns) / 1e3


def _safe_args(args: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON for the viewers: a NaN/inf logprob becomes its name as a string."""
    return {
        k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in args.items()
    }


def _slice(name: str, tid: str, start_us: float, seconds: float, args: dict[str, Any]) -> dict:
    return {
        "name": name,
        "cat": tid,
        "ph": "X",
        "ts": start_us,
        "dur": seconds * 1e6,
        "pid": ENGINE_PID,
        "tid": TIDS[tid],
        "args": _safe_args(args),
    }


def _verify_step_events(e: VerifyStep, t0_ns: int) -> list[dict]:
    """The step's phases laid end to end, ending when the step's event was emitted:
    draft, verify, rollback (verify track), then the shadow decode of the same tokens. A plain
    step (speculation off) is one `decode` slice on the verify track and no acceptance."""
    args = {
        "prompt": e.prompt_index,
        "step": e.step,
        "k": e.k,
        "accepted": e.accepted,
        "backend": e.gemm_backend,
        "verify_mode": e.verify_mode,
    }
    t = _us(e.t_ns, t0_ns) - (e.draft_s + e.verify_s + e.rollback_s + e.shadow_s) * 1e6
    out = []
    for name, tid, seconds in (
        ("draft", "draft", e.draft_s),
        ("decode" if e.plain else "verify", "verify", e.verify_s),
        ("rollback", "verify", e.rollback_s),
        ("shadow", "shadow", e.shadow_s),
    ):
        if seconds > 0:
            out.append(_slice(name, tid, t, seconds, args))
        t += seconds * 1e6
    if not e.plain:
        out.append(_counter(ENGINE_PID, "accepted_per_step", e.accepted, _us(e.t_ns, t0_ns)))
    return out


def _counter(pid: int, name: str, value: float, ts: float) -> dict:
    return {"name": name, "ph": "C", "ts": ts, "pid": pid, "args": {"value": value}}


def _instant(name: str, ts: float, args: dict[str, Any], scope: str = "g") -> dict:
    return {
        "name": name, "ph": "i", "s": scope, "ts": ts, "pid": ENGINE_PID, "tid": 0,
        "args": _safe_args(args),
    }  # fmt: skip


def _metadata(header: SessionStart) -> list[dict]:
    meta = [
        {"name": "process_name", "ph": "M", "pid": ENGINE_PID, "args": {"name": "engine"}},
        {"name": "process_name", "ph": "M", "pid": GPU_PID, "args": {"name": header.device}},
    ]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": ENGINE_PID, "tid": tid, "args": {"name": n}}
        for n, tid in TIDS.items()
    ]
    meta += [
        {"name": "thread_sort_index", "ph": "M", "pid": ENGINE_PID, "tid": tid,
         "args": {"sort_index": tid}}
        for tid in TIDS.values()
    ]  # fmt: skip
    return meta


def perfetto_events(header: SessionStart, events: Iterable[Event]) -> Iterator[dict]:
    """The Chrome trace events of `events`, in their order, each made as its event is read."""
    t0 = header.t_ns
    yield from _metadata(header)
    for e in events:
        ts = _us(e.t_ns, t0)
        if isinstance(e, VerifyStep):
            yield from _verify_step_events(e, t0)
            row = step_row(header, e)
            yield _counter(ENGINE_PID, "tokens_per_s", row.tokens_per_s, ts)
            if row.shadow_tokens_per_s is not None:
                yield _counter(ENGINE_PID, "shadow_tokens_per_s", row.shadow_tokens_per_s, ts)
        elif isinstance(e, PromptStart):
            args: dict[str, Any] = {"prompt": e.prompt_index, "prompt_tokens": e.prompt_tokens}
            yield _instant(f"prompt {e.prompt_index}", ts, args, scope="p")
        elif isinstance(e, Prefill):
            tid = "verify" if e.run == "spec" else e.run
            args = {"prompt": e.prompt_index, "tokens": e.tokens}
            yield _slice(f"prefill ({e.run})", tid, ts - e.seconds * 1e6, e.seconds, args)
        elif isinstance(e, Divergence):
            args = {
                "prompt": e.prompt_index, "pos": e.position, "step": e.step, "what": e.what,
                "spec_token": e.spec_token, "shadow_token": e.shadow_token,
                "spec_logprob": e.spec_logprob, "shadow_logprob": e.shadow_logprob,
                "verify_mode": e.verify_mode, "backend": e.gemm_backend,
                "root_cause": "" if e.root_cause is None else
                f"layer {e.root_cause.layer} {e.root_cause.sub_op}: {e.root_cause.detail}",
                "shadow_margin": "" if e.shadow_margin is None else
                e.shadow_margin.text(flipped=e.what == "token"),
            }  # fmt: skip
            yield _instant(f"divergence ({e.what})", ts, args)
        elif isinstance(e, ControlChange):
            args = {"old": e.old, "new": e.new, "applied_step": e.applied_step}
            yield _instant(f"{e.name}: {e.old} -> {e.new}", ts, args)
        elif isinstance(e, TelemetrySample):
            for name in GPU_COUNTERS:
                value = getattr(e, name)
                if value is not None and math.isfinite(value):
                    yield _counter(GPU_PID, name, value, ts)


def _document_tail(header: SessionStart) -> dict[str, Any]:
    return {
        "displayTimeUnit": "ms",
        "otherData": {
            "schema": header.schema_version,
            "device": header.device,
            "gemm_backend": header.gemm_backend,
            "git_revision": header.git_revision or "",
            "config": json.dumps(header.config, sort_keys=True, default=str),
        },
    }


def perfetto_trace(header: SessionStart, events: Iterable[Event]) -> dict[str, Any]:
    return {"traceEvents": list(perfetto_events(header, events)), **_document_tail(header)}


def write_perfetto(header: SessionStart, events: Iterable[Event], out: IO[str]) -> None:
    """`perfetto_trace` as strict JSON (`json.dump(..., allow_nan=False)`, byte for byte),
    written an event at a time: the events may be a stream, and the document is never held
    whole (it is several times the trace's size)."""
    out.write('{"traceEvents": [')
    for i, event in enumerate(perfetto_events(header, events)):
        out.write((", " if i else "") + json.dumps(event, allow_nan=False))
    out.write("], " + json.dumps(_document_tail(header), allow_nan=False)[1:])
