"""Progress on stderr for `run --headless` and `audit`: on a terminal (a real pty) it shows
model load, prefill, prompts/cells done with a rate and an ETA; anywhere else it is silent."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from rich.console import Console

from specdash.cli import main
from specdash.cli.progress import SessionProgress, make_progress
from specdash.errors import EXIT_OK
from specdash.events import Event, StartPhase
from specdash.runs.runner import run_engine
from specdash.settings import SessionSettings


def _model_args(pair: tuple[Path, Path, Path]) -> list[str]:
    return ["--model", str(pair[0]), "--draft", str(pair[1]), "--prompts", str(pair[2])]


def run_with_tty_stderr(args: list[str]) -> tuple[int, str, str]:
    """The CLI in a child whose stderr is a 120x30 pty and whose stdout is a pipe."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdash.cli", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env | {"TERM": "xterm-256color"},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=60), out, b"".join(chunks).decode(errors="replace")


def test_run_shows_load_prefill_and_prompts_with_rate_and_eta_on_a_terminal(pair) -> None:
    code, out, tty = run_with_tty_stderr(
        ["run", "--headless", "--json", "--max-new-tokens", "24", *_model_args(pair)]
    )
    assert code == EXIT_OK, tty
    assert json.loads(out)["prompts"] == 8  # stdout stays the one JSON object
    assert "loading model weights" in tty
    assert "prompts 8/8" in tty and "tok/s" in tty and "ETA" in tty
    assert "Traceback" not in tty


def test_session_progress_follows_the_events_of_a_real_session(pair) -> None:
    progress = make_progress(Console(file=io.StringIO(), force_terminal=True, width=120))
    shown = SessionProgress(progress, prompts=8, max_new_tokens=12)
    seen: list[tuple[str, str, float, float | None]] = []

    def sink(event: Event) -> None:
        shown(event)
        task = progress.tasks[0]
        seen.append((event.kind, task.description, task.completed, task.total))

    assert progress.tasks[0].description == "loading model weights"
    settings = SessionSettings(model=pair[0], draft=pair[1], prompts=pair[2], max_new_tokens=12)
    summary = run_engine(settings, sink)
    starts = [d for kind, d, _, _ in seen if kind == "prompt_start"]
    # prompts counted from 0, as every other view and event counts them
    assert starts[0].startswith("prompts 0/8 · prefill prompt 0 (") and starts[0].endswith(
        " tokens)"
    )
    assert [d for kind, d, _, _ in seen if kind == "prefill"][
        0
    ] == "prompts 0/8 · decoding prompt 0"
    kind, description, completed, total = seen[-1]
    assert description == "prompts 8/8 · done"
    assert completed == total == summary.new_tokens  # early stops leave the total
    assert "tok/s wall" in progress.tasks[0].fields["rate"]


def test_audit_counts_cells_on_a_terminal(pair) -> None:
    code, out, tty = run_with_tty_stderr(
        ["audit", "--json", "--ks", "1", "--num-prompts", "2", "--max-new-tokens", "4"]
        + _model_args(pair)
    )
    assert code == EXIT_OK, tty
    assert len(json.loads(out)["cells"]) == 8
    assert "audit cells 0/8" in tty and "audit cells 8/8" in tty
    assert "cells/min" in tty and "ETA" in tty


def test_no_progress_where_stderr_is_not_a_terminal(capsys, pair) -> None:
    for extra in ([], ["--json"]):
        assert main(["run", "--headless", "--max-new-tokens", "4", *extra, *_model_args(pair)]) == 0
        assert capsys.readouterr().err == ""


def test_session_progress_names_the_engine_start_phase() -> None:
    progress = make_progress(Console(file=io.StringIO(), force_terminal=True, width=120))
    shown = SessionProgress(progress, prompts=24, max_new_tokens=32)
    shown(StartPhase(engine="shadow", phase="load weights", since_start_s=3.5))
    assert progress.tasks[0].description == "starting · shadow engine: load weights"
    shown(
        StartPhase(engine="spec", phase="capture (batch sizes)", done=2, total=8, since_start_s=9)
    )
    assert progress.tasks[0].description == (
        "starting · shadow engine: load weights · spec engine: capture (batch sizes) 2/8"
    )
