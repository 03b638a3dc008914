"""`specdash report`: a self-contained HTML page with every plot, divergences and settings."""

from __future__ import annotations

import base64
import math
import re
import sys
from pathlib import Path

import pytest
from synthetic_trace import Plan, session

from specdash.cli import main
from specdash.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE
from specdash.trace.export import StepRow
from specdash.trace.jsonl import TraceWriter
from specdash.trace.report import (
    PLOTS,
    acceptance_by_position,
    broken_at_gaps,
    windowed_tokens_per_s,
)

IMG = re.compile(r"<figure id='plot-([a-z-]+)'>.*?src='data:image/png;base64,([^']+)'")


def record(path, plan: Plan) -> str:
    with TraceWriter(path) as w:
        for e in session(plan):
            w(e)
    return str(path)


def report(tmp_path, trace: str) -> str:
    out = tmp_path / "r.html"
    assert main(["report", trace, "-o", str(out)]) == EXIT_OK
    return out.read_text()


def test_report_has_every_plot_as_an_embedded_png(tmp_path):
    page = report(tmp_path, record(tmp_path / "s.jsonl", Plan(divergence_at=(1, 9))))
    images = dict(IMG.findall(page))
    assert set(images) == set(PLOTS)
    pngs = {key: base64.b64decode(data) for key, data in images.items()}
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000 for png in pngs.values())
    assert len(set(pngs.values())) == len(PLOTS)  # five different pictures
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere


def test_report_lists_divergences_with_context_and_the_settings(tmp_path):
    page = report(tmp_path, record(tmp_path / "s.jsonl", Plan(divergence_at=(1, 9))))
    divergences = page[page.index("id='divergences'") : page.index("id='settings'")]
    assert "Divergences (1)" in divergences
    assert "… the quick brown" in divergences and "<td>9</td>" in divergences
    # each number is held whole in a span that never wraps; the top-2 of a name is no number
    assert "<span class='n'>2,097,152</span>" in divergences and "top-2" in divergences
    assert re.search(r"\(<span class='n'>-\d\.\d{5,}</span>\)", divergences)  # a logprob
    text = re.sub(r"<span class='n'>([^<]*)</span>", r"\1", divergences)
    assert "shadow top-1 − top-2 0.25 nats (2,097,152 fp32 ulps), wide" in text
    settings = page[page.index("id='settings'") :]
    for expected in ("config.k</th><td>4", "GEMM backend</th><td>triton", "0123456789ab",
                     "version.torch</th><td>2.13.0+cpu", "specdash/v3", "engine</th><td>native",
                     "speculative algorithm</th><td>STANDALONE"):  # fmt: skip
        assert expected in settings


def test_exact_session_says_no_divergence(tmp_path):
    page = report(tmp_path, record(tmp_path / "s.jsonl", Plan(telemetry=False)))
    assert "None: every verified token matched the shadow" in page
    assert set(dict(IMG.findall(page))) == set(PLOTS)  # the bandwidth plot says "no samples"


def test_cut_trace_still_reports_with_its_warning(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    record(path, Plan())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    page = report(tmp_path, str(path))
    assert "torn last line" in page and "the session did not finish" in page
    assert "torn last line" in capsys.readouterr().err


def test_bad_input_and_unwritable_output(tmp_path):
    assert main(["report", str(tmp_path / "none.jsonl")]) == EXIT_USAGE
    trace = record(tmp_path / "s.jsonl", Plan(prompts=1))
    assert main(["report", trace, "-o", str(tmp_path / "no" / "r.html")]) == EXIT_ENVIRONMENT


def test_without_matplotlib_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    trace = record(tmp_path / "s.jsonl", Plan(prompts=1))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["report", trace]) == EXIT_ENVIRONMENT
    err = capsys.readouterr().err
    assert err == (
        "specdash: error: the report's plots need matplotlib: pip install 'specdash[report]'\n"
    )


def row(t_s, k, accepted, draft_s=0.01, verify_s=0.02, shadow_s=0.04, drafted=None) -> StepRow:
    return StepRow(
        t_s=t_s, prompt_index=0, step=0, k=k, plain=k == 0,
        drafted=k if drafted is None else drafted,
        accepted=accepted, emitted=accepted + 1,
        verify_mode="exact", gemm_backend="x", draft_s=draft_s, verify_s=verify_s,
        rollback_s=0.0, shadow_s=shadow_s, tokens_per_s=0.0, shadow_tokens_per_s=0.0,
    )  # fmt: skip


def test_acceptance_by_position_counts_only_steps_that_drafted_there():
    rows = [row(0, 4, 4), row(1, 4, 1), row(2, 2, 2), row(3, 2, 0), row(4, 4, 0, drafted=0)]
    assert acceptance_by_position(rows) == [3 / 4, 2 / 4, 1 / 2, 1 / 2]


def test_windowed_throughput_covers_the_last_second():
    rows = [row(0.0, 4, 3), row(0.5, 4, 1), row(1.2, 4, 0)]
    spec, shadow = windowed_tokens_per_s(rows)
    assert spec[0] == pytest.approx(4 / 0.03)
    assert spec[1] == pytest.approx(6 / 0.06)
    assert spec[2] == pytest.approx(3 / 0.06)  # the step at 0.0 s left the window
    assert shadow[1] == pytest.approx(6 / 0.08)


def test_an_existing_report_is_replaced_only_when_asked(tmp_path, capsys):
    trace = record(tmp_path / "s.jsonl", Plan(prompts=1))
    html = tmp_path / "s.html"
    html.write_text("keep me")
    assert main(["report", trace]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"specdash: error: output {html} already exists; pass --overwrite to replace it\n"
    )
    assert html.read_text() == "keep me"
    assert main(["report", trace, "--overwrite"]) == EXIT_OK
    assert html.read_text().startswith("<!DOCTYPE html>")


def test_a_report_never_overwrites_its_trace(tmp_path, capsys):
    trace = record(tmp_path / "s.jsonl", Plan(prompts=1))
    before = Path(trace).read_bytes()
    assert main(["report", trace, "-o", trace, "--overwrite"]) == EXIT_USAGE
    assert "would overwrite the trace it reads" in capsys.readouterr().err
    assert Path(trace).read_bytes() == before


def test_rate_lines_break_where_no_step_ran():
    """A root-cause replay (or a long prefill, or idle) between steps: the rate plot lifts its
    pen there and shades the stretch, rather than drawing a rate across time nothing decoded."""
    t = [0.0, 0.1, 0.2, 7.5, 7.6]
    xs, (ys,), gaps = broken_at_gaps(t, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert gaps == [(0.2, 7.5)]
    assert xs == [0.0, 0.1, 0.2, pytest.approx(3.85), 7.5, 7.6]
    assert ys[:3] == [1.0, 2.0, 3.0] and math.isnan(ys[3]) and ys[4:] == [4.0, 5.0]
    assert broken_at_gaps(t[:3], [1.0, 2.0, 3.0])[2] == []  # steady decoding: one line


def test_summary_names_its_seconds_and_has_the_shadow_rate_and_speedup(tmp_path):
    events = session(Plan(prompts=1))
    summary = events[-1]
    events[-1] = summary.model_copy(update={"shadow_tokens_per_s": summary.tokens_per_s / 2,
                                            "wall_seconds": 9.5})  # fmt: skip
    trace = tmp_path / "s.jsonl"
    with TraceWriter(trace) as w:
        for e in events:
            w(e)
    page = report(tmp_path, str(trace))
    table = page[page.index("<h2>Summary</h2>") : page.index("<h2>Plots</h2>")]
    assert f"speculative seconds (decode steps)</th><td>{summary.seconds:.3f}" in table
    assert f"shadow (plain greedy) tokens / s</th><td>{summary.tokens_per_s / 2:.2f}" in table
    assert "speedup (speculative / shadow)</th><td>2.00x" in table
    assert "session wall seconds (idle and paused excluded)</th><td>9.500" in table
    assert "<th>seconds</th>" not in table
