"""The one rule for every file specdash writes (README, "Files specdash writes").

- Never over an input: an output that is the same file as an input (its prompt file, a file
  of a checkpoint it loads, the trace it reads; through a symlink or a hard link too) is
  refused before any work, whatever the overwrite flag says.
- Over an existing file only when asked (`--overwrite`; `run` also spells it
  `--overwrite-trace`); an existing directory is never replaced.
- A whole file (export, report, a copy of a trace) is written to a temporary name in the
  same directory, flushed to disk and then renamed onto its name, so a crash leaves either
  the old file or the new one, never half of one.
- A live trace is appended line by line as the session runs, so a crash leaves the session
  up to its last line. A new trace is created under its own name (there was no file to
  lose). A trace that replaces an existing file is recorded under a temporary name beside
  it while the old one stays whole, and is renamed onto it when the recording closes (at
  the end, on Ctrl-C, on an error); only a `kill -9` or a power loss leaves the old trace
  and, beside it, the partial recording. Either way the trace's name holds an exclusive
  lock (`flock`) while it records: a second writer is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from specdash.errors import EnvironmentProblem, UsageError

Input = tuple[Path, str]
"""A path specdash reads and what it is to the user ("the prompt file"); a directory stands
for every file under it (a checkpoint)."""


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_inputs(path: Path, what: str, inputs: Iterable[Input]) -> None:
    """`UsageError` when writing `path` would change one of `inputs`: the same file, or a
    file under an input directory. Only an existing file can be one."""
    if not path.exists():
        return
    resolved = path.resolve()
    for source, role in inputs:
        inside = source.is_dir() and resolved.is_relative_to(source.resolve())
        if inside or _same_file(path, source):
            raise UsageError(
                f"{what} {path} would overwrite {role} {source}; "
                "specdash never writes over its inputs"
            )


class Output:
    """A file specdash was asked to write, checked against the rule when made (before any
    work): `UsageError` for an input, an existing file without `overwrite` or a directory.

    `what` names it in messages ("trace", "output"); `flag`, the flag that allows replacing
    an existing file, if the user has one to pass."""

    def __init__(
        self,
        path: Path | str,
        *,
        what: str,
        inputs: Iterable[Input] = (),
        overwrite: bool = False,
        flag: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.what = what
        self.overwrite = overwrite
        self.flag = flag
        refuse_inputs(self.path, what, inputs)
        if self.path.is_dir():
            raise UsageError(f"{what} {self.path} is a directory")
        if self.path.exists() and not overwrite:
            raise self._exists()

    def _exists(self) -> UsageError:
        hint = f"; pass {self.flag} to replace it" if self.flag else ""
        return UsageError(f"{self.what} {self.path} already exists{hint}")

    def _cannot(self, e: OSError) -> EnvironmentProblem:
        return EnvironmentProblem(f"cannot write {self.what} {self.path}: {e.strerror or e}")

    def _temporary(self) -> tuple[int, Path]:
        """A new file beside the output (same directory: the rename cannot cross devices),
        hidden, named after it and this process."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except OSError as e:
            raise self._cannot(e) from None

    def _publish(self, tmp: Path) -> None:
        """`tmp` becomes the output. Without `overwrite` a hard link gives it the name only
        if nothing took the name meanwhile; a file system without hard links falls back to
        the rename, after the check made when this `Output` was."""
        if self.overwrite:
            os.replace(tmp, self.path)
            return
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            os.unlink(tmp)
            raise self._exists() from None
        except OSError:
            os.replace(tmp, self.path)
            return
        os.unlink(tmp)

    @contextlib.contextmanager
    def replace(self, mode: str = "w") -> Iterator[IO]:
        """A whole file: what is written to the stream appears under the output's name when
        the block ends, flushed to disk; an error inside the block leaves nothing behind."""
        fd, tmp = self._temporary()
        try:
            encoding = None if "b" in mode else "utf-8"
            with open(fd, mode, encoding=encoding, newline="" if encoding else None) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            self._publish(tmp)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, OSError):
                raise self._cannot(e) from None
            raise

    def live(self) -> LiveFile:
        """A file appended to as it records (a trace), locked while it is."""
        return LiveFile(self)


class LiveFile:
    """An output written line by line (`stream`), under the lock on its name; `close()`
    finishes it. See the module docstring for where the lines go."""

    def __init__(self, output: Output) -> None:
        self.path = output.path
        self._tmp: Path | None = None
        self._lock_fd: int | None = None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            if not output.overwrite:
                raise output._exists() from None
            fd = None
        except OSError as e:
            raise output._cannot(e) from None
        try:
            held = fd if fd is not None else os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise output._cannot(e) from None
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(held)
            raise UsageError(
                f"{output.what} {self.path} is being written by another specdash; "
                "wait for it to finish or record to another file"
            ) from None
        if fd is None:  # replacing an existing file: record beside it, keep its lock
            self._lock_fd = held
            fd, self._tmp = output._temporary()
        self.stream: IO[str] = open(fd, "w", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        """Close the stream and, when it replaces an old file, rename it onto its name; then
        release the lock. The rename happens even when the last flush fails (a full disk):
        the recording holds the session up to then, which is what the caller says. An
        OSError is raised after both were tried."""
        error: OSError | None = None
        try:
            self.stream.close()
        except OSError as e:
            error = e
        try:
            if self._tmp is not None:
                os.replace(self._tmp, self.path)
                self._tmp = None
        except OSError as e:
            error = error or e
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
        if error is not None:
            raise error
