"""benchmarks/bench_dashboard.py measures the session the flags of `specdash run` describe: the
same settings in every mode, a line per run, the JSON a cut-off device call keeps, warm-up
prompts left out of the count, a budget that starts no run past it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdash.errors import EXIT_USAGE
from specdash.prompts import default_prompts_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_dashboard  # noqa: E402


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(default_prompts_path().read_text().splitlines(keepends=True)[:3]))
    return path


def test_headless_and_the_dashboard_process_on_the_run_flags(tmp_path, prompts, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["--only", "dashboard-process", "--repeats", "1", "--warmup", "none"]
    argv += ["--warmup-prompts", "1", "--json", str(out), "--prompts", str(prompts)]
    argv += ["--max-new-tokens", "4", "--drafter", "ngram", "-k", "2"]  # `specdash run`'s flags
    assert bench_dashboard.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("round 1" in line and "engine" in line for line in lines) == 2  # one per run
    record = json.loads(out.read_text())
    settings = record["settings"]
    assert (settings["max_new_tokens"], settings["drafter"], settings["k"]) == (4, "ngram", 2)
    assert settings["prompts"] == str(prompts) and record["sglang"] is None
    assert record["warmup_prompts"] == 1 and record["argv"] == argv
    runs = {r["mode"]: r for r in record["runs"]}
    assert list(runs) == ["headless", "dashboard-process"]
    for run in runs.values():
        assert run["round"] == 1 and run["engine_tps"] > 0 and 0 < run["start_s"] < run["wall_s"]
        assert run["tokens"] == 2 * 4  # prompts 1 and 2: prompt 0 warmed up
    assert runs["headless"]["ui_cpu"] is None and runs["dashboard-process"]["ui_cpu"] > 0
    modes = record["modes"]
    assert modes["headless"]["vs_headless"] == 1.0 and modes["dashboard-process"]["runs"] == 1
    ratio = modes["dashboard-process"]["engine_tps"] / modes["headless"]["engine_tps"]
    assert modes["dashboard-process"]["vs_headless"] == pytest.approx(ratio)


def test_budget_starts_no_run_past_it(tmp_path, prompts, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["--only", "headless", "--repeats", "3", "--warmup", "once", "--budget-s", "0"]
    argv += ["--json", str(out), "--prompts", str(prompts), "--max-new-tokens", "2"]
    assert bench_dashboard.main(argv) == 0
    assert "budget: headless round 1 not started" in capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert [(r["mode"], r["round"]) for r in runs] == [("headless", 0)]  # the warm-up only


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--trace", "t.jsonl"], "specdash: error: --trace: not measured"),
        (["--warmup-prompts", "3"], "specdash: error: --warmup-prompts 3: the prompt set has 3"),
        (["-k", "99"], "specdash: error: argument -k: 99 is out of range"),
    ],
)
def test_bad_flags_are_one_line(prompts, capsys, flags, line) -> None:
    with pytest.raises(SystemExit) as e:
        sys.exit(bench_dashboard.main(["--prompts", str(prompts), *flags]))
    assert e.value.code == EXIT_USAGE
    assert capsys.readouterr().err.startswith(line)
