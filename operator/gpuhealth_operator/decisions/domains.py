"""Topology domains: when a whole failure domain is degraded, and when it is no longer.

A policy's `spec.topology.domains[]` rule names a Node label (`key`); each
value of it among the policy's selected GPU nodes is a domain (an NVLink
clique, a rack, a zone). A node without the label belongs to no domain of
that key; an empty value is a domain of its own (as for topology budgets). A domain is degraded when at least
`threshold` of its selected nodes are Unhealthy; then every selected node of
it is marked (`wanted_marks`), healthy ones too: a job spread over an NVL72
clique breaks on its healthy nodes when enough of the others fail.

Setting is immediate: an Unhealthy node has already passed its rules'
`forSeconds`, so the domain's evidence is as sustained as the nodes'.
Clearing waits: a degraded domain clears only after it has been below the
threshold continuously for `recovery.healthyForSeconds` (the same hold a
recovered node waits before we uncordon it); a single sample at or over the
threshold restarts that clock (`recovering_since`), so a domain hovering
around its threshold keeps its marks instead of flapping (safety rule 5).

Missing data is neither fault nor cure (safety rule 4): an Unknown node (a
stale agent) never counts towards degrading a domain, and it does not count
as recovered either: a degraded domain starts its recovery clock only when
its Unhealthy and Unknown nodes together are below the threshold.

A percent threshold is of the domain's selected GPU nodes and rounds UP
(`threshold`): the domain degrades only once the stated fraction of it has
actually failed ("50%" of 7 nodes is 4), never on a rounding error, because
its action withdraws healthy nodes from scheduling. It is at least 1.

Only degraded domains are kept (`judge` returns them alone), so memory,
status and metrics grow with the domains in trouble, not with the fleet.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, times

Health = vocabulary.Health
Action = vocabulary.Action

DomainKey = tuple[str, str]
"""(label key, label value): one domain."""

_PERCENT: Final = re.compile(r"^(\d{1,3})%$")


@dataclasses.dataclass(frozen=True)
class Member:
    """A selected GPU node as domains see it: its labels and its health under the policy."""

    name: str
    labels: Mapping[str, str]
    health: Health


@dataclasses.dataclass(frozen=True)
class DomainState:
    """A degraded domain of one policy: what it counts now, since when, and whether it is recovering."""

    key: str
    value: str
    action: Action
    """The rule's action: Label, or Taint (the label and the taint)."""
    unhealthy: int
    """Selected nodes of the domain that are Unhealthy now."""
    unknown: int
    """Selected nodes of the domain whose health is Unknown now (they hold a degraded domain)."""
    nodes: int
    """Selected GPU nodes of the domain."""
    threshold: int
    """Unhealthy nodes at which the domain degrades (the rule's `unhealthy`, resolved)."""
    since: datetime.datetime
    """When the domain turned degraded."""
    recovering_since: datetime.datetime | None = None
    """Below the threshold (Unknown nodes included) continuously since; None while at or over it."""
    members: tuple[str, ...] = ()
    """The domain's selected nodes, sorted: the ones its action marks."""

    @property
    def domain(self) -> DomainKey:
        return (self.key, self.value)


def threshold(unhealthy: int | str, nodes: int) -> int:
    """How many Unhealthy nodes degrade a domain of `nodes` selected nodes: an int as it is, a percent
    of `nodes` rounded UP; at least 1 either way (an empty domain is never degraded: `judge`)."""
    if isinstance(unhealthy, int):
        return max(1, unhealthy)
    match = _PERCENT.match(unhealthy)
    if match is None:  # parse_policy lets only ints, digit strings and percents through
        return max(1, int(unhealthy)) if unhealthy.isdigit() else 1
    return max(1, math.ceil(max(0, nodes) * int(match.group(1)) / 100))


def domain_of(labels: Mapping[str, str], key: str) -> str | None:
    """The value naming the node's domain of `key`; None (no domain) without the label."""
    return labels.get(key)


def group(rule: model.TopologyDomain, members: Iterable[Member]) -> dict[str, list[Member]]:
    """The rule's domains: label value → its members (nodes without the label form none)."""
    domains: collections.defaultdict[str, list[Member]] = collections.defaultdict(list)
    for member in members:
        value = domain_of(member.labels, rule.key)
        if value is not None:
            domains[value].append(member)
    return dict(domains)


def judge(
    rules: Sequence[model.TopologyDomain],
    members: Sequence[Member],
    previous: Mapping[DomainKey, DomainState],
    clear_seconds: float,
    now: datetime.datetime,
) -> dict[DomainKey, DomainState]:
    """The policy's degraded domains at `now`, given those of the last judgement (`previous`).

    A domain not degraded before degrades when its Unhealthy nodes reach the
    threshold; a degraded one stays so until its Unhealthy and Unknown nodes
    together have been below the threshold for `clear_seconds`. A domain of
    a rule the policy no longer has, or with no selected node left, is
    dropped at once: there is nothing left to mark.
    """
    degraded: dict[DomainKey, DomainState] = {}
    for rule in rules:
        for value, nodes in group(rule, members).items():
            state = _judge_one(
                rule, value, nodes, previous.get((rule.key, value)), clear_seconds=clear_seconds, now=now
            )
            if state is not None:
                degraded[state.domain] = state
    return degraded


def _judge_one(
    rule: model.TopologyDomain,
    value: str,
    nodes: Sequence[Member],
    before: DomainState | None,
    *,
    clear_seconds: float,
    now: datetime.datetime,
) -> DomainState | None:
    unhealthy = sum(1 for m in nodes if m.health is Health.UNHEALTHY)
    unknown = sum(1 for m in nodes if m.health is Health.UNKNOWN)
    limit = threshold(rule.unhealthy, len(nodes))
    if before is None and unhealthy < limit:
        return None  # never degraded below its threshold
    if before is None or unhealthy + unknown >= limit:
        recovering = None  # at (or again at) the threshold, or it cannot tell: held
    else:
        recovering = before.recovering_since or now
        if times.seconds_between(recovering, now) >= clear_seconds:
            return None  # below the threshold for the whole hold: recovered
    return DomainState(
        key=rule.key,
        value=value,
        action=rule.action,
        unhealthy=unhealthy,
        unknown=unknown,
        nodes=len(nodes),
        threshold=limit,
        since=before.since if before is not None else now,
        recovering_since=recovering,
        members=tuple(sorted(m.name for m in nodes)),
    )


@dataclasses.dataclass(frozen=True)
class Transitions:
    """What changed between two judgements of a policy's domains."""

    degraded: tuple[DomainState, ...]
    """Domains degraded now that were not before (one DomainDegraded Event each)."""
    recovered: tuple[DomainState, ...]
    """Domains degraded before that are not now (their previous state)."""


def transitions(
    previous: Mapping[DomainKey, DomainState], current: Mapping[DomainKey, DomainState]
) -> Transitions:
    return Transitions(
        degraded=tuple(current[k] for k in sorted(current.keys() - previous.keys())),
        recovered=tuple(previous[k] for k in sorted(previous.keys() - current.keys())),
    )


@dataclasses.dataclass(frozen=True)
class Marks:
    """What a node should carry for its degraded domains."""

    label: bool = False
    """gpuhealth.io/domain-degraded=true."""
    taint: bool = False
    """The NoSchedule taint gpuhealth.io/domain-degraded (action Taint)."""

    def __or__(self, other: Marks) -> Marks:
        return Marks(label=self.label or other.label, taint=self.taint or other.taint)


NO_MARKS: Final = Marks()


def marks_for(action: Action) -> Marks:
    """Label: the label; Taint: the label and the taint (so `-l` finds tainted nodes too)."""
    return Marks(label=True, taint=action is Action.TAINT)


def wanted_marks(degraded: Iterable[Mapping[DomainKey, DomainState]]) -> dict[str, Marks]:
    """node → the marks the degraded domains of every acting policy want on it (their union): a node
    of a domain two policies degrade keeps its label until neither wants it."""
    wanted: dict[str, Marks] = {}
    for states in degraded:
        for state in states.values():
            marks = marks_for(state.action)
            for node in state.members:
                wanted[node] = wanted.get(node, NO_MARKS) | marks
    return wanted


def describe(state: DomainState) -> str:
    """The domain and its counts in words, as its Events and logs say them."""
    unknown = f", {state.unknown} Unknown" if state.unknown else ""
    return (
        f"{state.key}={state.value}: {state.unhealthy} of {state.nodes} selected nodes Unhealthy"
        f"{unknown} (threshold {state.threshold})"
    )


def to_status(states: Mapping[DomainKey, DomainState], limit: int) -> list[dict[str, object]]:
    """`status.topology.degraded[]`, sorted by key and value, at most `limit` items."""
    items: list[dict[str, object]] = []
    for _, state in sorted(states.items())[:limit]:
        item: dict[str, object] = {
            "key": state.key,
            "value": state.value,
            "action": state.action.value,
            "unhealthy": state.unhealthy,
            "nodes": state.nodes,
            "threshold": state.threshold,
            "since": times.render(state.since),
        }
        if state.recovering_since is not None:
            item["recoveringSince"] = times.render(state.recovering_since)
        items.append(item)
    return items


def from_status(items: object, rules: Sequence[model.TopologyDomain]) -> dict[DomainKey, DomainState]:
    """Degraded domains as a policy's status recorded them (an operator restart takes them up where they
    stood: the recovery clock goes on, no second DomainDegraded Event). Items that do not parse, or of
    a key the policy has no rule for, are dropped; the counts are judged again at the next pass."""
    actions = {rule.key: rule.action for rule in rules}
    restored: dict[DomainKey, DomainState] = {}
    if not isinstance(items, list | tuple):
        return restored
    for item in items:
        if not isinstance(item, Mapping):
            continue
        key, value, since = item.get("key"), item.get("value"), times.parse(item.get("since"))
        if not isinstance(key, str) or key not in actions or not isinstance(value, str):
            continue
        if since is None:
            continue
        restored[(key, value)] = DomainState(
            key=key,
            value=value,
            action=actions[key],
            unhealthy=_count(item.get("unhealthy")),
            unknown=0,
            nodes=_count(item.get("nodes")),
            threshold=_count(item.get("threshold")),
            since=since,
            recovering_since=times.parse(item.get("recoveringSince")),
        )
    return restored


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
