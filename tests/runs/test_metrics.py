"""One definition per number: every view (dashboard, headless summary, report, CSV) computes
acceptance rate, mean accepted length and speculative t/s the same way from the same events."""

from __future__ import annotations

import math
import struct

import numpy as np

from specdash.events import PromptDone, SessionStart, VerifyStep
from specdash.metrics import Comparison, same_fp32_bits, token_difference
from specdash.stats import SessionStats
from specdash.trace.export import step_rows
from specdash.trace.report import _summary, windowed_tokens_per_s
from specdash.ui.dashboard_model import DashboardModel


def step(i: int, k: int, drafts: int, accepted: int, emitted: int) -> VerifyStep:
    return VerifyStep(
        t_ns=1_000_000_000 + i * 10_000_000,
        prompt_index=0,
        step=i,
        k=k,
        accepted=accepted,
        draft_tokens=list(range(drafts)),
        emitted_tokens=list(range(emitted)),
        verify_mode="exact",
        gemm_backend="torch",
        draft_s=0.001 * (i + 1),
        verify_s=0.003,
        shadow_s=0.002 * emitted,
        rollback_s=0.0005,
    )


# an n-gram session: k=4 but the drafter often proposes fewer; the last step hits the end of
# sequence after its first accepted draft (2 accepted, 2 tokens emitted, not 3)
STEPS = [step(0, 4, 4, 3, 4), step(1, 4, 1, 1, 2), step(2, 4, 2, 0, 1), step(3, 4, 4, 2, 2)]
HEADER = SessionStart(t_ns=0, config={}, versions={}, device="cpu", gemm_backend="torch")


def views():
    model, stats = DashboardModel(), SessionStats()
    for e in [HEADER, *STEPS]:
        model.consume(e)
        stats.consume(e)
    done = PromptDone(
        prompt_index=0,
        new_tokens=9,
        seconds=1.0,
        verify_steps=4,
        accepted_drafts=6,
        proposed_drafts=11,
        exact=True,
    )
    stats.consume(done)
    return model, stats.summary(), dict(_summary(None, step_rows(HEADER, STEPS)))


def test_acceptance_rate_is_accepted_over_proposed_in_every_view():
    model, summary, report = views()
    assert model.acceptance_rate == summary.acceptance_rate == 6 / 11
    assert report["acceptance rate"] == f"{6 / 11:.3f}"
    assert [s.acceptance_rate for s in STEPS] == [3 / 4, 1.0, 0.0, 2 / 4]


def test_mean_accepted_length_counts_the_tokens_really_emitted():
    model, summary, report = views()
    assert model.mean_accepted_length == summary.mean_accepted_length == 9 / 4
    assert report["mean accepted length"] == f"{9 / 4:.3f}"


def test_acceptance_by_position_counts_only_proposed_drafts():
    model, _, _ = views()
    assert model.acceptance_by_position() == [3 / 4, 2 / 3, 1 / 2, 0 / 2]


def test_speculative_tokens_per_s_is_one_definition():
    model, _, _ = views()
    rows = step_rows(HEADER, STEPS)
    spec, shadow = windowed_tokens_per_s(rows)
    tokens, spec_s = 9, sum(s.draft_s + s.verify_s + s.rollback_s for s in STEPS)
    assert math.isclose(model.session_steps.spec_tps, tokens / spec_s)
    assert math.isclose(spec[-1], tokens / spec_s)  # all four steps lie within 1 s
    assert math.isclose(shadow[-1], tokens / sum(s.shadow_s for s in STEPS))
    assert [r.tokens_per_s for r in rows] == [len(s.emitted_tokens) / s.spec_s for s in STEPS]


def test_same_fp32_bits():
    x = float(np.float32(-0.6931472))
    below = float(np.nextafter(np.float32(x), np.float32(-1)))
    assert same_fp32_bits(x, x) and not same_fp32_bits(x, below)
    assert not same_fp32_bits(0.0, -0.0)
    nan = struct.unpack("<f", b"\x00\x00\xc0\x7f")[0]
    assert same_fp32_bits(nan, nan) and not same_fp32_bits(nan, -nan)
    assert same_fp32_bits(None, None) and not same_fp32_bits(None, x)


def test_token_difference_is_ids_first_then_fp32_bits():
    assert token_difference(3, -0.5, 4, -0.5) == "token"
    assert token_difference(3, 0.0, 3, -0.0) == "logprob"
    assert token_difference(3, -0.5, 3, None) == "logprob"  # a missing logprob equals nothing
    assert token_difference(3, -0.5, 3, -0.5) is None


def test_comparison_reports_the_first_bit_and_the_first_text_divergence_once():
    c = Comparison()
    ids, lps = [1, 2, 3, 4, 5], [-0.1, -0.2, -0.3, -0.4, -0.5]
    other_ids, other_lps = [1, 2], [-0.1, -0.2000001]
    assert c.advance(ids, lps, other_ids, other_lps) == [1] and c.bits_at == 1
    other_ids += [3, 9, 8]
    other_lps += [-0.3, -0.4, -0.5]
    assert c.advance(ids, lps, other_ids, other_lps) == [3] and c.text_at == 3
    assert c.compared == 5 and c.advance(ids, lps, other_ids, other_lps) == []
    same = Comparison()  # ids first differing is both divergences at once
    assert same.advance([1, 2], [-0.1, -0.2], [1, 7], [-0.1, -0.2]) == [1]
    assert (same.bits_at, same.text_at) == (1, 1)
