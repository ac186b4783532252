"""Whether a new report of healthy GPUs keeps the last report's signals without judging them again
(`still_healthy`): a healthy GPU's report moves its clocks, temperature and utilization, not its faults.

Split from `signals` (issue 46: one concern a module); `signals` judges the facts afresh.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Final, cast

from gpuhealth_api import conditions, faults, status, vocabulary
from gpuhealth_operator.decisions import gpu_facts, signals, trends

Condition = vocabulary.Condition
GPUFault = faults.GPUFault
FactSignals = signals.FactSignals

_MOVING: Final = {
    condition: check
    for condition, check in conditions.gpu_checks(frozenset()).items()
    if conditions.BY_CONDITION[condition].moving
}
"""The per-GPU predicates that read fields moving with every sample (temperature, utilization: their rows'
`moving`); none of them reads a trend or the policy's XIDs."""
_MOVING_CHECKS: Final = tuple(_MOVING.values())
_STEADY_FIELDS: Final = tuple(
    sorted(
        set().union(*(fields for condition, fields in conditions.READS.items() if condition not in _MOVING))
        | {"unreadable"}
    )
)
_STEADY: Final = operator.attrgetter(*_STEADY_FIELDS)
"""The fields every other predicate reads (`conditions.READS`), and which facts the agent cannot read,
read from cached GPU facts in one C call."""
_READ_BY: Final = tuple(
    frozenset(condition for condition, fields in conditions.READS.items() if field in fields)
    for field in _STEADY_FIELDS
)
"""Per field of `_STEADY_FIELDS`, the conditions whose predicate reads it."""
_ALWAYS_ASKED: Final = frozenset(_MOVING)
"""Asked of every GPU whose other fields moved: their fields move with every sample."""


def still_healthy(
    judged: FactSignals,
    older: status.GPUNodeStatus,
    newer: status.GPUNodeStatus,
    memory: trends.Trends | None = None,
) -> bool:
    """Whether `newer` facts get the signals `judged` of `older`, all healthy, without judging them again.

    A healthy GPU's report moves its clocks, temperature and utilization, not its faults: when each
    GPU holds what `older`'s did in every field a predicate reads (`conditions.READS`) but those that
    move, and the predicates that read those find nothing, every answer is older's (and a healthy
    signal's message is fixed). For the GPUs a cache keeps (`gpu_facts.GPUFacts`) only.

    With `memory` (what is remembered up to `newer`, `trends.advance`), a GPU whose other fields moved
    too (a counter creeping below its rule's rate, as most of a real fleet's do: issue 52) keeps them if
    every predicate that reads a field that moved, under every key judged, finds nothing in it
    (`_healthy_under`).
    """
    if not judged or any(s.present is not False for signals in judged.values() for s in signals.values()):
        return False
    gpus, before = newer.get("gpus"), older.get("gpus")
    if not isinstance(gpus, list) or not isinstance(before, list) or len(gpus) != len(before):
        return False
    if faults.seen_by_agent(newer) != faults.seen_by_agent(older):
        return False  # the GPUs the node should have (GPULost)
    if newer.get("nics") != older.get("nics"):
        return False  # NicDegraded
    checks: _Checks | None = None  # per key judged, each predicate bound once a GPU asks it
    for gpu, was in zip(gpus, before, strict=True):
        if gpu is was:
            continue
        if type(gpu) is not type(was) or type(was) is not gpu_facts.GPUFacts:
            return False
        steady, steady_was = _STEADY(gpu), _STEADY(was)
        if steady != steady_was:
            if memory is None:
                return False
            if checks is None:
                checks = _Checks(judged, memory)
            if not _healthy_under(checks, gpu, was, _asked(gpu, was, steady, steady_was)):
                return False
            continue
        for check in _MOVING_CHECKS:
            if check(gpu) is not None:
                return False
    return True


def _asked(
    gpu: Mapping[str, object],
    was: Mapping[str, object],
    steady: tuple[object, ...],
    steady_was: tuple[object, ...],
) -> AbstractSet[Condition]:
    """The per-GPU conditions to ask again of `gpu`, whose `_STEADY` fields are `steady` (`was`'s:
    `steady_was`): those whose predicate reads a field that moved or moves with every sample; all of
    them when it is another GPU (`trends.gpu_key`), whose memory is another's."""
    if trends.gpu_key(gpu) != trends.gpu_key(was):  # type: ignore[arg-type]
        return _EVERY_CHECK
    asked = set(_ALWAYS_ASKED)
    for field, (now, then) in enumerate(zip(steady, steady_was, strict=True)):
        if now is not then and now != then:
            asked |= _READ_BY[field]
    return asked


_EVERY_CHECK: Final = frozenset(conditions.gpu_checks(frozenset()))


class _Checks:
    """The per-GPU predicates under each key judged (its XIDs and trend thresholds, with the memory),
    each bound when first asked: a GPU whose counter crept is asked two or three of a dozen."""

    def __init__(self, judged: FactSignals, memory: trends.Trends) -> None:
        self.keys = [(rule_xids, dict(thresholds)) for rule_xids, _, thresholds, _ in judged]
        self.history = memory.gpu
        self.bound: dict[Condition, list[GPUFault]] = {}

    def under_every_key(self, condition: Condition) -> list[GPUFault]:
        bound = self.bound.get(condition)
        if bound is None:
            bound = self.bound[condition] = [
                conditions.gpu_check(condition, rule_xids, thresholds, self.history)
                for rule_xids, thresholds in self.keys
            ]
        return bound


def _healthy_under(
    checks: _Checks,
    gpu: status.GPUStatus,
    was: Mapping[str, object],
    asked: AbstractSet[Condition],
) -> bool:
    """Whether every predicate of `asked`, under each key judged (`checks`: its XIDs and trend thresholds
    with the memory up to `gpu`), finds nothing in `gpu`, which `was` (its version in the report judged)
    shares every link fact with.

    The predicates not asked read only fields that are `was`'s: each found nothing in them under every
    key and finds nothing now, since what it reads of the memory for them cannot have grown (a counter
    that stays put grows no faster as its window slides on, its peak stays the most it was) — the
    argument `still_healthy` makes for a GPU whose steady fields all stayed.

    The memory is asked without the fleet's link cohorts (`trends.with_cohorts`): they only raise the
    links up NvLinkDegraded expects (`trends.Expected`), so a GPU found healthy with them in `was` (whose
    links up, links down and so the links seen and the cohort's key are `gpu`'s) is healthy with them now
    iff its counters grow slowly enough, which the predicates judge alike with or without them. The
    facts the agent cannot read are `was`'s: none, its signals being all False.
    """
    if gpu.get("unreadable") != was.get("unreadable") or _links(gpu) != _links(was):
        return False
    for condition in asked:
        for check in checks.under_every_key(condition):
            if check(gpu) is not None:
                return False
    return True


def _links(gpu: Mapping[str, object]) -> tuple[object, object, object] | None:
    nvlink = gpu.get("nvlink")
    if not faults.is_mapping(nvlink):
        return None if nvlink is None else (nvlink, None, None)
    links = cast("Mapping[str, object]", nvlink)
    return links.get("linksUp"), links.get("linksDown"), gpu.get("model")
