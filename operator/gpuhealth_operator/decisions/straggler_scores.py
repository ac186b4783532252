"""A straggler's score from its agent's reports: its cohort (GPU model, driver), each busy GPU's clock
ratio, and the node's score on one report or a window of them (`stragglers`' docstring: Cohorts, Score).

Split from `stragglers` (issue 46: one concern a module); `stragglers` keeps the window and the status.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from typing import Final, TypeVar, cast

from gpuhealth_api import faults, status
from gpuhealth_operator.compact import interning
from gpuhealth_operator.decisions import gpu_facts, signals

_SLOWDOWN_REASONS: Final = status.THERMAL_REASONS | status.POWER_REASONS
IDLE_REASON: Final = "GpuIdle"
"""NVML's clock event reason for a GPU with nothing running (its clocks dropping to idle)."""


Cohort = tuple[str, str]
"""(GPU model, driver version)."""


Performance = tuple[Cohort | None, float | None]
"""A node's cohort and score as its facts say, (None, None) when they leave it out of the statistics."""


def performance_of(facts: status.GPUNodeStatus) -> Performance:
    """`cohort_of` and `node_score`; (None, None) for a node with a lost or missing GPU (its numbers are
    meaningless). Depends on the facts alone: a caller may keep it per version of them."""
    return performance_with(facts, clocks_of(facts))


def performance_with(facts: status.GPUNodeStatus, clocks: Clocks | None) -> Performance:
    """`performance_of` for a caller that keeps the facts' `clocks_of` (the timer adds them to the node's
    window too, `smoothed`): a report's GPUs are read once."""
    if _gpus_missing(facts):
        return None, None
    return cohort_of(facts), score_of(clocks)


def cohort_of(facts: status.GPUNodeStatus) -> Cohort | None:
    """The node's (model, driver) cohort; None when the agent has not said which GPU it is."""
    summary, agent = facts.get("summary"), facts.get("agent")
    gpu_model = summary.get("model") if isinstance(summary, dict) else None
    if not gpu_model:
        gpus = facts.get("gpus")
        first = (
            gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], gpu_facts.MAPPINGS) else None
        )
        gpu_model = first.get("model") if first is not None else None
    if not isinstance(gpu_model, str) or not gpu_model:
        return None
    driver = agent.get("driverVersion") if isinstance(agent, dict) else None
    return gpu_model, driver if isinstance(driver, str) else ""


def node_score(facts: status.GPUNodeStatus) -> float | None:
    """The node's performance score in [0, 1] on this one report (`stragglers`' docstring); None when no
    GPU is busy. The timer judges the score of a node's recent reports (`smoothed`)."""
    return score_of(clocks_of(facts))


Clocks = tuple[tuple[float | None, ...], float, tuple[int, ...]]
"""One report's clock ratio of each GPU by position (None: not busy, or no clocks), its throttle share
(the share of busy GPUs with a thermal or power slowdown reason) and those GPUs' positions."""


def clocks_of(facts: status.GPUNodeStatus) -> Clocks | None:
    """The report's `Clocks`; None when no GPU is busy."""
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        return None
    ratios: list[float | None] = []
    busy = 0
    throttled: list[int] = []
    table = _RATIOS.table
    for position, gpu in enumerate(gpus):
        if type(gpu) is gpu_facts.GPUFacts:
            read: tuple[object, ...] = _CLOCK_FACTS(gpu)  # one C call (ABSENT: not reported)
        elif isinstance(gpu, gpu_facts.MAPPINGS):
            read = tuple(map(gpu.get, _CLOCK_FIELDS))
        else:
            ratios.append(None)
            continue
        sm_clock, max_sm_clock, lost, utilization, reasons = read
        kind, max_kind, busy_kind = type(sm_clock), type(max_sm_clock), type(utilization)
        if (
            (kind is int or kind is float)
            and (max_kind is int or max_kind is float)
            and (busy_kind is int or busy_kind is float)
        ):
            # Plain numbers, as every agent reports them: `_clock_ratio` inline, the same float.
            clock, max_clock = float(sm_clock), float(max_sm_clock)  # type: ignore[arg-type]
            if (
                lost is True
                or not float(utilization) > signals.BUSY_UTILIZATION_PERCENT  # type: ignore[arg-type]
                or max_clock <= 0
                or clock < 0
            ):
                ratios.append(None)
                continue
            ratio: float | None = min(1.0, clock / max_clock) + 0.0  # a zero is +0.0 (`_clock_ratio`)
            if len(table) >= _RATIOS.limit:
                table.clear()
            ratio = table.setdefault(ratio, ratio)  # `_interned`
        else:
            ratio = _clock_ratio(*read)
        ratios.append(ratio)
        if ratio is None:
            continue
        busy += 1
        if isinstance(reasons, list) and reasons and _slowed(reasons):
            throttled.append(position)
    if not busy:
        return None
    return _interned(tuple(ratios)), len(throttled) / busy, tuple(throttled)


def _slowed(reasons: list[object]) -> bool:
    """Whether a GPU's clock event reasons name a thermal or power slowdown (its strings, that is)."""
    try:
        return not _SLOWDOWN_REASONS.isdisjoint(reasons)  # a non-string never equals a reason
    except TypeError:  # an unhashable entry (a malformed report): look at the strings alone
        return bool(_SLOWDOWN_REASONS.intersection(r for r in reasons if isinstance(r, str)))


def score_of(clocks: Clocks | None) -> float | None:
    """`node_score` of a report's `Clocks`: `window_score` of a window of one, whose median of one value per
    GPU is that value, so the slowest busy GPU's ratio times (1 - the throttle share), the same float."""
    if clocks is None:
        return None
    ratios, share, _ = clocks
    return min(r for r in ratios if r is not None) * (1 - share)


def window_score(window: Sequence[Clocks]) -> float | None:
    """min over GPUs of the GPU's median clock ratio over `window` (its reports without a slowdown reason
    for it, if any), times (1 - the median throttle share); a single report's score is its slowest busy
    GPU's ratio times (1 - its throttle share)."""
    medians: list[float] = []
    rows = [ratios for ratios, _, _ in window]
    width = len(rows[0]) if rows else -1
    if width >= 0 and not any(t for _, _, t in window) and all(len(ratios) == width for ratios in rows):
        # The common window: no GPU throttled, every report of as many GPUs. Each GPU's values are then
        # its column, in the window's order: the lists the loop below would build, by one C transpose;
        # `_median` inline (a call per GPU per window move was half of this).
        for column in zip(*rows, strict=True):
            busy = (
                [r for r in column if r is not None] if None in column else cast("tuple[float, ...]", column)
            )
            if busy:
                ordered = sorted(busy)
                middle = len(ordered) // 2
                medians.append(
                    ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
                )
        if not medians:
            return None
        return min(medians) * (1 - _median([share for _, share, _ in window]))
    for position in range(max(len(ratios) for ratios in rows)):
        clear: list[float] = []
        hot: list[float] = []
        for ratios, _, throttled in window:
            if position < len(ratios) and (r := ratios[position]) is not None:
                (hot if position in throttled else clear).append(r)
        if clear or hot:
            medians.append(_median(clear or hot))
    if not medians:
        return None
    return min(medians) * (1 - _median([share for _, share, _ in window]))


def _median(values: list[float]) -> float:
    """`statistics.median` of a non-empty list, the same float, without its generality (per GPU per
    window move)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


_CLOCK_FIELDS: Final = ("smClockMHz", "maxSmClockMHz", "lost", "utilizationPercent", "clockEventReasons")
"""What `clocks_of` reads of a GPU (`_clock_ratio`'s arguments in order)."""
_CLOCK_FACTS: Final = operator.attrgetter(*_CLOCK_FIELDS)
_LOST_FACT: Final = operator.attrgetter("lost")
"""A cached GPU's `lost` slot (ABSENT: not reported)."""


def _clock_ratio(
    sm_clock: object, max_sm_clock: object, lost: object, utilization: object, reasons: object
) -> float | None:
    """A GPU's SM clock over its maximum, from its `_CLOCK_FIELDS`; None when not busy or without clocks."""
    kind, max_kind = type(sm_clock), type(max_sm_clock)  # `_number`'s answer for a plain number, inline
    clock = float(sm_clock) if kind is float or kind is int else _number(sm_clock)  # type: ignore[arg-type]
    max_clock = float(max_sm_clock) if max_kind is float or max_kind is int else _number(max_sm_clock)  # type: ignore[arg-type]
    if lost is True or clock is None or max_clock is None or not _busy(utilization, reasons):
        return None
    if max_clock <= 0 or clock < 0:
        return None
    # + 0.0: a zero ratio is +0.0. Ratios are interned by value and -0.0 == 0.0, so a kept sign would
    # depend on which zero the fleet reported first (an agent sending -0.0 MHz).
    return _interned(min(1.0, clock / max_clock) + 0.0)


_RATIOS: Final = interning.Table(16384)
"""One copy of each clock ratio and tuple of ratios: clocks step in MHz bins, so a fleet's GPUs report a
few thousand ratios between them, and each report's ratios are kept (its score, the clock window)."""
_T = TypeVar("_T", bound=Hashable)


def _interned(value: _T) -> _T:
    return _RATIOS.one(value, value)


def _busy(utilization_percent: object, reasons: object) -> bool:
    """Utilization above signals.BUSY_UTILIZATION_PERCENT; where the board reports none (a GPU in MIG
    mode: NVML has no utilization for it), a GPU whose clock event reasons do not say GpuIdle."""
    utilization = _number(utilization_percent)
    if utilization is not None:
        return utilization > signals.BUSY_UTILIZATION_PERCENT
    return isinstance(reasons, list) and IDLE_REASON not in reasons


def _number(value: object) -> float | None:
    kind = type(value)
    if kind is float or kind is int:  # most: no isinstance of a union (a bool is neither)
        return float(value)  # type: ignore[arg-type]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gpus_missing(facts: status.GPUNodeStatus) -> bool:
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        return True
    for gpu in gpus:  # a lost GPU: a cached one's slot read directly (`get` is a Python call per GPU)
        if (_LOST_FACT(gpu) if type(gpu) is gpu_facts.GPUFacts else _lost(gpu)) is True:
            return True
    return faults.missing_gpus(len(gpus), faults.seen_by_agent(facts)) is not None


def _lost(gpu: object) -> object:
    """A GPU entry's `lost` as `_gpus_missing` reads it: a mapping's value, else None."""
    return gpu.get("lost") if isinstance(gpu, gpu_facts.MAPPINGS) else None
