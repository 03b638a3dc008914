"""Give the C heap's freed memory back to the OS after a prefill.

A prefill's activations are large temporaries: a 15k-token prompt frees ~100 MB of them on the
embedded CPU pair. glibc keeps freed heap memory for reuse instead of returning it, so without
a trim the process's RSS rises to the high-water mark of the longest prompt so far and stays
there (the dashboard goes 319 -> 447 MB over the default prompt set). `malloc_trim(0)` returns
the free pages of every arena: ~115 MB back after each long prefill, a few ms, once per prompt
group. Where the C library has no `malloc_trim` (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return freed C-heap memory to the OS; False where there is no way to."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
