"""Progress of a long command on stderr: records written and time covered, at most every few seconds."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO


class Progress:
    """Progress on a stream at most every `every_seconds` (records written, time covered)."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        every_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every_seconds = every_seconds
        self.clock = clock
        self._last: float | None = None

    def update(self, records: int, covered_seconds: float, total_seconds: float | None = None) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.every_seconds:
            return
        self._last = now
        of = f" of {span(total_seconds)}" if total_seconds is not None else ""
        print(f"{records} records, {span(covered_seconds)}{of} covered", file=self.stream, flush=True)


def span(seconds: float) -> str:
    """`3d 04:05:06` (or `04:05:06` under a day)."""
    days, rest = divmod(int(seconds), 86_400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock
