"""Timestamps on the wire: one format, RFC 3339 in UTC with `Z` and six fractional digits.

`render` is the one formatter every writer uses: the agent's status fields, the operator's
status fields and annotations, its Events and its Lease, the kubectl plugin's annotations and
the JSON logs. `2026-11-22T01:10:14.643000Z`:

- six digits because a Lease's `renewTime`/`acquireTime` are MicroTime, which the API server
  parses with exactly six; the same string is a valid `metav1.Time` (Event timestamps: the API
  server keeps their seconds) and a valid `date-time` in our CRDs;
- a datetime survives `render` then `parse` exactly: the operator compares what it wrote with what
  it holds (a condition's transition time, the evidence a human overrode, a cordon's identity);
- readers accept any precision, `Z` or an offset (what kubectl and older versions wrote).
"""

from __future__ import annotations

import datetime


def render(moment: datetime.datetime | float) -> str:
    """RFC 3339 in UTC, `Z`, microseconds: of an aware datetime (a naive one is taken as UTC) or of
    epoch seconds."""
    if isinstance(moment, datetime.datetime):
        utc = moment.astimezone(datetime.UTC) if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
    else:
        utc = datetime.datetime.fromtimestamp(moment, tz=datetime.UTC)
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def rfc3339(epoch_seconds: float) -> str:
    """`render` of epoch seconds (the agent's and the simulator's clocks)."""
    return render(epoch_seconds)


def parse(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp (any precision, `Z` or an offset)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
