"""The rule every file specdash writes follows (`specdash.output_files`): never over an input
(through a symlink or a hard link either), over an existing file only when asked, a whole file
appears at once or not at all, and a trace being recorded is locked against a second writer."""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from specdash import output_files
from specdash.cli import main
from specdash.errors import (
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    EnvironmentProblem,
    UsageError,
)
from specdash.output_files import Output
from specdash.trace.jsonl import read_trace


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "keep me"}\n')
    return path


def names_in(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link", "relative"])
def test_an_input_is_refused_whatever_the_flag(tmp_path, prompts, how, monkeypatch) -> None:
    if how == "symlink":
        (tmp_path / "link").symlink_to(prompts)
        out = tmp_path / "link"
    elif how == "hard link":
        os.link(prompts, tmp_path / "hard")
        out = tmp_path / "hard"
    elif how == "relative":
        monkeypatch.chdir(tmp_path)
        out = type(prompts)("sub/../p.jsonl")
        (tmp_path / "sub").mkdir()
    else:
        out = prompts
    for overwrite in (False, True):
        with pytest.raises(UsageError, match="would overwrite the prompt file .*never writes"):
            Output(out, what="trace", inputs=[(prompts, "the prompt file")], overwrite=overwrite)
    assert prompts.read_text() == '{"prompt": "keep me"}\n'


def test_a_file_under_an_input_directory_is_an_input(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    inputs = [(model, "the model checkpoint")]
    with pytest.raises(UsageError, match="would overwrite the model checkpoint"):
        Output(model / "config.json", what="trace", inputs=inputs, overwrite=True)
    Output(model / "new.jsonl", what="trace", inputs=inputs)  # a new file beside it is fine


def test_an_existing_file_only_when_asked(tmp_path) -> None:
    old = tmp_path / "t.csv"
    old.write_text("old")
    with pytest.raises(UsageError, match=r"t.csv already exists; pass --overwrite to replace"):
        Output(old, what="output", flag="--overwrite")
    with Output(old, what="output", overwrite=True).replace() as f:
        f.write("new")
    assert old.read_text() == "new"
    assert names_in(tmp_path) == ["t.csv"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path) -> None:
    old = tmp_path / "t.csv"
    old.write_text("the good one")
    with pytest.raises(RuntimeError), Output(old, what="output", overwrite=True).replace() as f:
        f.write("half of the new")
        assert names_in(tmp_path) != ["t.csv"]  # the new one goes to a temporary name
        raise RuntimeError("crash mid-write")
    assert old.read_text() == "the good one"
    assert names_in(tmp_path) == ["t.csv"]


def test_a_name_taken_while_writing_is_not_replaced(tmp_path) -> None:
    path = tmp_path / "r.html"
    output = Output(path, what="output", flag="--overwrite")
    with pytest.raises(UsageError, match="already exists"), output.replace() as f:
        f.write("mine")
        path.write_text("someone else's")
    assert path.read_text() == "someone else's"
    assert names_in(tmp_path) == ["r.html"]


def test_an_unwritable_directory_is_an_environment_problem(tmp_path) -> None:
    with (
        pytest.raises(EnvironmentProblem, match="cannot write output .*No such file"),
        Output(tmp_path / "no" / "x.json", what="output").replace() as f,
    ):
        f.write("x")


def test_a_directory_is_never_replaced(tmp_path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        Output(tmp_path, what="output", overwrite=True)


def test_a_live_file_is_locked_while_it_records(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    first = Output(path, what="trace").live()
    first.stream.write("line 1\n")
    first.stream.flush()
    with pytest.raises(UsageError, match="being written by another specdash"):
        Output(path, what="trace", overwrite=True).live()
    first.stream.write("line 2\n")
    first.close()
    assert path.read_text() == "line 1\nline 2\n"
    second = Output(path, what="trace", overwrite=True).live()  # free again
    second.close()
    assert path.read_text() == ""


def test_a_live_file_replacing_an_old_one_keeps_it_until_closed(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old trace\n")
    live = Output(path, what="trace", overwrite=True).live()
    live.stream.write("new line\n")
    live.stream.flush()
    assert path.read_text() == "old trace\n"  # a crash now loses nothing of the old trace
    (partial,) = (p for p in tmp_path.iterdir() if p.name != "t.jsonl")
    assert partial.read_text() == "new line\n" and partial.name.startswith(".t.jsonl.")
    with pytest.raises(UsageError, match="being written by another specdash"):
        Output(path, what="trace", overwrite=True).live()
    live.close()
    assert path.read_text() == "new line\n"
    assert names_in(tmp_path) == ["t.jsonl"]


def test_without_hard_links_the_rename_still_writes_it(tmp_path, monkeypatch) -> None:
    """A file system without hard links (some network and FAT mounts): the check made before
    writing is what keeps an existing file, and the new one is renamed into place."""

    def no_links(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "r.html"
    with Output(path, what="output").replace() as f:
        f.write("page")
    assert path.read_text() == "page" and names_in(tmp_path) == ["r.html"]


# -- through the command line: every output of every command ---------------------------------


@pytest.fixture(scope="module")
def recorded(pair, tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "t.jsonl"
    assert main(headless(pair, "--trace", str(trace))) == 0
    return trace


def headless(pair, *args: str) -> list[str]:
    return ["run", "--headless", "--max-new-tokens", "4", "--drafter", "ngram",
            "--model", str(pair[0]), "--prompts", str(pair[2]), *args]  # fmt: skip


def make_special(path, kind: str) -> int:
    """A `kind` of file at `path`; returns its `stat.S_IFMT` for checking it afterwards."""
    if kind == "character device":  # a /dev/null of our own (the tests run as root)
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        path.mkdir()
    return stat.S_IFMT(os.lstat(path).st_mode)


OUTPUTS = {
    "run --trace": lambda pair, trace, out: headless(pair, "--trace", str(out), "--overwrite"),
    "export -o": lambda pair, trace, out: ["export", str(trace), "-o", str(out), "--overwrite"],
    "export --format csv -o": lambda pair, trace, out: [
        "export",
        str(trace),
        "--format",
        "csv",
        "-o",
        str(out),
        "--overwrite",
    ],  # fmt: skip
    "report -o": lambda pair, trace, out: ["report", str(trace), "-o", str(out), "--overwrite"],
}


@pytest.mark.parametrize("command", OUTPUTS)
@pytest.mark.parametrize("kind", ["character device", "FIFO", "socket", "directory"])
def test_only_a_regular_file_is_ever_replaced(capsys, pair, recorded, tmp_path, command, kind):
    """Whatever `--overwrite` says, and without opening it: a FIFO would block the open."""
    if kind == "character device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    out = tmp_path / "out"
    fmt = make_special(out, kind)
    code = main(OUTPUTS[command](pair, recorded, out))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE, err
    assert err == (
        f"specdash: error: {'output' if '-o' in command else 'trace'} {out} is a {kind}; "
        "specdash only ever replaces a regular file"
    ), err
    assert stat.S_IFMT(os.lstat(out).st_mode) == fmt
    assert names_in(tmp_path) == ["out"]  # no temporary file either


def test_dev_null_stays_a_device(capsys, pair) -> None:
    code = main(headless(pair, "--trace", "/dev/null", "--overwrite"))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE
    assert err.endswith(
        "/dev/null is a character device; specdash only ever replaces a regular file"
    )
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_to_a_device_is_refused_too(capsys, pair, tmp_path) -> None:
    (tmp_path / "link").symlink_to("/dev/null")
    assert main(headless(pair, "--trace", str(tmp_path / "link"), "--overwrite")) == EXIT_USAGE
    assert "is a character device" in capsys.readouterr().err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("which", ["model shard", "model tokenizer", "shipped draft"])
def test_a_hard_link_to_a_checkpoint_file_is_an_input(capsys, pair, tmp_path, which) -> None:
    from specdash.prompts import default_prompts_path

    source = {
        "model shard": pair[0] / "model.safetensors",
        "model tokenizer": pair[0] / "tokenizer.json",
        "shipped draft": default_prompts_path().parent / "draft" / "model.safetensors",
    }[which]
    link = tmp_path / "hard"
    os.link(source, link)
    before = source.read_bytes()
    code = main(headless(pair, "--trace", str(link), "--overwrite"))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE, err
    assert "would overwrite" in err and "never writes over its inputs" in err
    assert source.read_bytes() == before and os.path.samefile(source, link)


def test_an_overlong_name_is_one_line(capsys, pair, tmp_path) -> None:
    code = main(headless(pair, "--trace", str(tmp_path / ("a" * 300 + ".jsonl"))))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_ENVIRONMENT
    assert err.startswith("specdash: error: cannot write trace ") and "File name too long" in err


def test_overwriting_a_name_near_the_limit_works(pair, tmp_path) -> None:
    """The temporary name beside it is shortened, not refused."""
    trace = tmp_path / ("a" * 243 + ".jsonl")
    trace.write_text("old\n")
    assert main(headless(pair, "--trace", str(trace), "--overwrite")) == 0
    assert names_in(tmp_path) == [trace.name] and '"session_start"' in trace.read_text()


class FullDisk(io.TextIOWrapper):
    """A file that takes the header and a few lines, then fails like a full disk."""

    def __init__(self, fd: int, *args: object, **kwargs: object) -> None:
        super().__init__(io.FileIO(fd, "w"), encoding="utf-8")

    def write(self, s: str) -> int:
        if self.tell() > 3000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(s)


def test_a_full_disk_keeps_the_old_trace_and_says_where_the_partial_one_is(
    capsys, monkeypatch, pair, recorded, tmp_path
) -> None:
    old = tmp_path / "old.jsonl"
    shutil.copy(recorded, old)
    monkeypatch.setattr(output_files, "open", FullDisk, raising=False)
    code = main(headless(pair, "--trace", str(old), "--overwrite"))
    err = capsys.readouterr().err.strip()
    assert code == EXIT_ENVIRONMENT
    (partial,) = (p for p in tmp_path.iterdir() if p != old)
    assert err == (
        "specdash: error: recording stopped: No space left on device; "
        f"{old} kept as it was; the partial recording is {partial}"
    )
    assert old.read_bytes() == recorded.read_bytes()
    assert '"session_start"' in partial.read_text()


def test_ctrl_c_keeps_the_old_trace_and_says_where_the_partial_one_is(
    pair, recorded, tmp_path
) -> None:
    old = tmp_path / "old.jsonl"
    shutil.copy(recorded, old)
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdash.cli", *headless(pair, "--trace", str(old), "--overwrite")]
        + ["--max-new-tokens", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while time.time() < deadline and not any(
        p != old and '"verify_step"' in p.read_text() for p in tmp_path.iterdir()
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    (partial,) = (p for p in tmp_path.iterdir() if p != old)
    assert err.splitlines() == [
        f"specdash: warning: recording cut short (the session stopped early); {old} kept as "
        f"it was; the partial recording is {partial}",
        "specdash: interrupted",
    ]
    assert old.read_bytes() == recorded.read_bytes()
    _, events, _ = read_trace(partial)
    assert any(e.kind == "verify_step" for e in events)


def test_a_disk_full_from_the_start_says_nothing_was_recorded(capsys, monkeypatch, pair, tmp_path):
    class FullFromTheStart(FullDisk):
        def write(self, s: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    trace = tmp_path / "t.jsonl"
    monkeypatch.setattr(output_files, "open", FullFromTheStart, raising=False)
    assert main(headless(pair, "--trace", str(trace))) == EXIT_ENVIRONMENT
    assert capsys.readouterr().err.strip() == (
        "specdash: error: recording stopped: No space left on device; "
        f"nothing was recorded: {trace} is empty"
    )
