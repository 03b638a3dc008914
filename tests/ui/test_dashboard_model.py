"""Dashboard numbers folded from events, checked against sums computed directly from the
same events."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fake_events import STEP_NS, fake_session, folded, with_idle_gap

from specdash.events import (
    ControlChange,
    EngineError,
    GemmChoice,
    PromptStart,
    SessionStart,
    Summary,
    TelemetrySample,
    VerifyStep,
)
from specdash.ui.dashboard_model import HISTORY


def test_acceptance_numbers_match_the_steps():
    events = fake_session(seed=3, prompts=2, steps_per_prompt=40, k=5)
    steps = [e for e in events if isinstance(e, VerifyStep)]
    m = folded(events)
    accepted = [s.accepted for s in steps]
    assert m.verify_steps == len(steps) == 80
    assert m.mean_accepted_length == 1 + sum(accepted) / len(steps)
    assert m.acceptance_rate == sum(accepted) / (5 * len(steps))
    assert [m.histogram[a] for a in range(6)] == [accepted.count(a) for a in range(6)]
    by_position = m.acceptance_by_position()
    assert len(by_position) == 5
    for i, rate in enumerate(by_position):
        assert rate == sum(a > i for a in accepted) / len(steps)
    assert list(m.accepted_series) == accepted


def test_throughput_windows_use_event_time():
    events = fake_session(seed=1, prompts=1, steps_per_prompt=100)
    m = folded(events)
    steps = [e for e in events if isinstance(e, VerifyStep)]
    last = steps[-1].t_ns
    in_window = [s for s in steps if s.t_ns > last - 1_000_000_000]
    assert len(in_window) == 1_000_000_000 // STEP_NS
    tokens = sum(s.accepted + 1 for s in in_window)
    spec_s = sum(s.draft_s + s.verify_s + s.rollback_s for s in in_window)
    assert m.window_steps.tokens == tokens
    assert abs(m.window_steps.spec_tps - tokens / spec_s) < 1e-6
    assert m.tokens_per_s_window == tokens  # window is 1 s
    assert m.session_steps.tokens == sum(s.accepted + 1 for s in steps) == m.session_tokens


def test_window_empties_after_a_quiet_second():
    m = folded(fake_session(prompts=1, steps_per_prompt=10))
    m.consume(TelemetrySample(t_ns=m.now_ns + 2_000_000_000, window_s=0.25, source="none"))
    assert m.window_steps.tokens == 0 and m.window_steps.spec_tps is None
    assert m.tokens_per_s_window == 0


def test_divergence_marks_the_token_and_the_verdict():
    m = folded(fake_session(prompts=2, steps_per_prompt=30, divergence_at=(1, 37)))
    assert m.exactness == "DIVERGED at token 37 (prompt 1)"
    assert m.divergence_count == 1 and m.exact_prompts == 1 and m.prompts_done == 2
    marked = [t.position for t in m.stream if t.diverged]
    assert marked == [37]
    clean = folded(fake_session(divergence_at=None))
    assert clean.exactness == "EXACT so far" and not any(t.diverged for t in clean.stream)


def test_stream_holds_the_current_prompt_only():
    events = fake_session(prompts=2, steps_per_prompt=5)
    m = folded(events)
    assert m.prompt_index == 1 and m.prompt_text == "Prompt 1:"
    assert [t.position for t in m.stream] == list(range(len(m.stream)))
    assert {t.source for t in m.stream} <= {"draft", "bonus"}


def test_controls_errors_and_summary():
    m = folded(fake_session(prompts=1, steps_per_prompt=3))
    assert m.gemm_backends == ["rowwise", "torch"]
    m.consume(ControlChange(name="k", old="4", new="6", applied_step=3))
    m.consume(ControlChange(name="paused", old="False", new="True", applied_step=3))
    m.consume(ControlChange(name="speculation", old="True", new="False", applied_step=3))
    assert (m.k, m.paused, m.speculation) == (6, True, False)
    m.consume(EngineError(message="boom", fatal=False))
    assert [e.message for e in m.errors] == ["boom"]
    m.consume(
        Summary(
            prompts=1,
            exact_prompts=1,
            new_tokens=9,
            seconds=1.0,
            tokens_per_s=9.0,
            mean_accepted_length=3.0,
            acceptance_rate=0.5,
            verify_steps=3,
            divergences=0,
        )
    )
    assert m.finished and m.summary.new_tokens == 9


def test_bounded_series_span_the_session():
    """A long set keeps every other point, not the latest: the chart starts at its start."""
    m = folded(fake_session(prompts=1, steps_per_prompt=2000))
    assert len(m.accepted_series) == m.accepted_series.maxlen < 2000
    xs = [p[0] for p in m.tps_series]
    assert HISTORY // 2 <= len(xs) < HISTORY and xs == sorted(xs)
    assert xs[0] < 0.1 and xs[-1] == pytest.approx(m.busy_s, abs=0.1)


def test_idle_never_stretches_the_axes():
    """After the set, 900 s idle, then one typed prompt: the charts' x axis is the session's
    clock (what the session numbers use), so the gap adds nothing, and the GPU samples of the
    idle engine are not plotted."""
    before = fake_session(seed=7)
    m_before = folded(before)
    events = with_idle_gap(before, gap_s=900)
    m = folded(events)
    typed = next(e for e in reversed(events) if isinstance(e, PromptStart))
    busy = (before[-1].t_ns - before[0].t_ns + events[-1].t_ns - typed.t_ns) / 1e9
    assert m.elapsed_s > 900 and m.busy_s == pytest.approx(busy) and m.busy_s < 5
    xs = [p[0] for p in m.tps_series]
    assert max(xs) <= m.busy_s and xs == sorted(xs)
    assert len(m.tps_series) == len(m_before.tps_series) + 30  # the typed prompt's 30 steps
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert max(gaps) < 0.1  # no line spans the wait
    assert len(m.bandwidth_series) == len(m_before.bandwidth_series) + 6  # not the 899 idle ones
    assert max(x for x, _ in m.bandwidth_series) <= m.busy_s


def test_dashboard_core_never_imports_textual():
    """The model, sources and sampler are core: the live engine and replay use them headless."""
    code = (
        "import sys, specdash.ui.dashboard_model, specdash.ui.sources, specdash.runs.nvml_sampler; "
        "print('textual' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_g_cycles_the_gemm_backends_the_header_offers():
    """On SGLang the header lists SGLang's GEMM routes: `g` offers the usable ones, in order."""
    routes = [
        GemmChoice(name="auto"),
        GemmChoice(name="deepgemm", unavailable="SGLang's ENABLE_JIT_DEEPGEMM is off here"),
        GemmChoice(name="sglang-triton"),
        GemmChoice(name="specdash-triton"),
    ]
    header = SessionStart(engine="sglang", gemm_backend="auto", gemm_backends=routes,
                          speculative_algorithm="NEXTN", config={}, versions={},
                          device="cuda")  # fmt: skip
    m = folded([header])
    assert m.engine == "sglang" and m.gemm_backend == "auto"
    assert m.gemm_backends == ["auto", "sglang-triton", "specdash-triton"]
