"""`specdash compare`: two real sessions of the embedded pair, fp32 against bf16 and fp32 against
a second fp32 run, through the real CLI; the re-scoring checked against the recorded bits."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic_trace import Plan, session

from specdash.cli import main
from specdash.errors import EXIT_DIVERGED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from specdash.events import Event, Margin, SessionStart, Summary, Token
from specdash.prompts import default_prompts_path
from specdash.runs.teacher_forced import teacher_forced
from specdash.trace.compare import PathScore, Scored, TeacherForced, compare, kl_over_support
from specdash.trace.jsonl import TraceWriter, read_trace

TOKENS = 32


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, str]:
    """The 4 shortest shipped prompts, 32 tokens each: fp32 twice (separate runs), bf16 once."""
    root = tmp_path_factory.mktemp("compare")
    lines = default_prompts_path().read_text().splitlines(keepends=True)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(sorted(lines, key=lambda line: json.loads(line)["tokens"])[:4]))
    out = {}
    for name, dtype in (("f32", "float32"), ("f32-again", "float32"), ("bf16", "bfloat16")):
        out[name] = str(root / f"{name}.jsonl")
        argv = ["run", "--headless", "--dtype", dtype, "--prompts", str(prompts),
                "--max-new-tokens", str(TOKENS), "--trace", out[name]]  # fmt: skip
        assert main(argv) == EXIT_OK
    return out


def rewrite(src: str, dst: Path, change) -> str:
    """A copy of trace `src` with each event replaced by `change(event)`."""
    header, events, _ = read_trace(src)
    with TraceWriter(dst) as w:
        for e in [header, *events]:
            w(change(e))
    return str(dst)


def compare_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def tokens_of(events: list[Event]) -> dict[int, list[Token]]:
    by: dict[int, list[Token]] = {}
    for e in events:
        if isinstance(e, Token):
            by.setdefault(e.prompt_index, []).append(e)
    return by


def tokens(path: str) -> dict[int, list[Token]]:
    return tokens_of(read_trace(path)[1])


def bits(x: float) -> bytes:
    return struct.pack("<f", x)


def test_fp32_against_bf16_finds_flips_margins_and_nonzero_deltas(traces, capsys):
    code, r = compare_json(capsys, traces["f32"], traces["bf16"])
    assert code == EXIT_OK
    det = r["determinism"]
    assert det["deterministic"] and det["exact"] == {"a": "4/4", "b": "4/4"}
    assert "Only because each run is deterministic" in det["note"]
    prompts = r["prompts"]
    flips = [p for p in prompts if p["flip"] is not None]
    assert flips, "bf16 flips none of the 4 prompts"
    for p in flips:
        assert p["agree"] == p["flip"] and p["margin_at_flip"] is not None
        assert p["margin_at_flip"]["gap"] > 0
        # at the flip B reads A's context and picks its own token: not A's
        assert p["teacher_forced"]["argmax_agree"] < p["teacher_forced"]["positions"]
        assert p["verdict"].startswith(f"{p['agree']} tokens agree, then a flip at token")
    for p in prompts:
        tf = p["teacher_forced"]
        assert tf["positions"] == TOKENS and tf["mean_abs_delta_logprob"] > 0
        assert tf["max_abs_delta_logprob"] > 0 and tf["mean_kl"] > 0 and not tf["kl_exact"]
        assert p["first_bits_difference"] == 0  # bf16 never gives fp32's bits
    # B re-scored to its recorded bits at every token of its own path that reads A's context
    assert det["reproduced_tokens"] == {
        "a": 4 * TOKENS,
        "b": sum(min(p["agree"] + 1, p["tokens_b"]) for p in prompts),
    }
    assert r["totals"]["flips"] == len(flips)
    assert r["totals"]["near_tie_flips"] + r["totals"]["wide_flips"] == len(flips)


def test_teacher_forced_scores_are_the_recorded_bits_where_the_paths_agree(traces):
    """The strong check, outside compare's own: B's teacher-forced logprob of A's token equals
    B's recorded logprob bit for bit at every position before the first flip, and A's own
    along all of its path; after a flip B's scores are not its recorded ones."""
    header_a, events_a, _ = read_trace(traces["f32"])
    header_b = read_trace(traces["bf16"])[0]
    scores = teacher_forced((header_a, header_b), events_a, top_k=8)
    ta, tb = tokens(traces["f32"]), tokens(traces["bf16"])
    flipped = 0
    for p, a in scores.a.items():
        b = scores.b[p]
        assert [bits(s.token_logprob) for s in a.positions] == [bits(t.logprob) for t in ta[p]]
        assert [s.argmax for s in a.positions] == [t.token_id for t in ta[p]]
        pairs = enumerate(zip(ta[p], tb[p], strict=False))
        agree = next((i for i, (x, y) in pairs if x.token_id != y.token_id), len(tb[p]))
        before = b.positions[:agree]
        assert [bits(s.token_logprob) for s in before] == [bits(t.logprob) for t in tb[p][:agree]]
        if agree < TOKENS:
            flipped += 1
            assert b.positions[agree].argmax == tb[p][agree].token_id != ta[p][agree].token_id
        assert b.support == a.support and all(len(ids) == 8 for ids in a.support)
    assert flipped


def test_fp32_against_fp32_is_identical_with_zero_delta(traces, capsys):
    assert main(["compare", traces["f32"], traces["f32-again"]]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("A (reference) = f32.jsonl (native, float32")
    assert out[2].startswith("deterministic: A 4/4 and B 4/4 prompts equal their plain")
    assert f"re-scoring reproduced A's {4 * TOKENS} recorded tokens and B's {4 * TOKENS}" in out[2]
    for p, line in enumerate(out[3:7]):
        assert line.startswith(
            f"prompt {p}: identical: ids and fp32 logprob bits equal at all {TOKENS} tokens | "
            f"teacher-forced along A's {TOKENS} tokens: |Δ logprob| mean 0 max 0 (token 0), "
            f"B's argmax = A's token {TOKENS}/{TOKENS}, "
        ), line
        assert line.endswith("mean 0 max 0"), line
    assert out[7].startswith("totals: 4/4 identical, 4/4 same text, 0 with a flip")
    code, r = compare_json(capsys, traces["f32"], traces["f32-again"])
    assert code == EXIT_OK
    for p in r["prompts"]:
        tf = p["teacher_forced"]
        assert tf["mean_abs_delta_logprob"] == tf["max_abs_delta_logprob"] == 0.0
        assert tf["mean_kl"] == tf["max_kl"] == 0.0 and tf["argmax_agree"] == TOKENS
        assert p["flip"] is None and p["first_bits_difference"] is None


def test_a_recorded_logprob_the_rescoring_does_not_give_fails_the_check(traces, tmp_path, capsys):
    """One ulp off in B's trace, before any flip: not deterministic, exit 1, said where."""
    target = next(t for t in tokens(traces["bf16"])[0] if t.position == 3)
    nudged = float(np.nextafter(np.float32(target.logprob), np.float32(0)))  # one fp32 ulp

    def change(e: Event) -> Event:
        return e.model_copy(update={"logprob": nudged}) if e == target else e

    b = rewrite(traces["bf16"], tmp_path / "b.jsonl", change)
    assert main(["compare", traces["f32"], b]) == EXIT_DIVERGED
    det = capsys.readouterr().out.splitlines()[2]
    assert det.startswith("NOT deterministic: ")
    assert (
        f"prompt 0: re-scoring B gave token {target.token_id} logprob {target.logprob!r} at "
        f"generated token 3, its trace has {target.token_id} {nudged!r}"
    ) in det


def test_trace_only_says_what_is_missing(traces, capsys):
    assert main(["compare", traces["f32"], traces["bf16"], "--trace-only"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "teacher-forced along" not in out
    assert (
        "missing: teacher-forced agreement (|Δ logprob|, argmax agreement, KL) and A's margin "
        "at a flip: not run (--trace-only)"
    ) in out
    assert "A's margin there is not known" in out


def test_an_sglang_side_is_not_rescored_and_says_so(traces, tmp_path, capsys):
    def to_sglang(e: Event) -> Event:
        if isinstance(e, SessionStart):
            return e.model_copy(update={"engine": "sglang"})
        return e

    b = rewrite(traces["bf16"], tmp_path / "b.jsonl", to_sglang)
    code, r = compare_json(capsys, traces["f32"], b)
    assert code == EXIT_OK
    assert r["missing"] == [
        "teacher-forced agreement (|Δ logprob|, argmax agreement, KL) and A's margin at a flip: "
        "B is not scored: a sglang session is not re-scored: teacher forcing runs the native "
        "engine only"
    ]
    assert all(p["teacher_forced"] is None for p in r["prompts"])


def test_a_trace_without_a_shadow_is_not_known_deterministic(traces, tmp_path, capsys):
    def unchecked(e: Event) -> Event:
        if isinstance(e, Summary):
            return e.model_copy(update={"checked": False, "exact_prompts": None})
        return e

    b = rewrite(traces["bf16"], tmp_path / "b.jsonl", unchecked)
    assert main(["compare", traces["f32"], b, "--trace-only"]) == EXIT_INCOMPLETE
    assert (
        capsys.readouterr()
        .out.splitlines()[2]
        .startswith("determinism not checked: A 4/4 and B not checked (--no-shadow) prompts")
    )


def test_different_prompts_are_refused_before_any_model_loads(traces, tmp_path, capsys):
    def other(e: Event) -> Event:
        return e.model_copy(update={"text": "x"}) if e.kind == "prompt_start" else e

    b = rewrite(traces["bf16"], tmp_path / "b.jsonl", other)
    assert main(["compare", traces["f32"], b]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("specdash: error: the traces ran different prompts") and err[-1] == "\n"


def test_ids_another_tokenizer_reads_otherwise_are_refused(traces, tmp_path, capsys):
    """A's ids must mean the same tokens to the setting scoring them."""
    target = tokens(traces["f32"])[1][5]

    def retext(e: Event) -> Event:
        return e.model_copy(update={"text": "elsewhere"}) if e == target else e

    a = rewrite(traces["f32"], tmp_path / "a.jsonl", retext)
    assert main(["compare", a, traces["bf16"]]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"specdash: error: A's tokenizer reads token {target.token_id} as {target.text!r}, "
        "A's trace as 'elsewhere': compare needs one tokenizer\n"
    )


def test_top_k_below_two_is_a_flag_error(traces, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", traces["f32"], traces["bf16"], "--top-k", "1"])
    assert exit_.value.code == EXIT_USAGE
    assert "argument --top-k: 1 is out of range (2 or more)" in capsys.readouterr().err


def test_the_html_report_carries_the_comparison(traces, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.html"
    assert main(["report", traces["f32"], "--compare", traces["bf16"], "-o", str(out)]) == 0
    page = out.read_text()
    assert "<h2 id='comparison'>Compared with B</h2>" in page
    assert "deterministic: A 4/4 and B 4/4 prompts equal their plain greedy shadow" in page
    table = page.split("id='compare-prompts'>")[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + 4  # the head, a row per prompt
    assert "bf16.jsonl (native, bfloat16" in page and "totals: 0/4 identical" in page
    assert main(["report", traces["f32"], "--compare", traces["bf16"], "-o", traces["bf16"],
                 "--overwrite"]) == EXIT_USAGE  # fmt: skip
    assert "would overwrite the trace it compares" in capsys.readouterr().err


def scored_along(path: list[Token], own: list[Token], gap: float) -> PathScore:
    """A score that gives back `own`'s tokens and bits where they are (and `path`'s after),
    with a top-2 `gap` below each."""
    positions = []
    for j, t in enumerate(path):
        mine = own[j] if j < len(own) else t
        margin = Margin(top1_token=mine.token_id, top2_token=mine.token_id + 1, gap=gap,
                        ulps=int(gap * 2**23), near_tie=gap < 1e-3)  # fmt: skip
        support = (mine.logprob, mine.logprob - gap)
        positions.append(Scored(t.logprob, mine.token_id, mine.logprob, support, -1.0, margin))
    return PathScore(positions, [(t.token_id, t.token_id + 1) for t in path], vocab=1000)


@pytest.mark.parametrize(("gap", "why"), [(2.0, "across a wide gap"), (1e-4, "across a near-tie")])
def test_a_flip_is_judged_by_a_margin_at_it(gap, why):
    """The verdict at a flip follows A's margin there: wide (B computed other values) or a
    near-tie (rounding decided it); B's re-scored tokens up to the flip are checked."""
    base, changed = session(Plan()), session(Plan(change=(1, 13, "token")))
    ta, tb = tokens_of(base), tokens_of(changed)
    scores = TeacherForced(
        a={p: scored_along(ta[p], ta[p], gap) for p in ta},
        b={p: scored_along(ta[p], tb[p][: 14 if p == 1 else None], gap) for p in ta},
        top_k=2,
    )
    cmp = compare(base[1:], changed[1:], scores)
    assert not cmp.determinism.failed and cmp.determinism.reproduced == (72, 24 + 14 + 24)
    flipped = cmp.prompts[1]
    assert (flipped.agree, flipped.flip, flipped.margin.gap) == (13, 13, gap)
    assert flipped.verdict().startswith(f"13 tokens agree, then a flip at token 13, {why}")
    assert [c.identical for c in cmp.prompts] == [True, False, True]


def test_kl_over_the_whole_vocabulary_is_the_kl_and_a_top_k_bounds_it_from_below():
    rng = random.Random(0)
    a = torch.log_softmax(torch.tensor([rng.gauss(0, 2) for _ in range(50)]).double(), -1)
    b = torch.log_softmax(a + torch.tensor([rng.gauss(0, 0.3) for _ in range(50)]).double(), -1)
    full = float((a.exp() * (a - b)).sum())
    order = a.argsort(descending=True)

    def scored(lp: torch.Tensor, k: int) -> Scored:
        top, rest = order[:k], order[k:]
        outside = float(lp[rest].logsumexp(-1)) if k < len(order) else -math.inf
        return Scored(0.0, 0, 0.0, tuple(lp[top].tolist()), outside)

    assert kl_over_support(scored(a, 50), scored(b, 50)) == pytest.approx(full, rel=1e-12)
    bounds = [kl_over_support(scored(a, k), scored(b, k)) for k in (1, 2, 8, 32, 49)]
    assert bounds[0] > 0 and bounds == sorted(bounds) and bounds[-1] <= full


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_against_bf16_on_cuda_is_identical(tmp_path, capsys):
    """On CUDA the teacher-forced rows replay the verify graphs: still the recorded bits."""
    runs = []
    for name in ("a", "b"):
        runs.append(str(tmp_path / f"{name}.jsonl"))
        argv = ["run", "--headless", "--device", "cuda", "--max-new-tokens", "24",
                "--trace", runs[-1]]  # fmt: skip
        assert main(argv) == EXIT_OK
    code, r = compare_json(capsys, *runs)
    assert code == EXIT_OK and r["totals"]["identical"] == r["totals"]["prompts"]
    assert r["determinism"]["reproduced_tokens"]["a"] == r["totals"]["tokens_a"]


def test_teacher_forced_rows_do_not_depend_on_how_many_a_forward_takes(traces):
    """Exact rows are decode's bits whatever the chunking: 1, 5 or 17 rows a forward give the
    same log-prob rows, bit for bit."""
    from specdash.engine.drafters import NgramDrafter
    from specdash.engine.engine import Engine
    from specdash.engine.loader import load_models
    from specdash.settings import SessionSettings

    events = read_trace(traces["bf16"])[1]
    start = next(e for e in events if e.kind == "prompt_start")
    path = [t.token_id for t in tokens(traces["bf16"])[start.prompt_index]]
    loaded = load_models(SessionSettings(dtype="bfloat16", speculation=False, shadow=False))
    engine = Engine(loaded.target, NgramDrafter, loaded.eos_ids)
    prompt = loaded.tokenizer.encode(start.text)
    with torch.inference_mode():
        by_rows = {
            n: torch.cat([r.clone() for r in engine.teacher_forced(prompt, path, n)])
            for n in (1, 5, 17)
        }
    assert by_rows[1].shape == (TOKENS, loaded.target.cfg.vocab_size)
    assert torch.equal(by_rows[1], by_rows[5]) and torch.equal(by_rows[1], by_rows[17])
