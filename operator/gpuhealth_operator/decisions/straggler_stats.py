"""A straggler cohort's statistics: its median and floored MAD, each member's robust z-score, and whether
that flags it (`stragglers`' docstring: Robust z-score, and a small cohort's fallback).

Split from `stragglers` (issue 46: one concern a module); `stragglers` keeps the window and the status.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final

from gpuhealth_operator.decisions import model, straggler_scores

MIN_PEERS: Final = 4
"""Peers for the robust statistics: a node is judged against its cohort's median and MAD."""
SMALL_COHORT_PEERS: Final = 2
"""Fewer busy peers than MIN_PEERS but at least this many: a small cohort (`stragglers`' docstring)."""
MAD_TO_SIGMA: Final = 0.6745
"""Φ⁻¹(0.75): makes MAD comparable to a standard deviation for normal data."""
MAD_FLOOR_FRACTION: Final = 0.015
MAD_FLOOR_ABSOLUTE: Final = 1e-3
"""Floor when the median itself is ~0 (a cohort of stalled nodes)."""


def judge_nodes(
    performance: Mapping[str, straggler_scores.Performance], threshold: float
) -> dict[str, model.StragglerScore]:
    """A StragglerScore for every node with a score, keyed by node name: each node's `performance`
    (its facts' cohort and score, `performance_of`) judged against its cohort's. The caller leaves out
    the nodes whose numbers are old (a stale agent, `signals.agent_is_stale`)."""
    cohorts: dict[straggler_scores.Cohort, dict[str, float]] = defaultdict(dict)
    for name, (key, score) in performance.items():
        if key is not None and score is not None:
            cohorts[key][name] = score
    result: dict[str, model.StragglerScore] = {}
    for scores in cohorts.values():
        result.update(_judge_cohort(scores, threshold))
    return result


def _judge_cohort(scores: Mapping[str, float], threshold: float) -> dict[str, model.StragglerScore]:
    median, scale = cohort_scale(list(scores.values()))
    peers = len(scores) - 1
    slowest = slowest_peers(scores)
    return {name: judge(s, median, scale, peers, threshold, slowest.get(name)) for name, s in scores.items()}


def judged_peers(peers: int) -> bool:
    """Whether a node with this many busy peers can be flagged at all (a small cohort's fallback included)."""
    return peers >= SMALL_COHORT_PEERS


def slowest_peers(scores: Mapping[str, float]) -> dict[str, float]:
    """For a small cohort (`stragglers`' docstring), each member's slowest peer's score, else empty."""
    if not SMALL_COHORT_PEERS <= len(scores) - 1 < MIN_PEERS:
        return {}
    ordered = sorted(scores.items(), key=lambda item: item[1])
    lowest, second = ordered[0], ordered[1]
    return {name: second[1] if name == lowest[0] else lowest[1] for name in scores}


def cohort_scale(values: Sequence[float]) -> tuple[float, float]:
    """The cohort's median score and its z-scores' scale: the MAD, floored (`stragglers`' docstring)."""
    median = statistics.median(values)
    return median, floored(median, statistics.median(abs(v - median) for v in values))


def floored(median: float, mad: float) -> float:
    """The z-scores' scale: the cohort's MAD, at least MAD_FLOOR_FRACTION of its median."""
    return max(mad, MAD_FLOOR_FRACTION * abs(median), MAD_FLOOR_ABSOLUTE)


class SortedScores:
    """A cohort's scores kept sorted, for its median and MAD after one member's score changed.

    `cohort_scale` sorts every score and every distance from the median again: at 5,000 members
    on every tick a member reports, that is most of the scoring's time. Here a score moves in or out
    by bisection, and `median_and_mad` picks the middle of the distances from the two runs either
    side of the median (each sorted by distance), so both are the very numbers `statistics.median`
    gives: the same elements, and for an even count the same `(a + b) / 2`. Only for finite,
    non-zero scores (a zero's sign or a NaN would make "the same element" ambiguous): `exact` says
    whether they all are, else the caller sorts (`cohort_scale`).
    """

    __slots__ = ("_odd", "values")

    def __init__(self) -> None:
        self.values: list[float] = []
        """The finite, non-zero scores, sorted."""
        self._odd = 0
        """How many scores are zero, NaN or infinite (not in `values`)."""

    @property
    def exact(self) -> bool:
        return not self._odd

    def add(self, value: float) -> None:
        if _plain(value):
            bisect.insort(self.values, value)
        else:
            self._odd += 1

    def remove(self, value: float) -> None:
        if _plain(value):
            del self.values[bisect.bisect_left(self.values, value)]
        else:
            self._odd -= 1

    def median_and_mad(self) -> tuple[float, float]:
        """`statistics.median` of the values, and of their distances from it (`exact` values only)."""
        values = self.values
        n = len(values)
        median = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
        split = bisect.bisect_left(values, median)  # below: values[split - 1 - j]; from: values[split + j]

        def below(j: int) -> float:
            return abs(values[split - 1 - j] - median)

        def above(j: int) -> float:
            return abs(values[split + j] - median)

        def smallest(k: int) -> float:
            """The k-th smallest distance (from 0): i of them below the median, k + 1 - i from it up."""
            lo, hi = max(0, k + 1 - (n - split)), min(k + 1, split)
            while lo < hi:  # the fewest taken below such that the next one below is not smaller
                i = (lo + hi) // 2
                if below(i) < above(k - i):
                    lo = i + 1
                else:
                    hi = i
            i = lo
            taken = [below(i - 1)] if i > 0 else []
            taken += [above(k - i)] if k - i >= 0 else []
            return max(taken)

        if n % 2:
            return median, smallest(n // 2)
        return median, (smallest(n // 2 - 1) + smallest(n // 2)) / 2


def _plain(value: float) -> bool:
    return value != 0.0 and math.isfinite(value)


def judge(  # noqa: PLR0917 - one member's inputs
    score: float,
    median: float,
    scale: float,
    peers: int,
    threshold: float,
    slowest_peer: float | None = None,
) -> model.StragglerScore:
    """One cohort member's StragglerScore, given its cohort's `cohort_scale` and its peers' count; in a
    small cohort, `slowest_peer` (`slowest_peers`) is what it is judged against."""
    z = _z(score, median, scale, peers, slowest_peer)
    return model.StragglerScore(
        # Rounded so that sensor noise does not rewrite every cohort member's status.
        score=round(score, 3),
        z_score=round(z, 1),
        peers=peers,
        flagged=_flags(z, peers, threshold, slowest_peer),
    )


def _z(score: float, median: float, scale: float, peers: int, slowest_peer: float | None) -> float:
    against = median if peers >= MIN_PEERS or slowest_peer is None else slowest_peer
    return MAD_TO_SIGMA * (score - against) / scale


def _flags(z: float, peers: int, threshold: float, slowest_peer: float | None) -> bool:
    if peers >= MIN_PEERS:
        return z < -threshold
    return judged_peers(peers) and slowest_peer is not None and z < -threshold


def rejudged(  # noqa: PLR0917 - `judge`'s inputs for a whole cohort
    scores: Mapping[str, float],
    median: float,
    scale: float,
    peers: int,
    threshold: float,
    known: Mapping[str, model.StragglerScore],
) -> dict[str, model.StragglerScore]:
    """`judge` of each of `scores`' members whose StragglerScore is not the one `known` holds for it (to
    the sign of a zero): after the cohort's statistics moved, most members' rounded numbers did not. A
    small cohort's members are judged against each other (`slowest_peers`): `scores` is then the whole
    cohort."""
    changed = {}
    slowest = slowest_peers(scores) if peers < MIN_PEERS else {}
    for name, score in scores.items():
        z = _z(score, median, scale, peers, slowest.get(name))  # `judge`'s
        old = known.get(name)
        if (
            old is None
            or old.peers != peers
            or old.flagged != _flags(z, peers, threshold, slowest.get(name))
            or not same(old.z_score, round(z, 1))
            or not same(old.score, round(score, 3))
            or old.since is not None
        ):
            changed[name] = judge(score, median, scale, peers, threshold, slowest.get(name))
    return changed


def same(a: float, b: float) -> bool:
    """`a` and `b` are the same number, a zero's sign included (`-0.0 == 0.0`, but one is written "-0.0")."""
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))
