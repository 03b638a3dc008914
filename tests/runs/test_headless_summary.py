"""What `run --headless` says a session bought: speculative vs shadow decode t/s and their ratio,
the wall rate with what it includes, and that a --no-spec session speculated nothing."""

from __future__ import annotations

import pytest

from specdash.cli import main
from specdash.cli.headless import format_summary
from specdash.events import (
    ControlChange,
    Idle,
    PromptDone,
    PromptStart,
    SessionStart,
    VerifyStep,
)
from specdash.stats import SessionStats


def _step(t_ns: int, tokens: int, spec_s: float, shadow_s: float, k: int = 3) -> VerifyStep:
    return VerifyStep(
        t_ns=t_ns, prompt_index=0, step=0, k=k, accepted=tokens - 1, draft_tokens=[1] * k,
        emitted_tokens=[1] * tokens, verify_mode="exact", gemm_backend="torch",
        draft_s=spec_s / 2, verify_s=spec_s / 2, shadow_s=shadow_s, rollback_s=0.0,
    )  # fmt: skip


def test_summary_has_the_shadow_rate_the_ratio_and_the_wall_rate():
    stats = SessionStats()
    stats.consume(SessionStart(t_ns=0, config={}, versions={}, device="cpu", gemm_backend="t"))
    stats.consume(_step(1_000_000_000, tokens=4, spec_s=0.5, shadow_s=1.0))
    stats.consume(_step(2_000_000_000, tokens=4, spec_s=0.5, shadow_s=1.0))
    stats.consume(
        PromptDone(
            t_ns=2_000_000_000,
            prompt_index=0,
            new_tokens=8,
            seconds=1.0,
            verify_steps=2,
            accepted_drafts=6,
            proposed_drafts=6,
            exact=True,
            shadow_seconds=2.0,
        )
    )
    summary = stats.summary(at_ns=4_000_000_000)
    assert summary.shadow_tokens_per_s == pytest.approx(8 / 2.0)
    assert summary.tokens_per_s == pytest.approx(8.0) and summary.speedup == pytest.approx(2.0)
    assert summary.wall_seconds == pytest.approx(4.0) and summary.wall_tokens_per_s == 2.0
    text = format_summary(summary, [])
    assert "decode t/s, speculative" in text and "decode t/s, shadow (plain greedy)" in text
    assert "speculative / shadow decode" in text and "x" in text.split("shadow decode")[1]
    wall = next(line for line in text.splitlines() if line.startswith("wall t/s"))
    assert "prefill" in wall and "shadow" in wall


def test_a_rate_over_whole_requests_says_it_holds_their_prefill():
    """An engine that times whole requests (SGLang) says so in its header; the summary then
    names the rate for what it is instead of calling it a decode rate."""
    stats = SessionStats()
    config = {"rate_includes_prefill": True}
    stats.consume(SessionStart(t_ns=0, config=config, versions={}, device="cpu", gemm_backend="t"))
    stats.consume(_step(1_000_000_000, tokens=4, spec_s=0.5, shadow_s=0.0))
    done = PromptDone(t_ns=2_000_000_000, prompt_index=0, new_tokens=4, seconds=2.0,
                      verify_steps=1, accepted_drafts=3, proposed_drafts=3, exact=True,
                      shadow_seconds=4.0)  # fmt: skip
    stats.consume(done)
    summary = stats.summary(at_ns=3_000_000_000)
    assert summary.rate_includes_prefill and summary.tokens_per_s == pytest.approx(2.0)
    assert summary.shadow_tokens_per_s == pytest.approx(1.0) and summary.speedup == 2.0
    text = format_summary(summary, [])
    assert "decode t/s" not in text
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert (
        "2.0" in lines["t/s, speculative requests"]
        and "prefill" in lines["t/s, speculative requests"]
    )
    assert "1.0" in lines["t/s, shadow (plain greedy) requests"]
    assert "2.00x" in lines["speculative / shadow requests"]


def test_the_wall_clock_stops_while_paused_or_idle():
    stats = SessionStats()
    stats.consume(SessionStart(t_ns=0, config={}, versions={}, device="cpu", gemm_backend="t"))
    stats.consume(ControlChange(t_ns=1_000_000_000, name="paused", old="False", new="True",
                                applied_step=0))  # fmt: skip
    stats.consume(ControlChange(t_ns=6_000_000_000, name="paused", old="True", new="False",
                                applied_step=0))  # fmt: skip
    stats.consume(Idle(t_ns=7_000_000_000))
    stats.consume(PromptStart(t_ns=20_000_000_000, prompt_index=1, prompt_tokens=3, text="x"))
    assert stats.summary(at_ns=21_000_000_000).wall_seconds == pytest.approx(3.0)


def test_no_spec_says_nothing_was_speculated(capsys, pair):
    model, draft, prompts = pair
    args = ["run", "--headless", "--no-spec", "--max-new-tokens", "4", "--model", str(model),
            "--prompts", str(prompts)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    exact = next(line for line in text.splitlines() if line.startswith("exact prompts"))
    assert "8/8 identical bits" in exact and "nothing was speculated" in exact
    # a plain session: its rate is named plain, and there is no acceptance to report
    assert "decode t/s, plain" in text and "plain greedy decode, no speculation" in text
    assert "speculative" not in text.replace("nothing was speculated", "")
    assert "acceptance rate" not in text and "mean accepted length" not in text
    assert "verify steps" in text


def test_fail_on_divergence_without_a_shadow_is_refused(capsys, pair):
    """With --no-shadow nothing is compared, so --fail-on-divergence could never fail: exit 2
    before anything loads, one line saying why."""
    model, _, prompts = pair
    args = ["run", "--headless", "--fail-on-divergence", "--no-shadow", "--model", str(model),
            "--prompts", str(prompts)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdash: error: argument --fail-on-divergence: nothing is checked")
    assert "Traceback" not in err


def test_a_cause_at_an_earlier_token_says_why():
    from fake_events import fake_session

    from specdash.events import Divergence

    d = next(e for e in fake_session() if isinstance(e, Divergence))
    d = d.model_copy(update={"root_cause": d.root_cause.model_copy(update={"origin_position": 35})})
    summary = SessionStats().summary(at_ns=1)
    line = format_summary(summary, [d]).splitlines()[-1]
    assert line.startswith("DIVERGED prompt 1 at generated token 37")
    assert "the bits first differed at token 35, an earlier row of the same verify step" in line
    same = d.model_copy(
        update={"root_cause": d.root_cause.model_copy(update={"origin_position": 37})}
    )
    assert "first differed" not in format_summary(summary, [same])


def test_ctrl_c_prints_the_summary_of_the_prompts_done_so_far(capsys, monkeypatch, pair):
    """An interrupted headless run still says what it decoded before the Ctrl-C, then exits
    130 with its one line."""
    from fake_events import fake_session

    from specdash.cli import headless

    def interrupted(settings, sink, options=None, prompts=None):
        events = fake_session(prompts=2)
        first_done = next(i for i, e in enumerate(events) if isinstance(e, PromptDone))
        for event in events[: first_done + 1]:
            sink(event)
        raise KeyboardInterrupt

    monkeypatch.setattr(headless, "run_engine", interrupted)
    model, draft, prompts = pair
    code = main(["run", "--headless", "--model", str(model), "--prompts", str(prompts)])
    captured = capsys.readouterr()
    assert code == 130 and captured.err == "specdash: interrupted\n"
    lines = captured.out.splitlines()
    assert lines[0] == "interrupted: the prompts done so far"
    assert lines[1].split() == ["prompts", "1"] and "1/1 identical bits" in lines[2]
