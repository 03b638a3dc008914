"""Exit codes that tell what happened: an existing --trace file is refused (2) unless
--overwrite-trace, and an input (the prompt file, a checkpoint's file) or a trace another
specdash records whatever the flag; a recording cut short by a full disk exits 4, the
dashboard exits with the code of the error that ended its session (a bad --model: 3), and
Ctrl-C in it with 130."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import time

import pytest

from specdash import output_files
from specdash.cli import build_parser, main
from specdash.cli.dashboard import dashboard_app, run_dashboard
from specdash.errors import (
    EXIT_CHECKPOINT,
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)
from specdash.trace.jsonl import TraceWriter, read_trace


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
    writer = TraceWriter(path, overwrite=True)
    writer.close()  # no session recorded: the old file stays, and nothing beside it
    assert path.read_text() == "x"
    assert writer.partial is None and [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


class FullDisk(io.StringIO):
    """Takes the header and a few lines, then fails like a full disk."""

    def write(self, s: str) -> int:
        if self.tell() > 3000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(s)


def test_disk_full_while_recording_exits_4(capsys, monkeypatch, pair, tmp_path) -> None:
    monkeypatch.setattr(output_files, "open", lambda *a, **k: FullDisk(), raising=False)
    code = main(headless(pair, "--trace", str(tmp_path / "t.jsonl")))
    out, err = capsys.readouterr()
    assert code == EXIT_ENVIRONMENT
    assert "exact prompts" in out  # the session itself ran to the end
    assert err.strip() == (
        "specdash: error: recording stopped: No space left on device; "
        f"{tmp_path / 't.jsonl'} holds the session up to then"
    )


def press_once(app, ready, key: str) -> None:
    """Run the dashboard until `ready()` (60 s at most), then press `key`."""

    async def drive() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 60
            while not ready() and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.press(key)

    asyncio.run(drive())


def test_dashboard_with_a_bad_model_exits_3_after_q(pair, tmp_path) -> None:
    args = build_parser().parse_args(["--model", str(tmp_path / "missing"), "--drafter", "ngram"])
    app = dashboard_app(args)
    press_once(app, lambda: app.model.errors, "q")
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


@pytest.mark.parametrize("via", ["the path", "a symlink"])
def test_a_trace_onto_the_prompt_file_is_refused_and_the_prompts_kept(
    capsys, pair, tmp_path, via
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(pair[2].read_bytes())
    trace = prompts
    if via == "a symlink":
        trace = tmp_path / "link.jsonl"
        trace.symlink_to(prompts)
    args = ["run", "--headless", "--model", str(pair[0]), "--drafter", "ngram"]
    code = main([*args, "--prompts", str(prompts), "--trace", str(trace), "--overwrite-trace"])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"specdash: error: trace {trace} would overwrite the prompt file {prompts}; "
        "specdash never writes over its inputs\n"
    )
    assert prompts.read_bytes() == pair[2].read_bytes()


def test_a_trace_onto_a_checkpoint_file_is_refused(capsys, pair, tmp_path) -> None:
    config = pair[0] / "config.json"
    before = config.read_bytes()
    args = build_parser().parse_args(
        ["--model", str(pair[0]), "--drafter", "ngram", "--trace", str(config), "--overwrite"]
    )
    with pytest.raises(UsageError, match="would overwrite the model checkpoint"):
        dashboard_app(args)  # refused before the dashboard takes the terminal
    assert config.read_bytes() == before


def test_a_second_writer_of_one_trace_is_refused(capsys, pair, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    first = TraceWriter(trace)  # a session recording there now
    try:
        code = main(headless(pair, "--trace", str(trace), "--overwrite-trace"))
        assert code == EXIT_USAGE
        assert capsys.readouterr().err == (
            f"specdash: error: trace {trace} is being written by another specdash; "
            "wait for it to finish or record to another file\n"
        )
        assert trace.read_text() == ""  # the first writer's file, untouched
    finally:
        first.close()
    assert main(headless(pair, "--trace", str(trace), "--overwrite-trace")) == EXIT_OK
    header, events, warnings = read_trace(trace)
    assert [e.kind for e in events].count("summary") == 1 and warnings == []


def test_ctrl_c_in_the_dashboard_exits_130(pair, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    flags = ["--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(pair[2])]
    app = dashboard_app(build_parser().parse_args([*flags, "--trace", str(trace)]))
    press_once(app, lambda: app.model.steps, "ctrl+c")
    assert app.return_value == EXIT_INTERRUPTED
    header, events, _ = read_trace(trace)  # the trace so far is kept
    assert any(e.kind == "verify_step" for e in events)


def test_run_dashboard_says_interrupted(capsys, monkeypatch, tmp_path) -> None:
    from specdash.ui.app import SpecdashApp

    monkeypatch.setattr(SpecdashApp, "run", lambda self: EXIT_INTERRUPTED)
    args = build_parser().parse_args(["--model", str(tmp_path / "missing")])
    assert run_dashboard(args) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "specdash: interrupted\n"


def test_run_dashboard_says_where_a_cut_short_recording_is(capsys, monkeypatch, tmp_path) -> None:
    """After the dashboard closes, a recording that was to replace an old trace and did not
    close whole (Ctrl-C, the engine's death) is named on stderr, as headless names it."""
    from specdash.ui.app import SpecdashApp

    stopped = f"recording cut short (quit); {tmp_path / 't.jsonl'} kept as it was; ..."

    def run(self) -> int:
        self.recorder.stopped = stopped
        return EXIT_INTERRUPTED

    monkeypatch.setattr(SpecdashApp, "run", run)
    args = build_parser().parse_args(["--model", str(tmp_path / "missing")])
    assert run_dashboard(args) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"specdash: warning: {stopped}\nspecdash: interrupted\n"
