"""Session traces: the crash-safe JSONL file that records one session's event stream.

Line 1 is the `SessionStart` header (config, versions, device, GEMM backend, git revision);
every later line is one event, its time never before the line above (an event stamped earlier,
by a thread racing the engine's or before the header, is written at that line's time), written
whole and flushed at once, so a `kill -9` loses at most the line being written and `read_trace`
gets back everything before it (where the lines go, a new file or beside an old trace it
replaces: `specdash.output_files`). A recording is whole once it has written the event that
ends the session (the summary, or a fatal engine error the engine reported; not its process's
death, which loses what it had not sent); only a whole one replaces an old trace. Recording must
never take a session down: an I/O error mid-session stops the writer and is kept in
`stopped_reason` for the dashboard to show.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from specdash import json_text
from specdash.errors import UsageError
from specdash.events import (
    SCHEMA,
    Divergence,
    EngineError,
    Event,
    PromptStart,
    SessionStart,
    Summary,
    Token,
    parse_event,
)
from specdash.output_files import Input, LiveFile, Output

OVERWRITE_FLAG = "--overwrite-trace"
"""What replaces an existing trace (`run` also takes `--overwrite`, every command's spelling)."""


def git_revision(directory: Path | None = None) -> str | None:
    """The checkout's commit (with `-dirty` for uncommitted edits), or None outside git."""
    cwd = directory or Path(__file__).resolve().parent

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        )
        return run.stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def encode_event(event: Event) -> str:
    """One trace line. pydantic's JSON writes None and NaN/inf alike as null, and a null
    logprob would not read back, so a line with a null is re-encoded with NaN/Infinity
    (which `parse_event` reads back bit for bit). Most lines have none: the fast path."""
    line = event.model_dump_json()
    if "null" in line:
        line = json.dumps(event.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    return line + "\n"


class TraceWriter:
    """Event sink that appends each event to a JSONL trace.

    `target` is a path, opened now by the rule every output follows (`specdash.output_files`:
    one of `inputs` or an existing file without `overwrite` is a `UsageError`, so is a trace
    another writer holds; an unwritable path an `EnvironmentProblem`), or an already open
    text stream. The first event
    written must be the `SessionStart` header, either passed as `header` (recording started
    mid-session) or as the first event sunk;
    anything else first (e.g. an engine error before the session started) stops recording.
    Thread-safe: the engine thread writes, the dashboard may `close()`.
    """

    def __init__(
        self,
        target: Path | str | IO[str],
        header: SessionStart | None = None,
        overwrite: bool = False,
        inputs: Iterable[Input] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._has_header = False
        self.stopped_reason: str | None = None
        self.io_error: OSError | None = None
        """The I/O error that stopped recording (disk full, device gone): the trace is short."""
        self.lines_written = 0
        self._whole = False
        """The event that ends the session is written: the recording holds all of it."""
        self._last_t_ns = 0
        self._live: LiveFile | None = None
        if isinstance(target, str | Path):
            self.path: Path | None = Path(target)
            output = Output(
                self.path, what="trace", inputs=inputs, overwrite=overwrite, flag=OVERWRITE_FLAG
            )
            self._live = output.live()
            self._file: IO[str] | None = self._live.stream
        else:
            self.path = None
            self._file = target
        if header is not None:
            self(header)

    def __call__(self, event: Event) -> None:
        with self._lock:
            if self._file is None:
                return
            if not self._has_header:
                if not isinstance(event, SessionStart):
                    self._stop(f"the session sent {event.kind} before its session_start header")
                    return
                if event.git_revision is None:
                    event = event.model_copy(update={"git_revision": git_revision()})
                self._has_header = True
            if event.t_ns < self._last_t_ns:
                event = event.model_copy(update={"t_ns": self._last_t_ns})
            self._last_t_ns = event.t_ns
            try:
                self._file.write(encode_event(event))
                self._file.flush()
            except OSError as e:
                self.io_error = e
                self._stop(f"{e.strerror or e}")
                return
            self.lines_written += 1
            if isinstance(event, Summary) or (
                isinstance(event, EngineError) and event.fatal and not event.engine_lost
            ):
                self._whole = True

    @property
    def whole(self) -> bool:
        """The recording holds the whole session: the event that ends it, written by the
        engine (not a death reported for it), and no write failed."""
        return self._whole and self.stopped_reason is None

    @property
    def partial(self) -> Path | None:
        """Where the recording was left when it did not close whole and the old trace it
        would have replaced was kept; None otherwise."""
        return self._live.partial if self._live is not None else None

    def outcome(self) -> str:
        """What the trace's name holds now, in words for a message."""
        if self.partial is not None:
            return f"{self.path} kept as it was; the partial recording is {self.partial}"
        if self.lines_written == 0:  # the disk was full from the start
            return f"nothing was recorded: {self.path} is empty"
        return f"{self.path} holds the session up to then"

    @property
    def recording(self) -> bool:
        return self._file is not None

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._close_file()
                except OSError as e:
                    self.io_error = self.io_error or e
                    self.stopped_reason = self.stopped_reason or f"{e.strerror or e}"
                self._file = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, reason: str) -> None:
        self.stopped_reason = reason
        with contextlib.suppress(OSError):  # the disk is failing; `reason` says why already
            self._close_file()
        self._file = None

    def _close_file(self) -> None:
        """The stream, or the live file that finishes it (renamed onto an old trace it
        replaces, its lock released)."""
        if self._live is not None:
            self._live.close(whole=self.whole)
        else:
            self._file.close()  # type: ignore[union-attr]


OLDEST_SCHEMA_MAJOR = 1
"""specdash/v1 is the first schema any specdash wrote: an older number is no trace of ours."""


def _schema_major(schema: str) -> int | None:
    name, _, version = schema.partition("/v")
    return int(version) if name == SCHEMA.partition("/v")[0] and version.isdigit() else None


def _read_header(first: bytes, path: Path) -> SessionStart:
    try:
        obj = json_text.loads(first)
    except json_text.JsonTextError:
        raise UsageError(f"{path} is not a specdash trace (line 1 is not JSON)") from None
    if not isinstance(obj, dict) or obj.get("kind") != "session_start":
        raise UsageError(f"{path} is not a specdash trace (no session_start header)")
    schema = str(obj.get("schema_version", ""))
    major, ours = _schema_major(schema), _schema_major(SCHEMA)
    if major is None:
        raise UsageError(f"{path} is not a specdash trace (schema {schema!r})")
    if major > ours:  # type: ignore[operator]
        raise UsageError(
            f"{path} uses trace schema {schema}, newer than this specdash reads ({SCHEMA}); "
            "upgrade specdash"
        )
    if major < OLDEST_SCHEMA_MAJOR:
        raise UsageError(
            f"{path} uses trace schema {schema}, which no specdash wrote "
            f"(this one reads specdash/v{OLDEST_SCHEMA_MAJOR} to {SCHEMA})"
        )
    try:
        return SessionStart.model_validate(obj)
    except ValidationError as e:
        raise UsageError(f"{path}: bad session header: {_first_error(e)}") from None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def read_trace(path: Path | str) -> tuple[SessionStart, list[Event], list[str]]:
    """Header, events and warnings of a trace; `UsageError` when it cannot be one.

    A last line without its newline is what a killed writer leaves: it is skipped with a
    warning if it does not parse. A bad line anywhere else means the file is damaged, and so
    does a second `session_start` (two recordings joined). The file is read a line at a time
    and only the events are kept (`_compact`): a trace reader's memory is its events'.
    """
    with open_trace(path) as (header, events, warnings):
        return header, [_compact(e) for e in events], warnings


@contextlib.contextmanager
def open_trace(
    path: Path | str,
) -> Iterator[tuple[SessionStart, Iterator[Event], list[str]]]:
    """The trace's header, checked now, and its events as they are read, for a reader that
    needs each event once (`export`): its memory is then one event's, not the trace's. The
    checks are `read_trace`'s, made as the events go by, so a damaged line ends the iteration
    with its `UsageError`; the warnings list fills as it goes, whole once the events are."""
    path = Path(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise UsageError(f"trace not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a trace") from None
    except OSError as e:
        raise UsageError(f"cannot read trace {path}: {e.strerror or e}") from None
    with f:
        try:
            header = _read_first(f, path)
        except OSError as e:
            raise UsageError(f"cannot read trace {path}: {e.strerror or e}") from None
        warnings: list[str] = []
        yield header, _events(f, path, header, warnings), warnings


def _read_first(f: IO[bytes], path: Path) -> SessionStart:
    first = f.readline()
    if not first.strip():
        if not any(line.strip() for line in f):
            raise UsageError(f"{path} is empty, not a trace")
        raise UsageError(f"{path} is not a specdash trace (line 1 is not JSON)")
    if not first.endswith(b"\n"):  # a single line without its newline: whole, or torn
        try:
            json_text.loads(first)
        except json_text.JsonTextError:
            if b'"session_start"' in first:
                raise UsageError(f"{path} is truncated: its header line is incomplete") from None
    return _read_header(first, path)


def _events(f: IO[bytes], path: Path, header: SessionStart, warnings: list[str]) -> Iterator[Event]:
    shift_v1_positions = _schema_major(header.schema_version) == 1 and header.engine != "sglang"
    prompt_tokens: dict[int, int] = {}
    lines = enumerate(f, start=2)
    while True:
        try:
            number, line = next(lines)
        except StopIteration:
            return
        except OSError as e:  # the disk, not the trace: said as the reader's own error
            raise UsageError(f"cannot read trace {path}: {e.strerror or e}") from None
        try:
            event = parse_event(line)
        except ValidationError as e:
            if line.endswith(b"\n"):
                raise UsageError(
                    f"{path}:{number}: not a specdash event: {_first_error(e)}"
                ) from None
            warnings.append(
                f"{path}:{number}: skipped a torn last line ({len(line)} bytes); "
                "the recording was cut off mid-write"
            )
            return
        if isinstance(event, SessionStart):
            raise UsageError(
                f"{path}:{number}: a second session_start header (two recordings joined "
                "into one file?); a trace holds one session"
            )
        if shift_v1_positions:
            event = _v1_position(event, prompt_tokens)
        yield event


_FIELD_SETS: dict[frozenset[str], set[str]] = {}


def _compact(event: Event) -> Event:
    """`event` holding one shared copy of its set of given fields. pydantic keeps that set
    per instance, well over half of a small event's memory, and a trace has hundreds of
    thousands of events with a handful of distinct sets; a frozen event never changes its
    set in place (`model_copy` copies it first), so sharing it changes nothing it does."""
    given = event.__pydantic_fields_set__
    shared = _FIELD_SETS.setdefault(frozenset(given), given)
    object.__setattr__(event, "__pydantic_fields_set__", shared)
    return event


def _v1_position(event: Event, prompt_tokens: dict[int, int]) -> Event:
    """A v1 native trace counted `position` from the prompt's start: make it the
    generated-token index every v2 event uses (SGLang v1 traces already did).
    `prompt_tokens` holds each prompt's length from its `PromptStart`, seen before its
    tokens."""
    if isinstance(event, PromptStart):
        prompt_tokens[event.prompt_index] = event.prompt_tokens
    elif isinstance(event, Token | Divergence) and event.prompt_index in prompt_tokens:
        shift = prompt_tokens[event.prompt_index]
        update: dict[str, object] = {"position": event.position - shift}
        cause = event.root_cause if isinstance(event, Divergence) else None
        if cause is not None and cause.origin_position is not None:
            update["root_cause"] = cause.model_copy(
                update={"origin_position": cause.origin_position - shift}
            )
        event = event.model_copy(update=update)
    return event
