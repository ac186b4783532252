"""Issue 52: a report's clocks read in one call per GPU are the clocks read field by field.

`straggler_scores.clocks_of` reads the five facts it needs of a cached GPU (`gpu_facts.GPUFacts`) at once;
`window_score` takes an unthrottled window's medians by column. Held here equal to the code each replaced
(copied below as the slow path), cached and decoded, to the last bit of the float.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import faults
from gpuhealth_operator.decisions import gpu_facts, signals, straggler_scores
from gpuhealth_operator.state import compaction


def slow_number(value: object) -> float | None:
    """`straggler_scores._number` as it was before its plain-number fast path."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def slow_ratio(gpu: Mapping[str, Any]) -> float | None:
    """`straggler_scores._clock_ratio` as it was before (each fact read with `get`)."""
    clock, max_clock = slow_number(gpu.get("smClockMHz")), slow_number(gpu.get("maxSmClockMHz"))
    utilization = slow_number(gpu.get("utilizationPercent"))
    if utilization is not None:
        busy = utilization > signals.BUSY_UTILIZATION_PERCENT
    else:
        reasons = gpu.get("clockEventReasons")
        busy = isinstance(reasons, list) and straggler_scores.IDLE_REASON not in reasons
    if gpu.get("lost") is True or clock is None or max_clock is None or not busy:
        return None
    if max_clock <= 0 or clock < 0:
        return None
    return min(1.0, clock / max_clock) + 0.0  # since then, a zero ratio is +0.0 (the test at the end)


def slow_clocks(facts: Mapping[str, Any]) -> straggler_scores.Clocks | None:
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        return None
    ratios: list[float | None] = []
    throttled: list[int] = []
    for position, gpu in enumerate(gpus):
        ratio = slow_ratio(gpu) if isinstance(gpu, gpu_facts.MAPPINGS) else None
        ratios.append(ratio)
        reasons = gpu.get("clockEventReasons") if ratio is not None else None
        if isinstance(reasons, list) and straggler_scores._SLOWDOWN_REASONS.intersection(
            r for r in reasons if isinstance(r, str)
        ):
            throttled.append(position)
    busy = sum(r is not None for r in ratios)
    if not busy:
        return None
    return tuple(ratios), len(throttled) / busy, tuple(throttled)


_NUMBER = st.one_of(st.none(), st.booleans(), st.integers(-5, 2000), st.floats(0, 2000), st.text(max_size=2))
_GPU = st.fixed_dictionaries(
    {},
    optional={
        "smClockMHz": _NUMBER,
        "maxSmClockMHz": _NUMBER,
        "utilizationPercent": _NUMBER,
        "lost": st.one_of(st.booleans(), st.none()),
        "clockEventReasons": st.one_of(
            st.none(),
            st.text(max_size=3),
            st.lists(st.sampled_from(["GpuIdle", "SwThermalSlowdown", "HwPowerBrakeSlowdown", "x", 3])),
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(gpus=st.lists(st.one_of(_GPU, st.integers(0, 3)), max_size=8), cached=st.booleans())
def test_clocks_read_at_once_are_the_clocks_read_field_by_field(gpus: list[Any], cached: bool) -> None:
    """Any GPUs (busy, idle, lost, without clocks, with odd values, not mappings at all)."""
    report = [compaction.compact_gpu(g) if cached and isinstance(g, dict) else g for g in gpus]
    assert straggler_scores.clocks_of({"gpus": report}) == slow_clocks({"gpus": report})  # type: ignore[typeddict-item]


def slow_window_score(window: list[straggler_scores.Clocks]) -> float | None:
    """`straggler_scores.window_score` as it was before its by-column path (every window this way)."""
    medians = []
    for position in range(max(len(ratios) for ratios, _, _ in window)):
        clear: list[float] = []
        hot: list[float] = []
        for ratios, _, throttled in window:
            if position < len(ratios) and (r := ratios[position]) is not None:
                (hot if position in throttled else clear).append(r)
        if clear or hot:
            medians.append(statistics.median(clear or hot))
    if not medians:
        return None
    return min(medians) * (1 - statistics.median([share for _, share, _ in window]))


_RATIO = st.one_of(st.none(), st.floats(0.01, 1.0))


@st.composite
def _clocks(draw: st.DrawFn, width: int | None) -> straggler_scores.Clocks:
    ratios = tuple(
        draw(
            st.lists(_RATIO, min_size=1, max_size=8)
            if width is None
            else st.lists(_RATIO, min_size=width, max_size=width)
        )
    )
    throttled = tuple(
        draw(st.lists(st.integers(0, len(ratios) - 1), max_size=2, unique=True))
        if draw(st.booleans())
        else ()
    )
    return ratios, draw(st.sampled_from([0.0, 0.0, 0.125, 0.5])) if throttled else 0.0, throttled


@settings(max_examples=500, deadline=None)
@given(data=st.data(), same_width=st.booleans(), length=st.integers(1, 6))
def test_window_scores_by_column_are_the_scores_by_position(
    data: st.DataObject, same_width: bool, length: int
) -> None:
    """Windows of 1 to 6 reports, of one width or ragged, throttled or not, with idle GPUs."""
    width = data.draw(st.integers(1, 8)) if same_width else None
    window = [data.draw(_clocks(width)) for _ in range(length)]
    got, want = straggler_scores.window_score(window), slow_window_score(window)
    assert got == want and (got is None or math.copysign(1.0, got) == math.copysign(1.0, want or 0.0))


_ODD_NUMBER = st.one_of(_NUMBER, st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**60), 2**60))
_ODD_GPU = st.fixed_dictionaries(
    {},
    optional={
        "smClockMHz": _ODD_NUMBER,
        "maxSmClockMHz": _ODD_NUMBER,
        "utilizationPercent": _ODD_NUMBER,
        "lost": st.one_of(st.booleans(), st.none(), st.integers(0, 1)),
        "clockEventReasons": st.one_of(
            st.none(),
            st.lists(
                st.one_of(
                    st.sampled_from(["GpuIdle", "SwThermalSlowdown", "HwSlowdown", "SwPowerCap", "x"]),
                    st.integers(0, 3),
                    st.just({"not": "hashable"}),
                    st.just(["nor", "this"]),
                ),
                max_size=4,
            ),
        ),
    },
)


def slow_performance(facts: Mapping[str, Any]) -> straggler_scores.Performance:
    """`straggler_scores.performance_of` as it was before `_gpus_missing` read a cached GPU's slot."""
    gpus = facts.get("gpus")
    if not isinstance(gpus, list) or any(
        isinstance(g, gpu_facts.MAPPINGS) and g.get("lost") is True for g in gpus
    ):
        return None, None
    if faults.missing_gpus(len(gpus), faults.seen_by_agent(facts)) is not None:  # type: ignore[arg-type]
        return None, None
    clocks = slow_clocks(facts)
    score = None if clocks is None else min(r for r in clocks[0] if r is not None) * (1 - clocks[1])
    return straggler_scores.cohort_of(facts), score  # type: ignore[arg-type]


def same_float(a: object, b: object) -> bool:
    """Equal to the bit (NaN is NaN, a zero's sign counts)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        )
    return a == b


@settings(max_examples=600, deadline=None)
@given(
    gpus=st.lists(st.one_of(_ODD_GPU, st.integers(0, 3)), max_size=8),
    cached=st.booleans(),
    seen=st.one_of(st.none(), st.integers(0, 9)),
)
def test_plain_number_clocks_inline_are_the_clocks_read_field_by_field(
    gpus: list[Any], cached: bool, seen: int | None
) -> None:
    """The inline path for plain numbers, and its fallbacks: NaN, infinities, huge integers, a `lost`
    of 1, reasons that are not strings or not hashable; the node's performance with them."""
    report = [compaction.compact_gpu(g) if cached and isinstance(g, dict) else g for g in gpus]
    facts: dict[str, Any] = {"gpus": report, "summary": {"model": "H100"}, "agent": {"driverVersion": "550"}}
    if seen is not None:
        facts["agent"]["maxGpuCountSeen"] = seen
    got, want = straggler_scores.clocks_of(facts), slow_clocks(facts)  # type: ignore[arg-type]
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert len(got[0]) == len(want[0]) and all(map(same_float, got[0], want[0]))
        assert got[1:] == want[1:]
    (cohort, score), (want_cohort, want_score) = (
        straggler_scores.performance_of(facts),
        slow_performance(facts),
    )  # type: ignore[arg-type]
    assert cohort == want_cohort and same_float(score, want_score)


def test_a_zero_clock_ratio_is_positive_zero_whatever_came_before() -> None:
    """Ratios are interned by value, and -0.0 == 0.0: were a zero's sign kept, a report's ratio would
    depend on which zero the fleet showed first (hypothesis found it). Every zero ratio is +0.0."""
    for clock in (-0.0, 0.0, -0.0):
        gpu = {"smClockMHz": clock, "maxSmClockMHz": 1, "utilizationPercent": 90, "clockEventReasons": []}
        # Plain numbers (the inline path), cached, and no utilization (MIG: `_clock_ratio`'s path).
        mig = {**gpu, "utilizationPercent": None}
        for facts in ({"gpus": [gpu]}, {"gpus": [compaction.compact_gpu(gpu)]}, {"gpus": [mig]}):
            clocks = straggler_scores.clocks_of(facts)  # type: ignore[arg-type]
            assert clocks is not None
            assert math.copysign(1.0, clocks[0][0]) == 1.0, (clock, facts)
