"""What the straggler cohorts keep between timer ticks (`cohorts`): each member's last look, each cohort's
scores and statistics.

Split from `cohorts` (one concern a module): there the tick that works only on what changed, here the
records it keeps and the small judgements about them (`judged_part`, `stale_due`); the store of every
policy's cohorts (`cohorts.Cohorts`) stays with the tick.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuhealth_api import heartbeats
from gpuhealth_operator.decisions import liveness, model, straggler_scores, straggler_stats

if TYPE_CHECKING:
    from gpuhealth_operator.state import cache

Key = tuple[str, str]
"""(policy, node)."""
Observer = Callable[[Key, datetime.datetime, model.StragglerScore], None]

"""Told (policy, node), the sample's time and the score judged on it, once per sample a window takes
(`Cohorts.observer`): how bench/straggler_quality.py sees what the operator saw, without
patching the functions it calls."""

_MARGIN = datetime.timedelta(seconds=1)
"""Staleness is judged on float seconds: its deadline is looked at this much early, then every tick."""


def heartbeat_seconds(gpunode: cache.GPUNodeRecord) -> float:
    agent: Mapping[str, Any] = gpunode.status.get("agent") or {}  # a scored node's facts have one
    return float(agent.get("heartbeatSeconds") or heartbeats.DEFAULT_HEARTBEAT_SECONDS)


def judged_part(score: model.StragglerScore | None) -> object:
    """What of a straggler score the verdict reads (`verdicts.straggler_signal`): whether there is
    one, whether it is flagged, and a flagged one's numbers (they are in the condition's message)."""
    if score is None:
        return None
    return score if score.flagged else False


@dataclasses.dataclass(slots=True, eq=False)
class Member:
    record: cache.GPUNodeRecord | None = None
    """The record its score was worked out from (a scored member's)."""
    group: straggler_scores.Cohort | None = None
    """The cohort it is scored in; None: no score (stale, idle, no cohort, a lost GPU)."""
    score: float = 0.0
    period: float = 0.0
    look_due: datetime.datetime | None = None
    """Staleness or the clock window may change at this instant (None: not by time alone)."""
    memo_due: datetime.datetime | None = None
    """The window's judgement may change after this instant."""
    due: datetime.datetime | None = None
    seq: int = -1
    """Its current entry in the deadline heap."""


@dataclasses.dataclass(slots=True, eq=False)
class Group:
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    ordered: straggler_stats.SortedScores = dataclasses.field(default_factory=straggler_stats.SortedScores)
    """`scores`' values, sorted."""
    judged: dict[str, model.StragglerScore] = dataclasses.field(default_factory=dict)
    """Each member's StragglerScore against the cohort, before its window."""
    stats: tuple[float, float, int] | None = None
    """(median, scale, peers) of `judged`."""
    changed: set[str] = dataclasses.field(default_factory=set)
    """Members that joined or whose score changed since `judged`."""


def stale_due(gpunode: cache.GPUNodeRecord, pod: liveness.AgentPod | None) -> datetime.datetime | None:
    """A moment before a fresh agent may turn stale by time alone (`signals.agent_is_stale`); None: never
    (no report time: its age stays 0)."""
    seen, limit = gpunode.report_seen_at, gpunode.stale_limit
    if seen is None or limit is None:
        return None if limit is None or limit >= 0 else datetime.datetime.min.replace(tzinfo=datetime.UTC)
    ends = [seen + datetime.timedelta(seconds=limit)]
    if pod is not None and not pod.ready:
        ends.append(max(seen, pod.since) + datetime.timedelta(seconds=liveness.NOT_READY_GRACE_SECONDS))
    return min(ends) - _MARGIN
