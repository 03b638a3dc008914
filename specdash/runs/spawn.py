"""What every process specdash spawns needs, whichever engine: multiprocessing's resource tracker
started with the real stderr first, and the child's output away from the terminal.

Used by the dashboard's engine process (`engine_process`) and SGLang's host and scheduler
processes (`sglang.host`, `sglang.process`).
"""

from __future__ import annotations

import contextlib
import os
import sys


def start_resource_tracker() -> None:
    """multiprocessing's resource tracker, started with the real stderr before a process is
    spawned. It passes `sys.stderr.fileno()` to its child, and under Textual sys.stderr is a
    print capture whose fileno() is -1: every spawn from the dashboard failed with 'bad
    value(s) in fds_to_keep'."""
    from multiprocessing import resource_tracker

    with contextlib.redirect_stderr(sys.__stderr__):
        resource_tracker.ensure_running()


def redirect_output(path: str) -> None:
    """fds 1 and 2 of this process (and of every process it starts) to the end of `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
