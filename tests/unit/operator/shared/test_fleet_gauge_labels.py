"""`FleetGauge.labels`' shortcut to a child already made answers what the library's `labels` does."""

from __future__ import annotations

import enum

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth_operator.shared.fleet_series import FleetGauge


class _Mixed(str, enum.Enum):  # noqa: UP042 - equal to "a", printed "_Mixed.A"
    A = "a"


def _gauge(labelnames: tuple[str, ...] = ("policy",)) -> FleetGauge:
    return FleetGauge("g", "a gauge", labelnames, registry=prometheus_client.CollectorRegistry())


@given(st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=1, max_size=12))
def test_each_child_is_the_librarys(names: list[str]) -> None:
    gauge = _gauge()
    reference = prometheus_client.Gauge(
        "g", "a gauge", ("policy",), registry=prometheus_client.CollectorRegistry()
    )
    for name in names:
        child = gauge.labels(name)
        assert child is gauge.labels(name) is gauge.labels(policy=name)
        assert type(child) is FleetGauge
        assert child._labelvalues == reference.labels(name)._labelvalues
    assert set(gauge._metrics) == set(reference._metrics)


def test_values_not_exactly_str_go_the_librarys_way() -> None:
    gauge = _gauge()
    gauge.labels("a")
    assert gauge.labels(_Mixed.A)._labelvalues == (str(_Mixed.A),)  # as the library names it
    assert gauge.labels(5) is gauge.labels("5")


def test_the_librarys_checks_stay() -> None:
    gauge = _gauge()
    gauge.labels("a")
    with pytest.raises(ValueError, match="count"):
        gauge.labels("a", "b")
    with pytest.raises(ValueError, match="No label names"):
        _gauge(()).labels("a")
