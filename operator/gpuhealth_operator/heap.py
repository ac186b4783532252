"""Giving freed heap back to the operating system after bursts of watch events.

Every watch event is a JSON document of several KB (Nodes and GPUNodes carry
managedFields); parsing thousands of them leaves glibc's malloc arenas
holding freed memory that it does not return on its own, so the process RSS
stays at its burst peak. `malloc_trim(0)` after a garbage collection returns
it. Called from the timer's full pass (every few seconds); a no-op where
glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def trim() -> None:
    gc.collect()
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)
