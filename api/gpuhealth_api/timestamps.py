"""Timestamps as the cluster stores them: RFC 3339 in UTC, millisecond precision.

The one formatter and parser the agent and the simulator share (the operator
keeps its own in `decisions/times.py` for now).

Milliseconds, not seconds, because observedTime feeds the detection-to-action
latency the operator measures, and that is often under a second.
"""

from __future__ import annotations

import datetime


def rfc3339(epoch_seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp (any precision, `Z` or an offset)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
