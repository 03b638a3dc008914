"""The rule every file specdash writes follows (`specdash.output_files`): never over an input
(through a symlink or a hard link either), over an existing file only when asked, a whole file
appears at once or not at all, and a trace being recorded is locked against a second writer."""

from __future__ import annotations

import os

import pytest

from specdash.errors import EnvironmentProblem, UsageError
from specdash.output_files import Output


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
