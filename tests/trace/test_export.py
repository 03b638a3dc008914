"""`specdash export`: Perfetto JSON checked against the Chrome Trace Event format, and CSV rows.

No Perfetto reader runs offline here (the `perfetto` package downloads trace_processor_shell
at first use), so the JSON is checked structurally against the rules its importer applies.
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys

import pytest
from synthetic_trace import T0_NS, Plan, session

from specdash.cli import main
from specdash.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE
from specdash.events import TelemetrySample, VerifyStep
from specdash.trace.export import GPU_COUNTERS, perfetto_trace, step_rows, write_csv
from specdash.trace.jsonl import TraceWriter, read_trace

PHASES = {"B", "E", "X", "i", "I", "C", "b", "e", "n", "s", "t", "f", "M"}


def is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def check_chrome_trace(doc: dict) -> None:
    """The Chrome Trace Event format as Perfetto's JSON importer reads it."""
    assert set(doc) <= {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    for ev in doc["traceEvents"]:
        assert isinstance(ev["name"], str) and ev["ph"] in PHASES, ev
        assert isinstance(ev["pid"], int), ev
        assert isinstance(ev.get("args", {}), dict), ev
        if ev["ph"] == "M":
            assert ev["name"] in {"process_name", "thread_name", "thread_sort_index"}
            continue
        assert is_number(ev["ts"]) and ev["ts"] >= 0, ev
        assert ("dur" in ev) == (ev["ph"] == "X"), ev
        if ev["ph"] == "X":
            assert is_number(ev["dur"]) and ev["dur"] >= 0 and isinstance(ev["tid"], int), ev
        if ev["ph"] == "C":
            assert ev["args"] and all(is_number(v) for v in ev["args"].values()), ev
        if ev["ph"] == "i":
            assert ev["s"] in ("g", "p", "t"), ev
    json.dumps(doc, allow_nan=False)  # strict JSON: what chrome://tracing's JSON.parse takes


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "s.jsonl"
    events = session(Plan(divergence_at=(2, 7)))
    with TraceWriter(path) as w:
        for e in events:
            w(e)
    return path, events


def test_perfetto_json_follows_the_format(trace, tmp_path):
    path, events = trace
    out = tmp_path / "p.json"
    assert main(["export", str(path), "--format", "perfetto", "-o", str(out)]) == EXIT_OK
    doc = json.loads(out.read_text())
    check_chrome_trace(doc)
    evs = doc["traceEvents"]
    names = {(e["args"]["name"]) for e in evs if e["name"] in ("process_name", "thread_name")}
    assert names >= {"engine", "cpu", "draft", "verify", "shadow"}
    steps = [e for e in events if isinstance(e, VerifyStep)]
    for phase in ("draft", "verify", "shadow", "rollback"):
        slices = [e for e in evs if e["ph"] == "X" and e["name"] == phase]
        assert len(slices) == len(steps)
        assert all({"step", "k", "accepted", "backend"} <= set(s["args"]) for s in slices)


def test_the_streamed_perfetto_file_is_the_document_json_dump_writes(trace, tmp_path):
    """`export` writes the document an event at a time; the bytes are those of dumping it
    whole, so viewers and scripts see the same file."""
    path, events = trace
    out = tmp_path / "p.json"
    assert main(["export", str(path), "--format", "perfetto", "-o", str(out)]) == EXIT_OK
    header, read, _ = read_trace(path)
    assert out.read_text() == json.dumps(perfetto_trace(header, read), allow_nan=False)


def test_a_damaged_line_mid_trace_leaves_no_export(trace, tmp_path, capsys):
    """The events are checked as they are written: a bad line ends the export with its one
    line (exit 2), and the half-written document is not left under the output's name."""
    path, _ = trace
    lines = path.read_text().splitlines(keepends=True)
    lines[len(lines) // 2] = '{"kind": "verify_step"}\n'
    path.write_text("".join(lines))
    out = tmp_path / "p.json"
    assert main(["export", str(path), "--format", "perfetto", "-o", str(out)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("specdash: error: ") and len(err.splitlines()) == 1, err
    assert f"s.jsonl:{len(lines) // 2 + 1}: not a specdash event" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_timestamps_are_microseconds_since_the_header(trace):
    path, events = trace
    doc = perfetto_trace(events[0], events[1:])
    step = next(e for e in events if isinstance(e, VerifyStep))
    shadow = next(e for e in doc["traceEvents"] if e["name"] == "shadow")
    end_us = (step.t_ns - T0_NS) / 1000
    assert shadow["ts"] + shadow["dur"] == pytest.approx(end_us, abs=1e-6)
    assert shadow["dur"] == pytest.approx(step.shadow_s * 1e6)
    draft = next(e for e in doc["traceEvents"] if e["name"] == "draft")
    total = step.draft_s + step.verify_s + step.rollback_s + step.shadow_s
    assert draft["ts"] == pytest.approx(end_us - total * 1e6)
    assert draft["args"] == {"prompt": 0, "step": 0, "k": step.k, "accepted": step.accepted,
                             "backend": "triton", "verify_mode": "exact"}  # fmt: skip


def test_divergence_control_and_gpu_counters(trace):
    path, events = trace
    evs = perfetto_trace(events[0], events[1:])["traceEvents"]
    div = [e for e in evs if e["ph"] == "i" and e["name"].startswith("divergence")]
    assert len(div) == 1 and div[0]["args"]["pos"] == 7 and div[0]["args"]["prompt"] == 2
    assert div[0]["args"]["shadow_token"] == div[0]["args"]["spec_token"] + 1
    prompts = [e for e in evs if e["ph"] == "i" and e["name"].startswith("prompt ")]
    assert [(p["args"]["prompt"], p["s"]) for p in prompts] == [(0, "p"), (1, "p"), (2, "p")]
    ctl = [e for e in evs if e["ph"] == "i" and e["name"] == "k: 4 -> 2"]
    assert len(ctl) == 1 and ctl[0]["args"]["applied_step"] == 3
    samples = [e for e in events if isinstance(e, TelemetrySample)]
    for name in GPU_COUNTERS:
        track = [e for e in evs if e["ph"] == "C" and e["name"] == name]
        expected = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        assert [c["args"]["value"] for c in track] == expected
        assert all(c["pid"] == 2 for c in track)
    acc = [e["args"]["value"] for e in evs if e["name"] == "accepted_per_step"]
    assert acc == [e.accepted for e in events if isinstance(e, VerifyStep)]


def test_non_finite_values_stay_strict_json(trace):
    _, events = trace
    i = next(i for i, e in enumerate(events) if e.kind == "divergence")
    events[i] = events[i].model_copy(update={"shadow_logprob": float("-inf")})
    j = next(i for i, e in enumerate(events) if e.kind == "telemetry")
    events[j] = events[j].model_copy(update={"power_w": float("nan")})
    doc = perfetto_trace(events[0], events[1:])
    check_chrome_trace(doc)
    div = next(e for e in doc["traceEvents"] if e["name"].startswith("divergence"))
    assert div["args"]["shadow_logprob"] == "-inf"


def test_csv_has_one_row_per_step(trace, tmp_path):
    path, events = trace
    out = tmp_path / "s.csv"
    assert main(["export", str(path), "--format", "csv", "-o", str(out)]) == EXIT_OK
    rows = list(csv.DictReader(out.open()))
    steps = [e for e in events if isinstance(e, VerifyStep)]
    assert len(rows) == len(steps)
    assert [int(r["accepted"]) for r in rows] == [s.accepted for s in steps]
    first = steps[0]
    expected = len(first.emitted_tokens) / (first.draft_s + first.verify_s + first.rollback_s)
    assert float(rows[0]["tokens_per_s"]) == pytest.approx(expected)
    assert step_rows(events[0], events[1:])[0].shadow_tokens_per_s == pytest.approx(
        len(first.emitted_tokens) / first.shadow_s
    )


def test_default_output_sits_next_to_the_trace(trace, capsys):
    path, _ = trace
    assert main(["export", str(path), "--format", "perfetto"]) == EXIT_OK
    assert path.with_suffix(".perfetto.json").exists()
    assert "wrote" in capsys.readouterr().err


def test_bad_input_and_unwritable_output_are_one_line_errors(trace, tmp_path, capsys):
    path, _ = trace
    assert main(["export", str(tmp_path / "nope.jsonl"), "--format", "csv"]) == EXIT_USAGE
    out = str(tmp_path / "no-dir" / "x.json")
    assert main(["export", str(path), "--format", "perfetto", "-o", out]) == EXIT_ENVIRONMENT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("specdash: error: trace not found")
    assert err[1].startswith("specdash: error: cannot write") and "No such file" in err[1]


def test_stdout_closed_early_is_not_an_error(tmp_path):
    """`specdash export T -o - | head`: the reader leaving is success, with no traceback."""
    path = tmp_path / "big.jsonl"
    with TraceWriter(path) as w:
        for e in session(Plan(new_tokens=600)):
            w(e)
    cmd = [sys.executable, "-m", "specdash.cli", "export", str(path), "-o", "-"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout.read(100).startswith(b'{"traceEvents"')
    child.stdout.close()
    assert child.wait(timeout=60) == EXIT_OK
    assert child.stderr.read() == b""


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_export_never_writes_over_the_trace_it_reads(trace, capsys, overwrite):
    path, _ = trace
    before = path.read_bytes()
    code = main(["export", str(path), "--format", "csv", "-o", str(path), *overwrite])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"specdash: error: output {path} would overwrite the trace it reads {path}; "
        "specdash never writes over its inputs\n"
    )
    assert path.read_bytes() == before


@pytest.mark.parametrize("fmt", ["perfetto", "csv"])
def test_an_existing_output_is_replaced_only_when_asked(trace, capsys, fmt):
    path, _ = trace
    out = path.with_suffix(".perfetto.json" if fmt == "perfetto" else ".csv")
    out.write_text("keep me")
    assert main(["export", str(path), "--format", fmt]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"specdash: error: output {out} already exists; pass --overwrite to replace it\n"
    )
    assert out.read_text() == "keep me"
    assert main(["export", str(path), "--format", fmt, "--overwrite"]) == EXIT_OK
    assert out.read_text() != "keep me"
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, out.name])


def test_without_a_shadow_there_is_no_shadow_rate(tmp_path):
    events = session(Plan(extra={"shadow": False}))
    rows = step_rows(events[0], events[1:])
    assert rows and all(r.shadow_tokens_per_s is None and r.shadow_s == 0.0 for r in rows)
    names = {e["name"] for e in perfetto_trace(events[0], events[1:])["traceEvents"]}
    assert "tokens_per_s" in names and "shadow_tokens_per_s" not in names
    out = io.StringIO()
    write_csv(events[0], events[1:], out)
    assert {r["shadow_tokens_per_s"] for r in csv.DictReader(io.StringIO(out.getvalue()))} == {""}
