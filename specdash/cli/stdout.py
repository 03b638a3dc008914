"""What a command prints as its result goes to stdout here, whatever stdout turns out to be.

A reader that stops early (`| head`) has taken what it wanted: not an error. A stdout that
cannot take the output (a full disk, `/dev/full`, a closed descriptor) is an environment
problem, one line and exit 4, not a traceback; stdout is then pointed at /dev/null so the
interpreter's own flush at exit does not fail a second time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO

from specdash.errors import EnvironmentProblem


def _discard() -> None:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def write_stdout(write: Callable[[IO[str]], object]) -> None:
    """`write(stdout)`, flushed."""
    out = sys.stdout
    if out is None:  # started with descriptor 1 closed (`>&-`)
        raise EnvironmentProblem("cannot write the output to stdout: it is closed")
    try:
        write(out)
        out.flush()
    except BrokenPipeError:
        _discard()
    except OSError as e:
        _discard()
        raise EnvironmentProblem(f"cannot write the output to stdout: {e.strerror or e}") from None


def print_stdout(*lines: str) -> None:
    """`lines`, each ended by a newline, to stdout."""
    write_stdout(lambda out: out.writelines(line + "\n" for line in lines))
