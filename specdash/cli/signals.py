"""SIGTERM and SIGHUP (a `kill`, a closed terminal) end a command the way Ctrl-C does: the
trace closed, the terminal restored, one line on stderr, and the shell's code for the signal
(128 + its number: 143, 129), instead of dying mid-write with no word.

A signal the command was started with ignored (`nohup` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A termination signal, raised where Ctrl-C's KeyboardInterrupt would be, so every
    cleanup that Ctrl-C runs runs for it too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def line(self) -> str:
        return f"specdash: terminated ({signal.Signals(self.signum).name})"


def raise_terminated(signum: int) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def on_termination(handle: Callable[[int], None] = raise_terminated) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP call `handle(signum)` (by default: raise
    `Terminated` in the main thread); the earlier handlers come back afterwards."""
    previous = {}
    for signum in SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, lambda n, _frame: handle(n))
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
