"""StartWatch: an SGLang start log, written as SGLang writes it (log lines, tqdm bars ending in
'\\r', a line cut between two reads), becomes StartPhase events in order; unknown lines are
ignored; a start that fails ends without "ready". The wording it reads is checked against the
real wheels in tests/sglang/test_sglang_start_lines.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdash.events import StartPhase
from specdash.runs.sglang.start import StartWatch, phase_of

LOG = [
    "[2026-12-04 10:00:00] Using custom SIGQUIT handler\n",
    "[2026-12-04 10:00:01 TP0] Init torch distributed begin.\n",
    "[2026-12-04 10:00:02 TP0] Load weight begin. avail mem=138.10 GB\n",
    "Multi-thread loading shards: 100% Completed | 1/1 [00:00<00:00, 175.00it/s]\n",
    "[2026-12-04 10:00:03 TP0] Load weight end. elapsed=0.41 s, type=Qwen3_5ForCausalLM\n",
    "[2026-12-04 10:00:04 TP0] Capture target decode CUDA graph begin. This can take up to",
    " several minutes. avail mem=68.90 GB\n",
    "Capturing batches (bs=2 avail_mem=68.12 GB):   0%|          | 0/2 [00:00<?, ?it/s]\r",
    "Capturing batches (bs=2 avail_mem=68.12 GB):  50%|█████     | 1/2 [00:00<00:01,  8.6it/s]\r",
    "Capturing batches (bs=1 avail_mem=68.09 GB): 100%|██████████| 2/2 [00:00<00:00, 13.6it/s]\r",
    "Capturing batches (bs=1 avail_mem=68.09 GB): 100%|██████████| 2/2 [00:00<00:00, 13.6it/s]\n",
    "[2026-12-04 10:00:05 TP0] Capture draft extend CUDA graph begin. backend=triton\n",
]


def test_phase_of_reads_sglang_lines() -> None:
    assert phase_of(LOG[1], None) == ("init torch distributed", None, None)
    assert phase_of(LOG[5] + LOG[6], None) == ("capture target decode CUDA graphs", None, None)
    assert phase_of(LOG[8], "capture target decode CUDA graphs") == (
        "capture target decode CUDA graphs",
        1,
        2,
    )
    assert phase_of(LOG[8], None) == ("capture (batch sizes)", 1, 2)
    assert phase_of(LOG[0], None) is None and phase_of(LOG[3], None) is None


def test_watch_emits_each_phase_and_bar_count_in_order(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    log.write_text("an earlier engine's line: Load weight begin\n")  # before the watch: skipped
    events: list[StartPhase] = []
    ticks = iter(range(100))
    watch = StartWatch(log, "spec", events.append, clock=lambda: float(next(ticks)))
    with watch, log.open("a") as f:
        for piece in LOG:
            f.write(piece)
            f.flush()
            watch.read()  # reads between writes: the cut line arrives in two pieces
    got = [(e.engine, e.phase, e.done, e.total) for e in events]
    capture = "capture target decode CUDA graphs"
    assert got == [
        ("spec", "imports, spawn processes", None, None),
        ("spec", "init torch distributed", None, None),
        ("spec", "load weights", None, None),
        ("spec", "allocate KV cache", None, None),
        ("spec", capture, None, None),
        ("spec", capture, 0, 2),
        ("spec", capture, 1, 2),
        ("spec", capture, 2, 2),
        ("spec", "capture draft extend CUDA graphs", None, None),
        ("spec", "ready", None, None),
    ]
    since = [e.since_start_s for e in events]
    assert since == sorted(since) and since[0] < since[-1]  # seconds since the watch began


def test_failed_start_has_no_ready(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    events: list[StartPhase] = []
    with pytest.raises(RuntimeError), StartWatch(log, "shadow", events.append):
        log.write_text(LOG[2])
        raise RuntimeError("scheduler died")
    assert [e.phase for e in events] == ["imports, spawn processes", "load weights"]


def test_start_phases_before_the_header_are_kept_in_the_trace(tmp_path: Path) -> None:
    from specdash.events import SessionStart, Summary
    from specdash.trace.jsonl import TraceWriter, read_trace
    from specdash.trace.recorder import TraceRecorder

    recorder = TraceRecorder(TraceWriter(tmp_path / "t.jsonl"))
    phases = [
        StartPhase(engine="shadow", phase="imports, spawn processes", since_start_s=0.0),
        StartPhase(engine="spec", phase="load weights", since_start_s=20.5),
    ]
    for event in phases:
        recorder.consume(event)
    recorder.consume(SessionStart(config={}, versions={}, device="cuda", gemm_backend="auto"))
    summary = Summary(
        prompts=0, exact_prompts=0, new_tokens=0, seconds=0.0, tokens_per_s=0.0,
        mean_accepted_length=0.0, acceptance_rate=0.0, verify_steps=0, divergences=0,
    )  # fmt: skip
    recorder.consume(summary)
    header, events, problems = read_trace(tmp_path / "t.jsonl")
    assert problems == [] and header.kind == "session_start"
    # the phases come after the header in the file, so their times are raised to the header's:
    # times never go back from the header on; everything else is kept
    kept = [e.model_dump(exclude={"t_ns"}) for e in events[:2]]
    assert kept == [e.model_dump(exclude={"t_ns"}) for e in phases]
    assert all(e.t_ns >= header.t_ns for e in events) and events[-1].kind == "summary"


def test_start_benchmark_reads_a_real_session_trace(tmp_path: Path) -> None:
    """benchmarks/bench_sglang_start.py's timings from the trace of a real headless run (the
    native engine: no start phases; the header comes back from `read_trace` on its own)."""
    import sys
    import time

    from specdash.cli import main
    from specdash.prompts import default_prompts_path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_sglang_start import trace_timings

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(default_prompts_path().read_text().splitlines()[0] + "\n")
    trace = tmp_path / "t.jsonl"
    t0 = time.monotonic_ns()
    argv = ["run", "--headless", "--prompts", str(prompts), "--max-new-tokens", "4"]
    assert main([*argv, "--trace", str(trace)]) == 0
    timings = trace_timings(trace, t0)
    assert 0 < timings["session_header_s"] < timings["first_verified_token_s"]
    assert timings["phases"] == [] and timings["to_first_phase_s"] is None
