"""Trace recording and reading: round trip, crash safety and every kind of bad file."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic_trace import FullDisk, Plan, header, session

from specdash.errors import EnvironmentProblem, UsageError
from specdash.events import SCHEMA, PromptStart, SessionStart
from specdash.trace.jsonl import TraceWriter, git_revision, read_trace


def record(path, events) -> TraceWriter:
    with TraceWriter(path) as writer:
        for e in events:
            writer(e)
    return writer


def test_round_trip_events_equal(tmp_path):
    events = session(Plan(divergence_at=(1, 5)))
    writer = record(tmp_path / "t.jsonl", events)
    head, back, warnings = read_trace(tmp_path / "t.jsonl")
    assert warnings == []
    assert head == events[0]
    assert back == events[1:]
    assert writer.lines_written == len(events) and writer.stopped_reason is None
    assert {e.kind for e in back} >= {
        "prompt_start", "prefill", "draft", "verify_step", "token", "divergence",
        "prompt_done", "telemetry", "control", "summary",
    }  # fmt: skip


def test_non_finite_logprobs_round_trip_bit_for_bit(tmp_path):
    """A broken fast kernel can produce NaN/-inf; the trace must keep exactly that."""
    events = session(Plan(prompts=1, new_tokens=4))
    tokens = [i for i, e in enumerate(events) if e.kind == "token"]
    for i, value in zip(tokens, (float("nan"), float("-inf"), -0.0), strict=False):
        events[i] = events[i].model_copy(update={"logprob": value})
    record(tmp_path / "t.jsonl", events)
    _, back, _ = read_trace(tmp_path / "t.jsonl")
    bits = [struct.pack("<d", e.logprob) for e in back if e.kind == "token"]
    assert bits == [struct.pack("<d", e.logprob) for e in events if e.kind == "token"]


def test_each_event_is_on_disk_before_the_next(tmp_path):
    """Flushed per event: another reader sees every line while the writer is still open."""
    path = tmp_path / "t.jsonl"
    events = session(Plan(prompts=1, new_tokens=4))
    writer = TraceWriter(path)
    for n, e in enumerate(events, start=1):
        writer(e)
        assert path.read_bytes().count(b"\n") == n
    writer.close()


def test_header_gets_git_revision_when_missing(tmp_path):
    start = header(Plan()).model_copy(update={"git_revision": None})
    record(tmp_path / "t.jsonl", [start])
    head, events, _ = read_trace(tmp_path / "t.jsonl")
    assert head.git_revision == git_revision()
    assert events == []


def test_git_revision_of_this_checkout():
    rev = git_revision()
    assert rev is not None and len(rev.removesuffix("-dirty")) == 12


def test_git_revision_outside_git_is_none(tmp_path):
    assert git_revision(tmp_path) is None


def test_header_passed_when_recording_starts_mid_session(tmp_path):
    events = session(Plan(prompts=1, new_tokens=4))
    writer = TraceWriter(tmp_path / "t.jsonl", header=events[0])
    for e in events[5:]:
        writer(e)
    writer.close()
    head, back, _ = read_trace(tmp_path / "t.jsonl")
    assert head == events[0] and back == events[5:]


def test_first_event_must_be_the_header(tmp_path):
    writer = TraceWriter(tmp_path / "t.jsonl")
    writer(PromptStart(prompt_index=0, prompt_tokens=1, text="x"))  # does not raise
    assert writer.stopped_reason == "the session sent prompt_start before its session_start header"
    writer(header(Plan()))
    assert writer.lines_written == 0 and not writer.recording


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    """What kill -9 mid-write leaves: every whole line reads back, the torn one is reported."""
    events = session(Plan(prompts=1))
    path = tmp_path / "t.jsonl"
    record(path, events)
    data = path.read_bytes()
    cut = data[: data.rstrip(b"\n").rfind(b"\n") + 1 + 17]  # 17 bytes into the last line
    path.write_bytes(cut)
    head, back, warnings = read_trace(path)
    assert back == events[1:-1]
    assert len(warnings) == 1 and "torn last line (17 bytes)" in warnings[0]


def test_last_line_without_newline_but_whole_is_kept(tmp_path):
    events = session(Plan(prompts=1, new_tokens=4))
    path = tmp_path / "t.jsonl"
    record(path, events)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    _, back, warnings = read_trace(path)
    assert back == events[1:] and warnings == []


def test_header_only_without_newline_reads(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(header(Plan()).model_dump_json())
    head, events, warnings = read_trace(path)
    assert head == header(Plan()) and events == [] and warnings == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "trace not found"),
        (b"", "is empty"),
        (b"\n\n", "is empty"),
        (b'{"t_ns": 5, "kind": "session_start", "schema_ver', "truncated: its header line"),
        (b"hello world\n", "not a specdash trace (line 1 is not JSON)"),
        (b'{"traceEvents": []}\n', "not a specdash trace (no session_start header)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a specdash trace"),
        (b'{"kind": "session_start", "schema_version": "other/v1"}\n', "schema 'other/v1'"),
        (b'{"kind": "session_start", "schema_version": "specdash/v1"}\n', "bad session header"),
    ],
)
def test_bad_files_are_one_line_usage_errors(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=re.escape(message)) as err:
        read_trace(path)
    assert "\n" not in str(err.value)


def test_directory_is_not_a_trace(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        read_trace(tmp_path)


def test_newer_schema_says_upgrade(tmp_path):
    line = header(Plan()).model_dump() | {"schema_version": "specdash/v4", "new_field": 1}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(UsageError, match=r"schema specdash/v4, newer than .*\(specdash/v3\)"):
        read_trace(path)
    assert SCHEMA == "specdash/v3"


def test_damaged_middle_line_is_an_error_with_its_line_number(tmp_path):
    path = tmp_path / "t.jsonl"
    record(path, session(Plan(prompts=1, new_tokens=4)))
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = '{"kind": "verify_step", "oops": 1}\n'
    path.write_text("".join(lines))
    with pytest.raises(UsageError, match=r"t.jsonl:4: not a specdash event"):
        read_trace(path)


def test_unwritable_path_is_an_environment_problem(tmp_path):
    with pytest.raises(EnvironmentProblem, match="cannot write trace .*No such file"):
        TraceWriter(tmp_path / "missing-dir" / "t.jsonl")
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(EnvironmentProblem, match="Permission denied"):
            TraceWriter(tmp_path / "ro" / "t.jsonl")


def test_full_disk_stops_recording_and_the_session_goes_on():
    events = session(Plan(prompts=1))
    stream = FullDisk(room=4000)
    writer = TraceWriter(stream)
    for e in events:
        writer(e)  # never raises: the engine keeps going
    assert writer.stopped_reason == "No space left on device"
    assert not writer.recording
    assert 1 < writer.lines_written < len(events)


def test_full_disk_trace_reads_back_what_was_written(tmp_path):
    events = session(Plan(prompts=1))
    stream = FullDisk(room=4000)
    stream.close = lambda: None  # keep the contents readable after the writer gives up
    writer = TraceWriter(stream)
    for e in events:
        writer(e)
    path = tmp_path / "t.jsonl"
    path.write_text(stream.getvalue())
    head, back, warnings = read_trace(path)
    assert [head, *back] == events[: writer.lines_written] and warnings == []


def test_header_model_is_session_start():
    assert isinstance(header(Plan()), SessionStart)


CHILD = """
import sys, time
from synthetic_trace import Plan, session
from specdash.trace.jsonl import TraceWriter
writer = TraceWriter(sys.argv[1])
for event in session(Plan(prompts=40)):
    writer(event)
    time.sleep(0.0005)
"""


def test_kill_9_mid_session_keeps_every_flushed_line(tmp_path):
    """A real SIGKILL: whatever was on disk before the kill reads back, in order."""
    path = tmp_path / "t.jsonl"
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (path.exists() and path.read_bytes().count(b"\n") >= 200):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        seen = path.read_bytes().count(b"\n")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    head, events, warnings = read_trace(path)
    expected = session(Plan(prompts=40))
    assert 1 + len(events) >= seen
    assert [head, *events] == expected[: 1 + len(events)] and len(events) < len(expected) - 1
    assert len(warnings) <= 1


def test_trace_tools_never_import_textual():
    """The core stays headless: only the replay UI (specdash.ui.replay_app) may import Textual.
    The recorder, the runner protocol, the session skeleton and the headless CLI need neither
    Textual nor torch."""
    code = (
        "import sys, specdash.trace.jsonl, specdash.trace.export, specdash.trace.diff, "
        "specdash.trace.report, specdash.trace.replay, specdash.trace.recorder, "
        "specdash.runs.runner, specdash.runs.session, specdash.cli.headless, "
        "specdash.cli.traces; "
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_v2_header_reads_with_its_config_as_the_typed_fields(tmp_path):
    """Before v3 the header kept engine, GEMM table, algorithm, shadow and the rate's prefill
    in `config` (SGLang's GEMM table as a list of names, native's as name -> why not)."""
    config = {"engine": "sglang", "speculation": True, "speculative_algorithm": "NEXTN",
              "shadow": False, "rate_includes_prefill": True,
              "gemm_backends": ["auto", "t"]}  # fmt: skip
    line = {"t_ns": 1, "kind": "session_start", "schema_version": "specdash/v2",
            "config": config, "versions": {}, "device": "cuda", "gemm_backend": "auto"}  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    header, _, _ = read_trace(path)
    assert (header.engine, header.speculative_algorithm) == ("sglang", "NEXTN")
    assert header.shadow is False and header.rate_includes_prefill is True
    assert header.usable_gemm_backends == ["auto", "t"] and header.config == config
    native = {"engine": "native", "drafter": "ngram",
              "gemm_backends": {"torch": None, "cublas": "needs a CUDA GPU"}}  # fmt: skip
    path.write_text(json.dumps(line | {"config": native, "gemm_backend": "torch"}) + "\n")
    header, _, _ = read_trace(path)
    assert (header.engine, header.speculative_algorithm, header.shadow) == ("native", "NGRAM", True)
    assert [(c.name, c.unavailable) for c in header.gemm_backends] == [
        ("torch", None),
        ("cublas", "needs a CUDA GPU"),
    ]
    assert header.usable_gemm_backends == ["torch"]


def peak_memory_of(argv: list[str]) -> tuple[int, int]:
    """The CLI's exit code for `argv` and the peak of what Python allocated while it ran."""
    import tracemalloc

    from specdash.cli import main

    tracemalloc.start()
    try:
        code = main(argv)
        return code, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


PEAK_PER_TRACE_BYTE = 5
"""What a trace reader may hold at its peak per byte of each trace it reads: its events, once
(one that held the file whole and its split lines beside the events needed about twice it)."""


@pytest.mark.parametrize(
    "command",
    [
        lambda t, out: ["export", str(t), "--format", "csv", "-o", str(out)],
        lambda t, out: ["diff", str(t), str(t)],
    ],
    ids=["export csv", "diff"],
)
def test_a_trace_readers_memory_is_bounded_by_the_traces_size(tmp_path, capsys, command):

    from specdash.trace import diff, export  # noqa: F401 (imported before measuring)

    trace = tmp_path / "big.jsonl"
    record(trace, session(Plan(prompts=150, new_tokens=64)))
    argv = command(trace, tmp_path / "out.csv")
    read = argv.count(str(trace)) * trace.stat().st_size
    code, peak = peak_memory_of(argv)
    capsys.readouterr()
    assert code == 0
    assert peak < PEAK_PER_TRACE_BYTE * read, f"peak {peak / read:.1f} bytes per trace byte"


STREAMED_PEAK_PER_TRACE_BYTE = 0.5
"""What a reader that needs each event once may hold at its peak per trace byte: a few events
and its own output buffers. Holding the events (or, for Perfetto, the whole document, about 8
bytes per trace byte) is far above it."""


@pytest.mark.parametrize(
    "command",
    [
        lambda t, out: ["export", str(t), "--format", "perfetto", "-o", str(out)],
        lambda t, out: ["export", str(t), "--format", "perfetto", "-o", "-"],
        lambda t, out: ["export", str(t), "--format", "csv", "-o", str(out)],
    ],
    ids=["export perfetto", "export perfetto to stdout", "export csv"],
)
def test_export_holds_an_event_at_a_time_not_the_trace(tmp_path, monkeypatch, command):
    """A stdout that is a file, as in `export -o - > file`: pytest's captured stdout would hold
    the output in memory, which is the test's and not export's."""

    from specdash.trace import export  # noqa: F401 (imported before measuring)

    trace = tmp_path / "big.jsonl"
    record(trace, session(Plan(prompts=150, new_tokens=64)))
    argv = command(trace, tmp_path / "out")
    stdout = tmp_path / "stdout"
    with open(stdout, "w", encoding="utf-8") as f:
        monkeypatch.setattr("sys.stdout", f)
        code, peak = peak_memory_of(argv)
    assert code == 0
    size = trace.stat().st_size
    assert peak < STREAMED_PEAK_PER_TRACE_BYTE * size, f"peak {peak / size:.2f} B per trace byte"
    written = (stdout if argv[-1] == "-" else tmp_path / "out").read_text()
    if "perfetto" in argv:  # the whole document, each verify step in it
        doc = json.loads(written)
        steps = sum(1 for e in session(Plan(prompts=150, new_tokens=64)) if e.kind == "verify_step")
        assert sum(e.get("name") == "tokens_per_s" for e in doc["traceEvents"]) == steps
        assert doc["otherData"]["schema"] == SCHEMA
    else:
        assert len(written.splitlines()) > 1000


def test_report_without_compare_keeps_what_the_page_shows(tmp_path, capsys):
    """The page needs its steps' rows, not their tokens: the events are read as a stream."""
    import tracemalloc

    pytest.importorskip("matplotlib")
    from specdash.cli import main
    from specdash.trace import report  # noqa: F401 (imported before measuring)

    trace = tmp_path / "big.jsonl"
    record(trace, session(Plan(prompts=150, new_tokens=64)))
    main(["report", str(trace), "-o", str(tmp_path / "warm.html")])  # matplotlib's first use
    tracemalloc.start()
    try:
        code = main(["report", str(trace), "-o", str(tmp_path / "r.html")])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    capsys.readouterr()
    assert code == 0 and "<h2>Summary</h2>" in (tmp_path / "r.html").read_text()
    size = trace.stat().st_size
    assert peak < 3 * size, f"peak {peak / size:.2f} B per trace byte"
