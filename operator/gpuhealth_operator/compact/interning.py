"""One copy of each value many GPUs and nodes hold alike: a bounded table that forgets everything when full.

The cache keeps every node's facts for as long as the node exists, so equal values reported by many
nodes (healthy counters, clock ratios, a GPU's remembered trend) are worth holding once (issue 29). The
table is cleared when it holds `limit` entries, so values that came and went (heartbeat times) do not
pile up; what is already shared stays shared. An interned value must never be mutated (no reader does).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

_V = TypeVar("_V")


class Table:
    """A bounded table of shared values, by key. A table shared in batches checks its bound once per
    batch instead (`compaction.SharedValues.check`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.table: dict[Hashable, Any] = {}

    def one(self, key: Hashable, value: _V) -> _V:
        """The value held for `key`, else `value`, now held: a check and one C call."""
        if len(self.table) >= self.limit:
            self.table.clear()
        return self.table.setdefault(key, value)  # type: ignore[no-any-return]
