"""`specdash diff`: a planted difference is found at the right token, with both sides shown."""

from __future__ import annotations

import pytest
from synthetic_trace import Plan, session

from specdash.cli import main
from specdash.errors import EXIT_DIVERGED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from specdash.events import PromptStart, Token
from specdash.trace.diff import diff_prompts
from specdash.trace.jsonl import TraceWriter


def write(path, events):
    with TraceWriter(path) as w:
        for e in events:
            w(e)
    return str(path)


def token_at(events, prompt, index) -> Token:
    return [e for e in events if isinstance(e, Token) and e.prompt_index == prompt][index]


def test_identical_traces_exit_zero(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", session(Plan()))
    b = write(tmp_path / "b.jsonl", session(Plan(engine="sglang")))
    assert main(["diff", a, b]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"prompt {p}: identical (24 tokens)" for p in range(3)]
    assert out[3].startswith("summary: 0 of 3 prompts differ; A = a.jsonl (native")
    assert "B = b.jsonl (sglang" in out[3]


def test_planted_token_difference_found_at_its_token(tmp_path, capsys):
    base, changed = session(Plan()), session(Plan(change=(1, 13, "token")))
    a, b = write(tmp_path / "a.jsonl", base), write(tmp_path / "b.jsonl", changed)
    assert main(["diff", a, b]) == EXIT_DIVERGED
    out = capsys.readouterr().out.splitlines()
    ta, tb = token_at(base, 1, 13), token_at(changed, 1, 13)
    assert tb.token_id == ta.token_id + 1
    assert out[1] == (
        f"prompt 1: first token difference at generated token 13: "
        f"A: {ta.token_id} {ta.text!r} logprob {ta.logprob!r} | "
        f"B: {tb.token_id} {tb.text!r} logprob {tb.logprob!r}"
    )
    assert out[0] == "prompt 0: identical (24 tokens)"
    assert out[2] == "prompt 2: identical (24 tokens)"
    assert out[3].startswith("summary: 1 of 3 prompts differ")


def test_last_bit_logprob_difference_is_a_difference(tmp_path):
    base, changed = session(Plan()), session(Plan(change=(2, 0, "logprob")))
    diffs = diff_prompts(base[1:], changed[1:])
    d = diffs[2]
    assert d.index == 0 and d.a.token_id == d.b.token_id
    assert d.a.logprob != d.b.logprob and abs(d.a.logprob - d.b.logprob) < 1e-6
    assert [x.index for x in diffs[:2]] == [None, None]


def test_negative_zero_logprob_differs_from_zero():
    base = session(Plan(prompts=1, new_tokens=4))
    i = next(i for i, e in enumerate(base) if isinstance(e, Token))
    a = [*base[:i], base[i].model_copy(update={"logprob": 0.0}), *base[i + 1 :]]
    b = [*base[:i], base[i].model_copy(update={"logprob": -0.0}), *base[i + 1 :]]
    assert diff_prompts(a, b)[0].index == 0


def test_shorter_trace_differs_where_it_ends(tmp_path, capsys):
    base = session(Plan(prompts=2))

    def late(e) -> bool:
        return isinstance(e, Token) and e.prompt_index == 0 and e.position >= 20

    cut = [e for e in base if not late(e)]
    a, b = write(tmp_path / "a.jsonl", base), write(tmp_path / "b.jsonl", cut)
    assert main(["diff", a, b]) == EXIT_DIVERGED
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("prompt 0: first token difference at generated token 20: A: ")
    assert out[0].endswith("| B: (ends after 20 tokens)")


def test_prompt_missing_from_one_trace_differs(tmp_path):
    diffs = diff_prompts(session(Plan(prompts=3))[1:], session(Plan(prompts=2))[1:])
    assert diffs[2].index == 0 and diffs[2].b is None and diffs[2].tokens_b == 0


def test_different_prompt_sets_are_a_usage_error(tmp_path, capsys):
    base = session(Plan(prompts=1))
    other = [
        e.model_copy(update={"text": "something else"}) if isinstance(e, PromptStart) else e
        for e in base
    ]
    a, b = write(tmp_path / "a.jsonl", base), write(tmp_path / "b.jsonl", other)
    assert main(["diff", a, b]) == EXIT_USAGE
    assert "ran different prompts" in capsys.readouterr().err


def test_torn_trace_still_diffs_with_a_warning(tmp_path, capsys):
    base = session(Plan(prompts=1))
    a = write(tmp_path / "a.jsonl", base)
    b = write(tmp_path / "b.jsonl", base)
    data = (tmp_path / "b.jsonl").read_bytes()
    (tmp_path / "b.jsonl").write_bytes(data[:-10])  # the Summary line, torn
    assert main(["diff", a, b]) == EXIT_OK
    assert "torn last line" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["missing.jsonl", "empty.jsonl"])
def test_bad_trace_is_a_usage_error(tmp_path, capsys, bad):
    (tmp_path / "empty.jsonl").write_text("")
    a = write(tmp_path / "a.jsonl", session(Plan(prompts=1)))
    assert main(["diff", a, str(tmp_path / bad)]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("specdash: error: ")


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ([(2, 0, "logprob")], "token ids are identical; logprob bits differ in 1 prompt(s)"),
        ([(1, 13, "token")], "token ids differ in 1 prompt(s)"),
        (
            [(1, 13, "token"), (2, 0, "logprob")],
            "token ids differ in 1 prompt(s), only logprob bits in 1",
        ),
    ],
)
def test_summary_says_whether_ids_or_only_bits_differ(tmp_path, capsys, changes, verdict):
    changed = session(Plan(change=changes[0]))
    if len(changes) > 1:  # plant the second change's token from its own session
        other = session(Plan(change=changes[1]))
        p, i, _ = changes[1]
        old, new = token_at(changed, p, i), token_at(other, p, i)
        changed = [new if e is old else e for e in changed]
    a = write(tmp_path / "a.jsonl", session(Plan()))
    b = write(tmp_path / "b.jsonl", changed)
    assert main(["diff", a, b]) == EXIT_DIVERGED
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.endswith(f": {verdict}"), summary


def test_a_recorded_shadow_margin_at_the_difference_is_shown(tmp_path, capsys):
    from specdash.events import Divergence, Margin

    base, changed = session(Plan()), session(Plan(change=(1, 13, "token")))
    ta, tb = token_at(base, 1, 13), token_at(changed, 1, 13)
    margin = Margin(top1_token=ta.token_id, top2_token=tb.token_id, gap=1.2e-7, ulps=2,
                    near_tie=True)  # fmt: skip
    flagged = Divergence(
        t_ns=tb.t_ns, prompt_index=1, position=13, step=tb.step, k=3, verify_mode="fast",
        gemm_backend="torch", what="token", spec_token=tb.token_id, shadow_token=ta.token_id,
        spec_logprob=tb.logprob, shadow_logprob=ta.logprob, shadow_margin=margin,
    )  # fmt: skip
    at = changed.index(tb) + 1
    a = write(tmp_path / "a.jsonl", base)
    b = write(tmp_path / "b.jsonl", [*changed[:at], flagged, *changed[at:]])
    assert main(["diff", a, b]) == EXIT_DIVERGED
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith(f"B's {margin.text(flipped=True)}"), line


def killed_after(events, prompt: int, tokens: int):
    """What a recording killed mid-run holds: everything before `prompt`'s token `tokens`."""
    cut = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, Token) and e.prompt_index == prompt and e.position == tokens
    )
    return events[:cut]


def test_an_incomplete_recording_is_not_a_divergence(tmp_path, capsys):
    base = session(Plan())
    a = write(tmp_path / "a.jsonl", base)
    b = write(tmp_path / "b.jsonl", killed_after(base, 1, 20))
    assert main(["diff", a, b]) == EXIT_INCOMPLETE
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "prompt 0: identical (24 tokens)",
        "prompt 1: incomplete in B: the recording stops mid-prompt (A 24 tokens, B 20); "
        "the 20 tokens both hold are identical",
        # prompt 2 never started in B: not "mid-prompt"
        "prompt 2: incomplete in B: the recording stops before this prompt's first token "
        "(A 24 tokens, B 0); no token to compare",
    ]
    assert out[3].startswith("summary: 0 of 3 prompts differ, 2 incomplete (a recording stops")
    assert out[3].endswith(
        ": token ids and logprob bits are identical as far as both recordings go"
    )
    assert main(["diff", b, a]) == EXIT_INCOMPLETE  # either side
    assert "prompt 1: incomplete in A:" in capsys.readouterr().out


def test_a_divergence_before_the_cut_is_still_a_divergence(tmp_path, capsys):
    base, changed = session(Plan()), session(Plan(change=(1, 13, "token")))
    a = write(tmp_path / "a.jsonl", base)
    b = write(tmp_path / "b.jsonl", killed_after(changed, 1, 20))
    assert main(["diff", a, b]) == EXIT_DIVERGED
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("prompt 1: first token difference at generated token 13")
    assert out[2].startswith("prompt 2: incomplete in B")
    assert out[3].startswith("summary: 1 of 3 prompts differ, 1 incomplete")


def test_both_cut_at_the_same_token_is_incomplete_not_identical(tmp_path, capsys):
    cut = killed_after(session(Plan(prompts=1)), 0, 10)
    a, b = write(tmp_path / "a.jsonl", cut), write(tmp_path / "b.jsonl", cut)
    assert main(["diff", a, b]) == EXIT_INCOMPLETE
    assert capsys.readouterr().out.startswith("prompt 0: incomplete in A and B:")


def test_recordings_differing_only_in_max_new_tokens(tmp_path, capsys):
    """Real sessions of the same prompts, 8 and 4 tokens each: the 4 both hold are compared,
    the lengths said to differ, and nothing is a divergence."""
    from tiny_models import write_pair

    target, draft, prompts = write_pair(tmp_path / "pair")
    traces = {}
    for n in (8, 4):
        traces[n] = tmp_path / f"n{n}.jsonl"
        args = ["--model", str(target), "--draft", str(draft), "--prompts", str(prompts)]
        code = main(["run", "--headless", "--max-new-tokens", str(n), *args,
                     "--trace", str(traces[n])])  # fmt: skip
        assert code == EXIT_OK
    capsys.readouterr()
    assert main(["diff", str(traces[8]), str(traces[4])]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "prompt 0: identical for the 4 tokens both hold; the lengths differ "
        "(A 8 tokens, B 4): B reached its --max-new-tokens"
    )
    assert out[-1].endswith(
        "token ids and logprob bits are identical in every token both hold; "
        "the lengths differ where one reached its --max-new-tokens"
    )
    assert out[-1].startswith("summary: 0 of 8 prompts differ")


def test_a_shorter_prompt_below_its_limit_still_differs(tmp_path):
    """The shorter one stopped by itself (an end of text), not at its limit: a difference."""
    base = session(Plan())
    cut = [
        e for e in base if not (isinstance(e, Token) and e.prompt_index == 1 and e.position >= 20)
    ]
    diffs = diff_prompts(base[1:], cut[1:], (24, 24))
    assert diffs[1].index == 20 and diffs[1].b is None and not diffs[1].capped
    assert diff_prompts(base[1:], cut[1:], (24, 20))[1].capped == "B"
