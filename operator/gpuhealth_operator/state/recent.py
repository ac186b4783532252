"""Cluster reads kept for a few seconds, for what the timer would otherwise ask again every tick.

A GPU isolated by IsolateGPU stays faulty until it is repaired, hours or
days; the timer passes over its node every tick meanwhile. The policy's
DeviceTaintRules and the node's ResourceSlices are read once per `seconds`
instead of once per pass. The reader drops an entry when it writes what
the entry holds (a rule created or deleted), so the operator's own changes
are seen at once; what only others change (a rule deleted by a human, a
slice the DRA driver republishes) is seen within `seconds`.

Time is the caller's decision clock, so a backtest replaying a trace ages
entries as the live operator did.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

SECONDS: Final = 10.0
"""How long a read is reused: an override of an isolated GPU (its rule deleted by a human) is
noticed within this, plus a tick."""


class Recent(Generic[K, V]):
    """Values by key, each good for `seconds` after it was read."""

    def __init__(self, seconds: float = SECONDS) -> None:
        self.seconds = seconds
        self._entries: dict[K, tuple[datetime.datetime, V]] = {}

    def get(self, key: K, now: datetime.datetime) -> V | None:
        """The value read for `key` less than `seconds` before `now`, or None (a clock that went
        back counts as expired: better one read too many than a value of unknown age)."""
        entry = self._entries.get(key)
        return entry[1] if entry is not None and self._fresh(entry[0], now) else None

    async def read(self, key: K, now: datetime.datetime, load: Callable[[], Awaitable[V]]) -> V:
        """The fresh value for `key`, or `load()`'s, kept from `now` (a failed load keeps nothing)."""
        value = self.get(key, now)
        if value is None:
            value = await load()
            self.put(key, value, now)
        return value

    def put(self, key: K, value: V, now: datetime.datetime) -> None:
        """Keep `value`, read at `now`; entries expired by then are let go."""
        expired = [k for k, (read_at, _) in self._entries.items() if not self._fresh(read_at, now)]
        for old in expired:
            del self._entries[old]
        self._entries[key] = (now, value)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)

    def drop_where(self, matches: Callable[[K], bool]) -> None:
        for key in [k for k in self._entries if matches(k)]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def _fresh(self, read_at: datetime.datetime, now: datetime.datetime) -> bool:
        return 0 <= (now - read_at).total_seconds() < self.seconds
