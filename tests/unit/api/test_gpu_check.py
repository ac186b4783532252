"""`conditions.gpu_check` binds one predicate as `gpu_checks` binds them all (issue 52: a report
whose counter crept asks two or three predicates of a dozen; `healthy_reports.still_healthy` binds
only those)."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import conditions, faults, status, vocabulary

_CONDITIONS = sorted(conditions.gpu_checks(frozenset()), key=str)
_GPUS = st.fixed_dictionaries(
    {},
    optional={
        "temperatureC": st.integers(0, 120),
        "clocksThrottleReasons": st.lists(st.sampled_from(["HwSlowdown", "SwThermal", "x"]), max_size=2),
        "pcie": st.fixed_dictionaries(
            {},
            optional={
                "aer": st.dictionaries(st.sampled_from(["nonFatal", "correctable"]), st.integers(0, 10**6)),
                "linkWidth": st.integers(0, 16),
            },
        ),
        "nvlink": st.fixed_dictionaries(
            {},
            optional={
                "linksUp": st.integers(0, 18),
                "linksDown": st.integers(0, 18),
                "crcErrors": st.integers(0, 10**6),
            },
        ),
        "ecc": st.fixed_dictionaries(
            {},
            optional={"uncorrectedVolatile": st.integers(0, 5), "correctedVolatile": st.integers(0, 10**6)},
        ),
        "xids": st.lists(st.integers(0, 120), max_size=3),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    record=_GPUS,
    xids=st.frozensets(st.integers(0, 120), max_size=3),
    limits=st.dictionaries(st.sampled_from(_CONDITIONS), st.floats(0, 1e6), max_size=3),
    peak=st.none() | st.floats(0, 1e6),
)
def test_one_check_is_that_of_every_check(
    record: dict[str, Any],
    xids: frozenset[int],
    limits: dict[vocabulary.Condition, float],
    peak: float | None,
) -> None:
    history: faults.History = faults.no_history if peak is None else _History(peak)
    gpu = cast("status.GPUStatus", record)
    every = conditions.gpu_checks(xids, limits, history)
    for condition in _CONDITIONS:
        assert conditions.gpu_check(condition, xids, limits, history)(gpu) == every[condition](gpu)


class _History:
    """A memory that has seen every counter grow `rate` an hour and peak at it."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def __call__(self, gpu: object) -> _History:
        return self

    def most(self, path: str) -> float | None:
        return self.rate

    def per_hour(self, path: str) -> float | None:
        return self.rate
