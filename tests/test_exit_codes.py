"""Exit codes that tell what happened: an existing --trace file is refused (2) unless
--overwrite-trace, a recording cut short by a full disk exits 4, and the dashboard exits with
the code of the error that ended its session (a bad --model: 3)."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import time
from pathlib import Path

import pytest
from tiny_models import write_pair

from specdash.cli import build_parser, main
from specdash.cli.dashboard import dashboard_app, run_dashboard
from specdash.errors import EXIT_CHECKPOINT, EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE, UsageError
from specdash.trace import jsonl
from specdash.trace.jsonl import TraceWriter, read_trace


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_pair(tmp_path_factory.mktemp("tiny"))


def headless(pair, *args: str) -> list[str]:
    return ["run", "--headless", "--max-new-tokens", "4", "--drafter", "ngram",
            "--model", str(pair[0]), "--prompts", str(pair[2]), *args]  # fmt: skip


def test_existing_trace_is_refused_unless_overwrite(capsys, pair, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("keep me\n")
    assert main(headless(pair, "--trace", str(trace))) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == (
        f"specdash: error: trace {trace} already exists; pass --overwrite-trace to replace it"
    )
    assert trace.read_text() == "keep me\n"
    assert main(headless(pair, "--trace", str(trace), "--overwrite-trace")) == EXIT_OK
    header, events, warnings = read_trace(trace)
    assert events[-1].kind == "summary" and warnings == []


def test_trace_writer_refuses_an_existing_file(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("x")
    with pytest.raises(UsageError, match="already exists"):
        TraceWriter(path)
    TraceWriter(path, overwrite=True).close()
    assert path.read_text() == ""


class FullDisk(io.StringIO):
    """Takes the header and a few lines, then fails like a full disk."""

    def write(self, s: str) -> int:
        if self.tell() > 3000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(s)


def test_disk_full_while_recording_exits_4(capsys, monkeypatch, pair, tmp_path) -> None:
    monkeypatch.setattr(jsonl, "open", lambda *a, **k: FullDisk(), raising=False)
    code = main(headless(pair, "--trace", str(tmp_path / "t.jsonl")))
    out, err = capsys.readouterr()
    assert code == EXIT_ENVIRONMENT
    assert "exact prompts" in out  # the session itself ran to the end
    assert err.strip() == (
        "specdash: error: recording stopped: No space left on device; "
        f"{tmp_path / 't.jsonl'} holds the session up to then"
    )


def test_dashboard_with_a_bad_model_exits_3_after_q(pair, tmp_path) -> None:
    args = build_parser().parse_args(["--model", str(tmp_path / "missing"), "--drafter", "ngram"])
    app = dashboard_app(args)

    async def drive() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 60
            while not app.model.errors and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.press("q")

    asyncio.run(drive())
    assert app.model.errors and app.model.errors[0].exit_code == EXIT_CHECKPOINT
    assert app.return_value == app.exit_code == EXIT_CHECKPOINT


def test_run_dashboard_returns_the_code_with_one_line(capsys, monkeypatch, tmp_path) -> None:
    from specdash.events import EngineError
    from specdash.ui.app import SpecdashApp

    def run(self):
        self.model.consume(EngineError(message="no such checkpoint", exit_code=EXIT_CHECKPOINT))
        return self.exit_code

    monkeypatch.setattr(SpecdashApp, "run", run)
    args = build_parser().parse_args(["--model", str(tmp_path / "missing")])
    assert run_dashboard(args) == EXIT_CHECKPOINT
    assert capsys.readouterr().err == "specdash: error: no such checkpoint\n"
