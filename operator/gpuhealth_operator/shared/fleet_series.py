"""The fleet gauges' series: shown only while the replica leads, and kept to the label sets in trouble.

A fleet gauge counts what the leader's passes see; a standby's scrape holds no samples of it
(`FleetGauge`). A gauge of "1 for each X in trouble" (a node's true condition, a degraded topology
domain) has series only for the X in trouble now: `SeriesSet` removes the series of one that
recovered, so an alert on it resolves, and the series count follows the trouble, not the fleet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import prometheus_client
from prometheus_client import metrics_core

Labels = TypeVar("Labels", bound=tuple[str, ...])
_STR_ONLY = frozenset({str})


class FleetGauge(prometheus_client.Gauge):
    """A gauge of the fleet's state as the leader counts it: collected only while `shown()` says so.

    Still described (registered names, rule checks); a standby's scrape simply holds no samples of it.
    """

    shown: Callable[[], bool] = staticmethod(lambda: True)

    def labels(self, *labelvalues: object, **labelkwargs: object) -> FleetGauge:
        """The child of those label values. A child already made is looked up in one dict read: every
        timer pass sets the breaker's gauge of every acting policy, and the library's `labels` (its
        checks, the values' `str`, its lock) was most of that. A value that is not exactly a str (an
        enum equal to a str may print otherwise), a keyword, or a child not made yet goes the library's
        way, which checks and makes it."""
        if not labelkwargs and _STR_ONLY.issuperset(map(type, labelvalues)):
            made = getattr(self, "_metrics", None)  # a parent's children, keyed by their values as str
            child = made.get(labelvalues) if made is not None else None
            if child is not None:
                return child  # type: ignore[no-any-return]
        return super().labels(*labelvalues, **labelkwargs)

    def collect(self) -> Iterable[metrics_core.Metric]:
        return super().collect() if self.shown() else []


class SeriesSet:
    """A gauge labelled (policy, …) whose series are each policy's current set of label tuples, each 1."""

    def __init__(self, gauge: prometheus_client.Gauge) -> None:
        self.gauge = gauge
        self._series: dict[str, set[tuple[str, ...]]] = {}
        """policy → the label tuples (after the policy) its series exist for."""

    def replace(self, policy: str, labels: Iterable[tuple[str, ...]]) -> None:
        """The policy's series are `labels`: 1 for each, and those no longer in it removed."""
        now = set(labels)
        for gone in self._series.get(policy, set()) - now:
            with contextlib.suppress(KeyError):
                self.gauge.remove(policy, *gone)
        for labels_now in now:
            self.gauge.labels(policy, *labels_now).set(1)
        if now:
            self._series[policy] = now
        else:
            self._series.pop(policy, None)

    def clear(self) -> None:
        """Forget what series exist (a new term cleared the gauge itself)."""
        self._series.clear()


def replace_counts(gauge: prometheus_client.Gauge, counts: Mapping[Labels, float]) -> None:
    """The gauge's series are exactly `counts` (labels → value); a series not in it is removed.

    The series present are read from the gauge itself (a standby's too), not from a memo.
    """
    present = {tuple(m.labels.values()) for f in prometheus_client.Gauge.collect(gauge) for m in f.samples}
    for labels in present - set(counts):
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
    for labels, count in counts.items():
        gauge.labels(*labels).set(count)
