"""Keeping the operator's heap close to its live objects, through glibc's malloc.

Every watch event is a JSON document of several KB (Nodes and GPUNodes carry
managedFields); parsing thousands of them leaves glibc's malloc arenas
holding freed memory that it does not return on its own, so the process RSS
stays at its burst peak. Two things keep it down:

- `tune_allocator`, once at start-up before any thread exists: at most two
  malloc arenas. glibc gives a thread that contends for the main arena one
  of its own, up to 8 per core (hundreds on a large node), and each keeps
  its own freed memory; the Lease elector, the metrics server and kopf's
  executor threads all allocate.
- `trim`, after a garbage collection: `malloc_trim(0)` returns freed pages
  from the middle of the heap too. It runs on the event loop (0.6 s at 5,000
  nodes, 12 s at 100,000: bench/fleet_model.py), so `Trimmer` calls it only
  after a burst: when the process grew since the last trim (a start-up, a
  storm of events), checked on the timer's refresh, never at rest.

Both are no-ops where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import pathlib
from collections.abc import Callable
from typing import Final

M_ARENA_MAX: Final = -8
"""mallopt's parameter number (glibc's malloc.h)."""
ARENAS = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018  (glibc only)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator() -> None:
    """Bound glibc's malloc arenas; call before the operator starts any thread."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, ARENAS)


def trim() -> None:
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


GROWTH_BYTES: Final = 16 * 2**20
GROWTH_RATIO: Final = 0.1
"""A trim pays after the process grew by both since the last one: a fleet at rest drifts by less."""


def resident_bytes() -> int | None:
    """The process's resident set (None where /proc is absent)."""
    try:
        pages = int(pathlib.Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def grown(resident: int, after_last: int | None) -> bool:
    """Whether the process grew enough since the last trim (None: none yet) for another to pay."""
    if after_last is None:
        return True
    return resident - after_last >= max(GROWTH_BYTES, after_last * GROWTH_RATIO)


class Trimmer:
    """Trims after bursts only. Where the resident set cannot be read, on every full pass instead."""

    def __init__(
        self, resident: Callable[[], int | None] = resident_bytes, do: Callable[[], None] = trim
    ) -> None:
        self._resident = resident
        self._do = do
        self._after: int | None = None

    def maybe(self, *, full: bool) -> bool:
        """Trim if due; whether it did."""
        resident = self._resident()
        due = full if resident is None else grown(resident, self._after)
        if not due:
            return False
        self._do()
        self._after = self._resident()
        return True
