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
  from the middle of the heap too. Called from the timer's full pass
  (every few seconds).

Both are no-ops where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

M_ARENA_MAX = -8
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
