"""What an SGLang engine is doing while it starts, read from its own log as it is written.

Why the log: SGLang starts its scheduler in a spawned process and reports each step of the
start (torch distributed, weights, KV pool, each CUDA graph capture with a tqdm bar over its
batch sizes) only as log lines, while the parent's `Engine()` call blocks until the scheduler
is ready. `StartWatch` tails the file the session routes SGLang's processes to and turns the
lines it knows into `StartPhase` events. A line it does not know is ignored, so a release that
words them otherwise shows fewer phases, never a wrong one.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from specdash.events import Sink, StartPhase

POLL_S = 0.2

_NAMED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Init torch distributed begin"), "init torch distributed"),
    (re.compile(r"Load weight begin"), "load weights"),
    (re.compile(r"Load weight end"), "allocate KV cache"),
)
_CAPTURE = re.compile(r"Capture (?P<what>[\w -]+?) (?:CUDA|cuda) graph begin")
_BAR = re.compile(
    r"(?P<what>Capturing batches|Capturing num tokens) \([^)]*\):\s*\d+%\|[^|]*\|\s*"
    r"(?P<done>\d+)/(?P<total>\d+)"
)


def phase_of(line: str, current: str | None) -> tuple[str, int | None, int | None] | None:
    """(phase, done, total) for a log line that starts a phase or moves one on; None if it
    is not such a line. A tqdm bar counts the batch sizes of the capture under way."""
    for pattern, phase in _NAMED:
        if pattern.search(line):
            return phase, None, None
    if m := _CAPTURE.search(line):
        return f"capture {m['what']} CUDA graphs", None, None
    if m := _BAR.search(line):
        unit = "batch sizes" if m["what"] == "Capturing batches" else "token counts"
        phase = current if current and current.startswith("capture") else f"capture ({unit})"
        return phase, int(m["done"]), int(m["total"])
    return None


class StartWatch:
    """While one engine starts: tail `log` from its current end, emit a `StartPhase` per
    phase (and per new count of a capture's bar), then "ready" when the start succeeded (the
    `with` block exits cleanly, or `finish(ok=True)`).

    `engine` names it ("spec", "shadow"); `clock` is time.monotonic (tests replace it)."""

    def __init__(
        self,
        log: Path,
        engine: str,
        sink: Sink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.engine, self.sink, self.clock = log, engine, sink, clock
        self._last: tuple[str, int | None, int | None] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._tail, name="specdash-sglang-start", daemon=True
        )
        self._t0 = 0.0
        self._offset = 0
        self._partial = ""
        self._lock = threading.Lock()

    @property
    def phase(self) -> str | None:
        """The phase emitted last."""
        return self._last[0] if self._last else None

    def start(self) -> None:
        self._t0 = self.clock()
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        self._emit("imports, spawn processes", None, None)
        self._thread.start()

    def mark(self, phase: str) -> None:
        """A phase of specdash's own after SGLang's (the log read up to now first, so no older
        phase is emitted after it)."""
        self.read()
        with self._lock:
            self._emit(phase, None, None)

    def finish(self, ok: bool) -> None:
        """Stop tailing after a last read; "ready" when the start succeeded. Once only."""
        if self._done.is_set():
            return
        self._done.set()
        self._thread.join()
        self.read()
        if ok:
            self._emit("ready", None, None)

    def __enter__(self) -> StartWatch:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(ok=kind is None)

    def _emit(self, phase: str, done: int | None, total: int | None) -> None:
        self._last = (phase, done, total)
        self.sink(
            StartPhase(
                engine=self.engine,
                phase=phase,
                done=done,
                total=total,
                since_start_s=round(self.clock() - self._t0, 3),
            )
        )

    def _tail(self) -> None:
        while not self._done.wait(POLL_S):
            self.read()

    def read(self) -> None:
        """Every complete line written since the last read (a tqdm update ends in '\\r')."""
        with self._lock:
            try:
                with self.log.open("rb") as f:
                    f.seek(self._offset)
                    chunk = f.read()
            except OSError:
                return
            self._offset += len(chunk)
            text = self._partial + chunk.decode("utf-8", errors="replace")
            *lines, self._partial = re.split(r"[\r\n]", text)
            for line in lines:
                found = phase_of(line, self.phase)
                if found is not None and found != self._last:
                    self._emit(*found)
