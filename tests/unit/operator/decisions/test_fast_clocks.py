"""Issue 52: a report's clocks read in one call per GPU are the clocks read field by field.

`straggler_scores.clocks_of` reads the five facts it needs of a cached GPU (`gpu_facts.GPUFacts`) at once.
Held here equal to the code it replaced (copied below as the slow path), cached and decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.decisions import gpu_facts, signals, straggler_scores
from gpuhealth_operator.state import compaction


def slow_ratio(gpu: Mapping[str, Any]) -> float | None:
    """`straggler_scores._clock_ratio` as it was before (each fact read with `get`)."""
    clock, max_clock = (
        straggler_scores._number(gpu.get("smClockMHz")),
        straggler_scores._number(gpu.get("maxSmClockMHz")),
    )
    utilization = straggler_scores._number(gpu.get("utilizationPercent"))
    if utilization is not None:
        busy = utilization > signals.BUSY_UTILIZATION_PERCENT
    else:
        reasons = gpu.get("clockEventReasons")
        busy = isinstance(reasons, list) and straggler_scores.IDLE_REASON not in reasons
    if gpu.get("lost") is True or clock is None or max_clock is None or not busy:
        return None
    if max_clock <= 0 or clock < 0:
        return None
    return min(1.0, clock / max_clock)


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
