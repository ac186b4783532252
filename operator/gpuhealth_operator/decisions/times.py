"""RFC 3339 timestamps as the cluster stores them, parsed defensively.

Status fields are written by other processes (and by humans with kubectl), so
a timestamp that does not parse is treated as absent rather than as an error:
missing data is never a fault, and never a crash.

Parsing and rendering are memoised (`CACHED`): every pass reads the same few
timestamps per node (a heartbeat, the conditions' transition times) again.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable
from typing import Final

from gpuhealth_api import timestamps

CACHED: Final = 16_384
"""Timestamps kept parsed and rendered (a few per node; datetimes are immutable, so sharing is safe)."""


def parse(value: object) -> datetime.datetime | None:
    """An aware UTC datetime from an RFC 3339 string; None for absent or garbage.

    A timestamp without an offset is taken as UTC (that is what Kubernetes writes).
    """
    if not isinstance(value, str) or not value:
        return None
    return _parse(value)


def parse_each(values: Iterable[object]) -> list[datetime.datetime | None]:
    """`parse` of each value, in one call: the times of all a node's conditions (`hysteresis.from_rows`)."""
    return [parse(value) for value in values]


@functools.lru_cache(maxsize=CACHED)
def _parse(value: str) -> datetime.datetime | None:
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.astimezone(datetime.UTC)


@functools.lru_cache(maxsize=CACHED)
def render(value: datetime.datetime) -> str:
    """`gpuhealth_api.timestamps.render`: the one wire format (RFC 3339, UTC, `Z`, microseconds, so
    round trips are exact), memoised."""
    return timestamps.render(value)


def seconds_between(earlier: datetime.datetime, later: datetime.datetime) -> float:
    return (later - earlier).total_seconds()
