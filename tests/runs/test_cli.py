"""The command line's contract: `run --json` fields, `--fail-on-divergence`, `audit --json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import CORPUS, PROMPTS

from specdash.cli import main
from specdash.errors import EXIT_DIVERGED, EXIT_OK
from specdash.events import Event, PromptStart


def _model_args(pair: tuple[Path, Path, Path]) -> list[str]:
    return ["--model", str(pair[0]), "--draft", str(pair[1]), "--prompts", str(pair[2])]


def test_run_json_prints_one_object_with_the_summary_fields(capsys, pair) -> None:
    code = main(["run", "--headless", "--json", "--max-new-tokens", "8", *_model_args(pair)])
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK
    assert {
        "prompts",
        "exact_prompts",
        "tokens_per_s",
        "mean_accepted_length",
        "acceptance_rate",
    } <= set(out)
    assert out["prompts"] == out["exact_prompts"] == 8
    assert out["tokens_per_s"] > 0 and 1.0 <= out["mean_accepted_length"] <= 5.0


def test_fail_on_divergence_exits_1_only_when_something_diverged(capsys, pair) -> None:
    args = [
        "run",
        "--headless",
        "--fail-on-divergence",
        "--max-new-tokens",
        "8",
        "-k",
        "4",
        *_model_args(pair),
    ]
    assert main([*args, "--verify", "exact"]) == EXIT_OK
    capsys.readouterr()
    assert main([*args, "--verify", "fast"]) == EXIT_DIVERGED
    captured = capsys.readouterr()
    assert "DIVERGED" in captured.out and "root cause" in captured.out
    assert "divergence(s)" in captured.err


def test_audit_json_reports_every_cell_and_exact_mode_is_all_exact(capsys, pair) -> None:
    code = main(
        [
            "audit",
            "--json",
            "--ks",
            "1,3",
            "--num-prompts",
            "3",
            "--max-new-tokens",
            "6",
            *_model_args(pair),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK and report["exact_mode_all_exact"]
    cells = report["cells"]
    assert len(cells) == 2 * 2 * 2 * 2  # k x drafter x batch x verify
    keys = {(c["k"], c["drafter"], c["batch"], c["verify"]) for c in cells}
    assert len(keys) == len(cells)
    for c in cells:
        assert c["prompts"] == 3
        if c["verify"] == "exact":
            assert c["exact_prompts"] == 3
            assert c["token_divergences"] == c["logprob_divergences"] == 0


def test_audit_decodes_the_longest_prompts_too(capsys, pair, tmp_path, monkeypatch) -> None:
    """The audit's prompts spread over the set's lengths, the shortest and the longest included:
    with the long prompts last in the file, `--num-prompts 3` still decodes the longest (long
    prompts move GEMM M, attention splits and the KV each row reads)."""
    from specdash.cli import audit

    text = "".join(CORPUS)
    texts = [*PROMPTS, text * 3, text * 6]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": t, "name": f"p{i}"}) + "\n" for i, t in enumerate(texts))
    )
    decoded: list[str] = []
    native_session = audit.native_session

    def recording(settings, sink, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        def seen(e: Event) -> None:
            if isinstance(e, PromptStart):
                decoded.append(e.text)
            sink(e)

        return native_session(settings, seen, *args, **kwargs)

    monkeypatch.setattr(audit, "native_session", recording)
    args = ["--ks", "1", "--num-prompts", "3", "--max-new-tokens", "4", *_model_args(pair)]
    code = main(["audit", "--json", *args[:-1], str(prompts)])
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK and report["exact_mode_all_exact"]
    assert len(set(decoded)) == 3 and {min(texts, key=len), max(texts, key=len)} <= set(decoded)
    assert report["prompts"] == [f"p{i}" for i, t in enumerate(texts) if t in decoded]
    assert all(c["prompts"] == 3 for c in report["cells"])


def test_no_shadow_says_not_checked_instead_of_zero_exact(capsys, pair) -> None:
    args = ["run", "--headless", "--no-shadow", "--max-new-tokens", "4", *_model_args(pair)]
    assert main([*args, "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["exact_prompts"] is None and out["checked"] is False and out["prompts"] == 8
    assert main(args) == EXIT_OK
    text = capsys.readouterr().out
    exact = next(line for line in text.splitlines() if line.startswith("exact prompts"))
    assert exact.split()[2:] == ["not", "checked", "(--no-shadow)"]
    assert "0/8" not in text
    assert main([*args[:2], "--json", "--max-new-tokens", "4", *_model_args(pair)]) == EXIT_OK
    checked = json.loads(capsys.readouterr().out)
    assert checked["exact_prompts"] == 8 and checked["checked"] is True


def test_run_json_lists_each_divergence_with_both_tokens_and_bits(capsys, pair) -> None:
    args = ["run", "--headless", "--json", "--max-new-tokens", "8", "-k", "4", *_model_args(pair)]
    assert main([*args, "--verify", "fast"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    divergences = out["divergences"]
    assert isinstance(divergences, list) and divergences
    assert out["divergence_count"] == len(divergences)
    for d in divergences:
        assert {"prompt", "token_index", "what", "root_cause"} <= set(d)
        assert isinstance(d["spec_token"], int) and isinstance(d["shadow_token"], int)
        for side in ("spec", "shadow"):
            assert float.fromhex(d[f"{side}_logprob_hex"]) == d[f"{side}_logprob"]
        assert (d["what"] == "token") == (d["spec_token"] != d["shadow_token"])
    first = [d for d in divergences if d["root_cause"] is not None]
    assert first and all(d["root_cause"]["sub_op"] for d in first)
    assert main([*args, "--verify", "exact"]) == EXIT_OK
    exact = json.loads(capsys.readouterr().out)
    assert exact["divergences"] == [] and exact["divergence_count"] == 0


def test_audit_axis_flags_narrow_the_matrix(capsys, pair) -> None:
    """-k, --drafter, --batch and --verify each narrow their axis to the value given."""
    args = ["audit", "--json", "--num-prompts", "2", "--max-new-tokens", "4", *_model_args(pair)]
    code = main([*args, "-k", "2", "--drafter", "model", "--batch", "1", "--verify", "exact"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert code == EXIT_OK
    assert [(c["k"], c["drafter"], c["batch"], c["verify"]) for c in cells] == [
        (2, "model", 1, "exact")
    ]
    no_draft = [a for a in args if a not in ("--draft", str(pair[1]))]  # ngram drafts by lookup
    assert main([*no_draft, "--ks", "1,2", "--drafter", "ngram", "--verify", "fast"]) in (0, 1)
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert {(c["k"], c["batch"]) for c in cells} == {(1, 1), (1, 8), (2, 1), (2, 8)}
    assert {(c["drafter"], c["verify"]) for c in cells} == {("ngram", "fast")}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-shadow"], "argument --no-shadow: not an audit flag: every cell is checked"),
        (["--no-spec"], "argument --no-spec: not an audit flag"),
        (["--trace", "t.jsonl"], "argument --trace: not an audit flag: it records no trace"),
        (["--engine", "sglang"], "argument --engine: the audit runs the native engine only"),
        (["-k", "3", "--ks", "1,2"], "argument -k: give -k (one k) or --ks (several), not both"),
    ],
)
def test_audit_refuses_the_flags_it_cannot_honour(capsys, tmp_path, flags, message) -> None:
    assert main(["audit", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specdash: error: {message}") and "Traceback" not in err
    assert not (tmp_path / "t.jsonl").exists()
