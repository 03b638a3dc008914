"""A real terminal run: `specdash` in tmux on the shipped model, keys sent as a user would,
the screen read back with capture-pane, and `q` exits 0."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdash.trace.jsonl import read_trace

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (CI installs it)")

SPECDASH = Path(sys.executable).parent / "specdash"


# A private tmux server (own socket, no user config) with an explicit environment: under pytest
# the process-level environ carries COLUMNS=80 LINES=24 (set below Python's os.environ), tmux
# copies it into the session, and Textual then sizes itself 80x24 whatever the pane is.
SOCKET = f"specdash-test-{uuid.uuid4().hex[:8]}"
COLUMNS, LINES = 160, 48


def tmux(*args: str) -> str:
    command = ["tmux", "-L", SOCKET, "-f", "/dev/null", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout


def start_session(
    session: str, cwd: Path, command: str, size: tuple[int, int] = (COLUMNS, LINES)
) -> None:
    tmux("new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]),
         "-c", str(cwd), command)  # fmt: skip


def wait_for(session: str, predicate, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if predicate(screen):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"timed out; last screen:\n{screen}")


@contextlib.contextmanager
def specdash_in_tmux(
    cwd: Path, flags: str, size: tuple[int, int] = (COLUMNS, LINES)
) -> Iterator[tuple[str, Path]]:
    """`specdash FLAGS` in a tmux pane, running once its first steps are on screen: the
    session's name and the file its exit status goes to. The pane stays open after the exit,
    so its last lines can be read."""
    session = f"specdash-test-{uuid.uuid4().hex[:8]}"
    status = cwd / "exit_status"
    start_session(session, cwd, f"{SPECDASH} {flags}; echo $? > {status}; sleep 60", size)
    try:
        wait_for(session, lambda s: re.search(r"verify steps [1-9]", s) is not None)
        yield session, status
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def exit_status(path: Path) -> str:
    """What the shell wrote to `path` once the command exited (20 s at most)."""
    deadline = time.monotonic() + 20
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return path.read_text().strip()


def test_specdash_in_a_real_terminal(tmp_path):
    with specdash_in_tmux(tmp_path, "--max-new-tokens 24") as (session, status):
        screen = tmux("capture-pane", "-p", "-t", session)
        assert "t/s         wall    spec  shadow  speedup" in screen
        assert "│1 s " in screen and "│session " in screen
        assert "acceptance rate" in screen and "mean accepted length" in screen
        assert "EXACT so far" in screen or "DIVERGED at token" in screen
        assert "divergences (session):" in screen
        assert "GPU:" in screen or "DRAM BW" in screen or "mem busy" in screen
        assert " k 4 " in screen
        tmux("send-keys", "-t", session, "+")
        wait_for(session, lambda s: " k 5 " in s, timeout=30)  # applied by the engine
        tmux("send-keys", "-t", session, "?")
        wait_for(session, lambda s: "specdash help" in s, timeout=10)
        tmux("send-keys", "-t", session, "Escape")
        wait_for(session, lambda s: "specdash help" not in s, timeout=10)
        tmux("send-keys", "-t", session, "q")
        assert exit_status(status) == "0"
        # the session's summary, as headless prints it, is left on the terminal
        screen = wait_for(session, lambda s: "exact prompts" in s, timeout=10)
        assert "new tokens" in screen and "divergences" in screen


def test_ctrl_c_in_a_real_terminal_exits_130_and_keeps_the_trace(tmp_path):
    flags = "--max-new-tokens 24 --trace t.jsonl"
    with specdash_in_tmux(tmp_path, flags) as (session, status):
        tmux("send-keys", "-t", session, "C-c")
        wait_for(session, lambda s: "specdash: interrupted" in s, timeout=20)
        assert exit_status(status) == "130"
    _, events, _ = read_trace(tmp_path / "t.jsonl")
    assert any(e.kind == "verify_step" for e in events)


def test_sigterm_in_a_real_terminal_restores_it_and_exits_143(tmp_path):
    """As Ctrl-C: the alternate screen left (the shell's screen back), one line, the trace
    closed; 143, the shell's code for SIGTERM."""
    flags = "--max-new-tokens 24 --trace t.jsonl"
    with specdash_in_tmux(tmp_path, flags) as (session, status):
        shell = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        (specdash,) = (
            int(pid) for pid in children if "specdash" in Path(f"/proc/{pid}/cmdline").read_text()
        )
        os.kill(specdash, signal.SIGTERM)
        screen = wait_for(session, lambda s: "specdash: terminated (SIGTERM)" in s, timeout=20)
        assert exit_status(status) == "143"
        assert "t/s         wall    spec  shadow  speedup" not in screen  # the dashboard is gone
    _, events, _ = read_trace(tmp_path / "t.jsonl")
    assert any(e.kind == "verify_step" for e in events)


def specdash_pids(session: str) -> list[int]:
    """The pane's specdash process and every process under it (the engine's)."""
    shell = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
    found, todo = [], [shell]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            todo += kids
            found += [c for c in kids if pid != shell or "specdash" in _cmdline(c)]
    return found


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text()
    return ""


@pytest.mark.parametrize("when", ["decoding", "idle"])
def test_a_vanished_terminal_ends_the_session_and_its_engine(tmp_path, when):
    """The tmux server killed with SIGKILL (its pty gone, no signal sent on its behalf), while
    decoding and while idle after the set: the dashboard, and the engine in its own process,
    exit within 20 s instead of spinning on a dead terminal, and the trace is closed."""
    flags = f"--max-new-tokens {2000 if when == 'decoding' else 4} --trace t.jsonl"
    with specdash_in_tmux(tmp_path, flags) as (session, _):
        if when == "idle":
            wait_for(session, lambda s: "IDLE" in s and "24 done" in s, timeout=300)
        pids = specdash_pids(session)
        assert len(pids) >= 2, pids  # the dashboard and its engine
        server = int(tmux("display-message", "-p", "#{pid}").strip())
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        alive = {p: _cmdline(p) for p in pids if Path(f"/proc/{p}").exists()}
        for p in alive:
            os.kill(p, signal.SIGKILL)
        assert not alive, alive
    _, events, problems = read_trace(tmp_path / "t.jsonl")
    assert any(e.kind == "verify_step" for e in events) and not problems, problems


def test_a_prompt_typed_after_the_shipped_set_is_decoded(tmp_path):
    """The session stays open after its prompts: `/`, a prompt and Enter decode it, and `q`
    then ends the session with the typed prompt in its trace and summary."""
    with specdash_in_tmux(tmp_path, "--max-new-tokens 4 --trace s.jsonl") as (session, status):
        wait_for(session, lambda s: "IDLE" in s and "24 done" in s, timeout=300)
        tmux("send-keys", "-t", session, "/")
        tmux("send-keys", "-t", session, "-l", "def typed_by_hand(x):")
        tmux("send-keys", "-t", session, "Enter")
        screen = wait_for(session, lambda s: "25 done" in s and "IDLE" in s, timeout=60)
        assert "prompt 24: def typed_by_hand(x):" in screen
        tmux("send-keys", "-t", session, "q")
        assert exit_status(status) == "0"
    _, events, _ = read_trace(tmp_path / "s.jsonl")
    typed = [e for e in events if e.kind == "prompt_start" and e.prompt_index == 24]
    assert typed and typed[0].text == "def typed_by_hand(x):"
    assert [e.kind for e in events].count("idle") == 2 and events[-1].kind == "summary"
    assert events[-1].prompts == 25


def acceptance_rows(screen: str) -> set[int]:
    """The histogram rows (drafts kept) on screen: the acceptance panel's lines (the right
    half of the screen, inside its border) that start with a row number."""
    rows = set()
    lines = screen.splitlines()
    middle = max(len(line) for line in lines) // 2
    for line in lines:
        right = line[middle + 1 :]
        if line[middle : middle + 1] == "│" and right[:2].strip().isdigit() and right[2:3] == " ":
            rows.add(int(right[:2]))
    return rows


def rows_reachable(session: str, k: int) -> set[int]:
    """Every histogram row seen while scrolling the table from its top to its end as a user
    would: shift+tab from the divergence table to the rows, then PgDn until the border says
    the last row is in view."""
    screen = wait_for(  # once the notes on the `+` presses are gone: they cover the rows
        session,
        lambda s: (
            "(applies at the next step)" not in s
            and (f"0–{k} " in s or acceptance_rows(s) == set(range(k + 1)))
        ),
        timeout=15,
    )
    seen = acceptance_rows(screen)
    if f"of 0–{k}" not in screen:
        return seen  # every row fits
    tmux("send-keys", "-t", session, "BTab")
    for _ in range(k):
        tmux("send-keys", "-t", session, "PageDown")
        time.sleep(0.5)
        screen = tmux("capture-pane", "-p", "-t", session)
        seen |= acceptance_rows(screen)
        if f"–{k} of 0–{k}" in screen:
            break
    tmux("send-keys", "-t", session, "Home", "Tab")  # back to the top, focus back on the table
    return seen


def last_x_tick(screen: str) -> float:
    """The largest x tick number of the throughput chart: the last line of numbers alone in
    the left (throughput) panel, above the GPU panel."""
    ticks: list[float] = []
    for line in screen.splitlines():
        if "GPU" in line:
            break
        left = line.split("││")[0].strip("│ ")
        words = left.split()
        if len(words) > 1 and all(w.replace(".", "", 1).isdigit() for w in words):
            ticks = [float(w) for w in words]
    return max(ticks)


IDLE_S = 20


@pytest.mark.parametrize(
    ("size", "idle_s"), [((100, 30), IDLE_S), ((160, 48), 0)], ids=["100x30", "160x48"]
)
def test_acceptance_rows_for_k_9_and_16_and_the_axis_after_idle(tmp_path, size, idle_s):
    """At k = 9 and then (`+` seven times) k = 16 every histogram row 0..k is on screen or a
    scroll away, and {IDLE_S} s idle before a typed prompt adds nothing to the throughput
    chart's x axis (the session's clock stops while idle). The clock does not depend on the
    terminal's size, so only the first size waits idle."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "import os"}\n')
    flags = f"-k 9 --max-new-tokens 24 --prompts {prompts}"
    with specdash_in_tmux(tmp_path, flags, size) as (session, status):
        wait_for(session, lambda s: "IDLE" in s and "2 done" in s, timeout=120)
        time.sleep(2.5)  # the plots redraw every 2 s
        before = tmux("capture-pane", "-p", "-t", session)
        axis_before = last_x_tick(before)
        assert rows_reachable(session, 9) == set(range(10))
        time.sleep(idle_s)
        for _ in range(7):
            tmux("send-keys", "-t", session, "+")
        wait_for(session, lambda s: " k 9→16 " in s, timeout=10)  # asked, for the next step
        tmux("send-keys", "-t", session, "/")
        tmux("send-keys", "-t", session, "-l", "def typed_by_hand(x):")
        tmux("send-keys", "-t", session, "Enter")
        wait_for(session, lambda s: "3 done" in s and "IDLE" in s, timeout=60)
        time.sleep(2.5)
        assert " k 16 " in tmux("capture-pane", "-p", "-t", session)  # applied
        after = tmux("capture-pane", "-p", "-t", session)
        assert rows_reachable(session, 16) == set(range(17)), after
        axis_after = last_x_tick(after)
        assert axis_before <= axis_after < axis_before + IDLE_S / 4, (before, after)
        tmux("send-keys", "-t", session, "q")
        assert exit_status(status) == "0"


@pytest.mark.parametrize("size", [(100, 30), (120, 40), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_status_lines_keep_what_matters_in_a_real_terminal(tmp_path, size):
    """The status bar's two lines at every size from 100 columns: idle after the set, a
    change asked for the next step and a trace just exported, nothing is cut at the edge:
    the verdict, the counts, the exported trace's name, every setting and the device."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    flags = f"--max-new-tokens 8 --prompts {prompts}"
    with specdash_in_tmux(tmp_path, flags, size) as (session, status):
        wait_for(session, lambda s: "IDLE" in s and "1 done" in s, timeout=120)
        tmux("send-keys", "-t", session, "+", "e")
        screen = wait_for(
            session, lambda s: "k 4→5" in s and "recording specdash-" in s, timeout=10
        )
        first, second = screen.splitlines()[:2]
        (trace,) = tmp_path.glob("specdash-*.jsonl")
        assert "EXACT so far" in first or "DIVERGED at token" in first, screen
        assert "1 done, 1 exact" in first or "1 done, 0 exact" in first, first
        assert f"recording {trace.name}" in first, first
        for setting in ("native", "embedded", "model", "k 4→5", "verify exact", "GEMM C loop",
                        "cpu"):  # fmt: skip
            assert setting in second, second
        assert "…" not in first + second and "threads" in second, screen
        if size[0] == 160:
            assert "engine native  model embedded  drafter model" in second
            assert "device cpu (" in second and "(session)" in first
        tmux("send-keys", "-t", session, "q")
        assert exit_status(status) == "0"
