"""The one rule for every file specdash writes (README, "Files specdash writes").

- Never over an input: an output that is the same file as an input (its prompt file, a file
  of a checkpoint it loads, the trace it reads; through a symlink or a hard link too) is
  refused before any work, whatever the overwrite flag says.
- Over an existing file only when asked (`--overwrite`; `run` also spells it
  `--overwrite-trace`), and only ever over a regular file: a directory, a device (/dev/null
  too: we may run as root), a FIFO or a socket is refused whatever the flag says, checked
  without opening it (opening a FIFO blocks).
- A whole file (export, report, a copy of a trace) is written to a temporary name in the
  same directory, flushed to disk and then renamed onto its name, so a crash leaves either
  the old file or the new one, never half of one.
- A live trace is appended line by line as the session runs, so a crash leaves the session
  up to its last line. A new trace is created under its own name (there was no file to
  lose). A trace that replaces an existing file is recorded under a temporary name beside
  it while the old one stays whole, and is renamed onto it only when the recording closes
  whole; a recording cut short (Ctrl-C, a full disk, a crash) leaves the old trace as it was
  and, beside it, the partial recording under the temporary name. Either way the trace's
  name holds an exclusive lock (`flock`) while it records: a second writer is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from specdash.errors import EnvironmentProblem, UsageError

Input = tuple[Path, str]
"""A path specdash reads and what it is to the user ("the prompt file"); a directory stands
for every file under it (a checkpoint)."""


_TEMPORARY_NAME_BYTES = 200
"""How much of an output's name its temporary name keeps: the rest of it (pid, random hex)
must fit within a file system's 255-byte name limit."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat(path: Path, what: str) -> os.stat_result | None:
    """`path`'s status (through a symlink), None when nothing is there; a name the system
    cannot look up at all (too long, a symlink loop) is an unwritable path."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {what} {path}: {e.strerror or e}") from None


def refuse_non_regular(path: Path, what: str, st: os.stat_result | None) -> None:
    """`UsageError` when `st` (of `path`) is anything but a regular file: replacing it would
    turn a device, a FIFO, a socket or a directory into a file holding the output."""
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{what} {path} is {_kind(st.st_mode)}; specdash only ever replaces a regular file"
        )


def _files_under(directory: Path) -> Iterator[os.stat_result]:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                yield os.stat(os.path.join(root, name))


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def refuse_inputs(path: Path, what: str, inputs: Iterable[Input]) -> None:
    """`UsageError` when writing `path` would change one of `inputs`: the same file (by path,
    symlink or hard link), or a file under an input directory (by path, or a hard link to
    one of its files). Only an existing file can be one."""
    st = _stat(path, what)
    if st is None:
        return
    resolved = path.resolve()
    for source, role in inputs:
        try:
            source_st = os.stat(source)
        except OSError:  # an input that cannot be read fails where it is read
            continue
        if stat.S_ISDIR(source_st.st_mode):
            same = resolved.is_relative_to(source.resolve()) or any(
                _same_inode(st, f) for f in _files_under(source)
            )
        else:
            same = _same_inode(st, source_st)
        if same:
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
        st = _stat(self.path, what)
        refuse_non_regular(self.path, what, st)
        if st is not None and not overwrite:
            raise self._exists()

    def _exists(self) -> UsageError:
        hint = f"; pass {self.flag} to replace it" if self.flag else ""
        return UsageError(f"{self.what} {self.path} already exists{hint}")

    def _cannot(self, e: OSError) -> EnvironmentProblem:
        return EnvironmentProblem(f"cannot write {self.what} {self.path}: {e.strerror or e}")

    def _temporary(self) -> tuple[int, Path]:
        """A new file beside the output (same directory: the rename cannot cross devices),
        hidden, named after it and this process."""
        name = os.fsencode(self.path.name)[:_TEMPORARY_NAME_BYTES]
        tmp = self.path.with_name(f".{os.fsdecode(name)}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except OSError as e:
            raise self._cannot(e) from None

    def _publish(self, tmp: Path) -> None:
        """`tmp` becomes the output. Without `overwrite` a hard link gives it the name only
        if nothing took the name meanwhile; a file system without hard links falls back to
        the rename, after the check made when this `Output` was."""
        if self.overwrite:
            # checked again: the name may have become a device or a FIFO while writing
            refuse_non_regular(self.path, self.what, _stat(self.path, self.what))
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
        self.what = output.what
        self._tmp: Path | None = None
        self._lock_fd: int | None = None
        self.partial: Path | None = None
        """Where a recording that did not close whole was left, when an old file it would
        have replaced was kept instead (see `close`)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            if not output.overwrite:
                raise output._exists() from None
            fd = None
        except OSError as e:
            raise output._cannot(e) from None
        try:
            # non-blocking: opening a FIFO for reading would wait for a writer
            held = fd if fd is not None else os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise output._cannot(e) from None
        try:
            refuse_non_regular(self.path, self.what, os.fstat(held))
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(held)
            raise UsageError(
                f"{output.what} {self.path} is being written by another specdash; "
                "wait for it to finish or record to another file"
            ) from None
        except UsageError:
            os.close(held)
            raise
        if fd is None:  # replacing an existing file: record beside it, keep its lock
            self._lock_fd = held
            fd, self._tmp = output._temporary()
        self.stream: IO[str] = open(fd, "w", encoding="utf-8")  # noqa: SIM115

    def close(self, whole: bool = True) -> None:
        """Close the stream and, when it replaces an old file, rename it onto its name if the
        recording is `whole` and its last flush succeeded; otherwise the old file stays and
        the recording, unless empty, is left beside it (`partial`). Then release the lock.
        An OSError is raised after all of it was tried."""
        error: OSError | None = None
        try:
            self.stream.close()
        except OSError as e:
            error = e
        try:
            if self._tmp is not None:
                if whole and error is None:
                    os.replace(self._tmp, self.path)
                elif os.stat(self._tmp).st_size:
                    self.partial = self._tmp
                else:  # nothing was recorded: nothing to keep
                    os.unlink(self._tmp)
                self._tmp = None
        except OSError as e:
            error = error or e
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
        if error is not None:
            raise error
