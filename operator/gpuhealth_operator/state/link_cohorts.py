"""The NVLinks the fleet's GPUs have up, by cohort: what a GPU's links should be, read from the cluster.

Issue 45, item 7. NvLinkDegraded compared a GPU's links up against the most this process had seen on
it (`trends`): after a restart or a leader change a link still down was judged healthy (its taint
lifted after healthyForSeconds), and a node that joined with a link down was never flagged. A GPU's
expectation is now also what its cohort reports: the GPUs of the same model with the same number of
links (`trends.link_cohort`), on this node and the others, counted here from every cached GPUNode, so
a restarted operator knows it as soon as it has listed the fleet. The expectation is the count most of
the cohort's GPUs have up (`trends.expected_links`): one degraded node, or one board, does not set it.

The index is the cache's (`cache.ClusterCache.links`), kept as GPUNodes are stored and removed; a
cohort costs a small Counter, the fleet a few of them.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Mapping
from typing import Final

from gpuhealth_operator.decisions import gpu_facts, trends

Cohort = trends.LinkCohort

_NONE: Final[tuple[tuple[Cohort, int], ...]] = ()


def _members(gpus: object) -> tuple[tuple[Cohort, int], ...]:
    """(cohort, links up) of each reported GPU with NVLink facts."""
    if not isinstance(gpus, list):
        return _NONE
    found = []
    for gpu in gpus:
        if isinstance(gpu, gpu_facts.MAPPINGS):
            member = trends.link_member(gpu)
            if member is not None:
                found.append(member)
    return tuple(found)


def _member(gpu: object) -> tuple[Cohort, int] | None:
    return trends.link_member(gpu) if isinstance(gpu, gpu_facts.MAPPINGS) else None


def _same_members(old: object, new: object) -> bool:
    """Whether two reports' GPUs, place by place, have the same cohorts and links up (so `_members` of
    each are equal), looking only at the GPUs that are other objects: most of a report's are the last
    one's, kept by the cache (`compaction`); False when unsure (then `_members` are compared)."""
    if type(old) is not list or type(new) is not list or len(old) != len(new):
        return False
    return all(_same_member(was, gpu) for was, gpu in zip(old, new, strict=True) if was is not gpu)


def _same_member(was: object, gpu: object) -> bool:
    """`_member(was) == _member(gpu)`. Two cached GPUs holding the very same `nvlink` and `model` objects
    have the same member without asking (`trends.link_member` reads only those): a report moves a GPU's
    clocks and temperature, and the cache keeps an unchanged nvlink part as the last report's object."""
    if type(was) is gpu_facts.GPUFacts and type(gpu) is gpu_facts.GPUFacts:
        nvlink, model = _LINK_FACTS(was)
        now_nvlink, now_model = _LINK_FACTS(gpu)
        if nvlink is now_nvlink and model is now_model:
            return True
    return _member(was) == _member(gpu)


_LINK_FACTS: Final = operator.attrgetter("nvlink", "model")
"""What `trends.link_member` reads of a GPU, in one C call."""


class LinkCohorts:
    """Per cohort, how many of the fleet's GPUs report each count of links up."""

    def __init__(self) -> None:
        self._counts: dict[Cohort, collections.Counter[int]] = {}
        self._expected: dict[Cohort, int] = {}
        self.expected: Mapping[Cohort, int] = self._expected
        """Cohort → the links up its GPUs should have (`trends.expected_links`); kept current."""

    def replace(self, old: object, new: object) -> None:
        """A GPUNode's `status.gpus` went from `old` to `new` (None: it was not there / is gone)."""
        if old is new or _same_members(old, new):
            return
        before, after = _members(old), _members(new)
        if before == after:
            return
        touched: set[Cohort] = set()
        for cohort, up in before:
            counts = self._counts.get(cohort)
            if counts is not None:
                counts[up] -= 1
                if counts[up] <= 0:
                    del counts[up]
                touched.add(cohort)
        for cohort, up in after:
            self._counts.setdefault(cohort, collections.Counter())[up] += 1
            touched.add(cohort)
        for cohort in touched:
            counts = self._counts.get(cohort)
            if not counts:
                self._counts.pop(cohort, None)  # its last GPU went: nothing kept
            expected = trends.expected_links(counts) if counts else None
            if expected is None:
                self._expected.pop(cohort, None)
            else:
                self._expected[cohort] = expected
