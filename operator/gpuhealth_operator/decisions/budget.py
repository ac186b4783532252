"""The disruption budget: which nodes a policy may cordon now, and who waits.

A policy may hold at most `maxUnavailable` of its selected GPU nodes (nodes
with a GPUNode, `policies.selects_gpu_node`) unschedulable
(`policies.resolve_max_unavailable`). Every selected node that
is already unschedulable counts, whoever cordoned it: the budget protects
capacity, and a node a human cordoned is capacity gone all the same. So do
nodes this policy has annotated as cordoned by it, and nodes the I/O layer has
just cordoned but whose watch event has not arrived (`in_flight`).

Policies overlap: a node several acting policies select is cordoned only if
every one of them admits it (`admits_all`), and then counts once in each. All
budgets queue waiting nodes in one order (`merged_wanting`): were each to
rank by its own rules, two budgets could each keep their last free place for a
different node, and neither node would ever be cordoned.

Admission never raises that count above the limit. Nodes the policy already
holds are always admitted (they hold budget already, and a drain in progress
must be allowed to finish or resume after a restart); so are wanting nodes
that are unschedulable for another reason, since acting on them takes nothing
more away. The rest queue by severity, then detection time, then name, so the
worst and oldest faults go first and the order is deterministic.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence, Set

from gpuhealth_operator.decisions import model, policies

_NEVER: datetime.datetime = datetime.datetime.max.replace(tzinfo=datetime.UTC)

Rank = tuple[int, datetime.datetime | None]
"""A waiting node's place in the queue: the severity rank of its worst disruptive condition, and when
it was detected (None: after every known time)."""


def plan(
    policy: model.Policy,
    selected: Sequence[model.NodeView],
    wanting: Sequence[tuple[str, int, datetime.datetime | None]],
    in_flight: frozenset[str] = frozenset(),
) -> model.BudgetPlan:
    """Admit and queue the nodes in `wanting` (node, severity rank, detected_at) that want Cordon/Drain.

    `detected_at` is an aware datetime (or None: queued after every known time).
    Nodes in `wanting` that the policy does not select are neither admitted nor queued.
    """
    limit = policies.resolve_max_unavailable(policy, len(selected))
    names = {n.name for n in selected}
    unavailable = counted(policy, selected, in_flight)
    best: dict[str, tuple[int, datetime.datetime]] = {}
    for name, rank, detected_at in wanting:
        if name not in names:
            continue
        key = _queue_key((rank, detected_at))
        best[name] = min(best.get(name, key), key)
    admitted = {name for name in best if name in unavailable}
    queue = sorted((key, name) for name, key in best.items() if name not in unavailable)
    free = max(0, limit - len(unavailable))
    admitted.update(name for _, name in queue[:free])
    return model.BudgetPlan(
        admitted=frozenset(admitted), pending=tuple(name for _, name in queue[free:]), limit=limit
    )


def admits(
    policy: model.Policy,
    name: str,
    selected: Set[str],
    unavailable: Set[str],
    wanting: Mapping[str, Rank],
) -> bool:
    """Whether `plan` admits `name`, answered from indexes the caller keeps current.

    `selected` are the names the policy selects, `unavailable` the names `counted`
    returns (in-flight nodes included), `wanting` the rank of every node whose
    verdict wants Cordon or Drain. The answer equals `name in plan(...).admitted`
    (a property test holds the two together), but costs set operations instead
    of a pass over the fleet: in a burst of N faults, N admissions would
    otherwise cost O(N²).
    """
    if name not in selected or name not in wanting:
        return False
    if name in unavailable:
        return True
    free = policies.resolve_max_unavailable(policy, len(selected)) - len(unavailable)
    if free <= 0:
        return False
    queue = (wanting.keys() & selected) - unavailable
    if len(queue) <= free:
        return True
    ranked = sorted((_queue_key(wanting[n]), n) for n in queue)
    return any(n == name for _, n in ranked[:free])


@dataclasses.dataclass(frozen=True)
class Budget:
    """One acting policy's budget, from the indexes the caller keeps current."""

    policy: model.Policy
    selected: Set[str]
    """The GPU nodes the policy selects."""
    unavailable: Set[str]
    """What `counted` returns for them, in-flight cordons included."""


def admits_all(name: str, budgets: Sequence[Budget], wanting: Mapping[str, Rank]) -> bool:
    """Whether every budget that selects `name` admits it; False if none selects it (see `refusing`)."""
    return any(name in b.selected for b in budgets) and not refusing(name, budgets, wanting)


def refusing(name: str, budgets: Sequence[Budget], wanting: Mapping[str, Rank]) -> list[Budget]:
    """The budgets, of those that select `name`, that do not admit it now (in the given order).

    `budgets` are those of every acting (not dry-run) policy; `wanting` ranks
    every node any of them wants to cordon or drain, in one order for all
    (`merged_wanting`). A budget's queue holds every wanting node it selects,
    not only those its own rules want: a place it gives to one node is gone
    for the others. Nodes that another budget blocks outright (it selects them
    and has no free place) leave every queue while blocked, so a full pool
    policy does not make a fleet-wide one keep its place for a node that
    cannot be cordoned anyway. With one budget this is `admits`.
    """
    if name not in wanting:
        return [b for b in budgets if name in b.selected]
    free = [policies.resolve_max_unavailable(b.policy, len(b.selected)) - len(b.unavailable) for b in budgets]

    def blocked(node: str) -> bool:
        return any(
            room <= 0 and node in b.selected and node not in b.unavailable
            for b, room in zip(budgets, free, strict=True)
        )

    refused = []
    for b, room in zip(budgets, free, strict=True):
        if name not in b.selected or name in b.unavailable:
            continue  # not this budget's node, or one it holds already
        if room <= 0:
            refused.append(b)
            continue
        queue = (wanting.keys() & b.selected) - b.unavailable
        if len(queue) <= room:
            continue
        ranked = sorted((_queue_key(wanting[n]), n) for n in queue if n == name or not blocked(n))
        if all(n != name for _, n in ranked[:room]):
            refused.append(b)
    return refused


def merged_wanting(wanting: Iterable[Mapping[str, Rank]]) -> dict[str, Rank]:
    """Per node, the most urgent rank any of the given policies gives it (one queue order for all budgets)."""
    merged: dict[str, Rank] = {}
    for ranks in wanting:
        for name, rank in ranks.items():
            if name not in merged or _queue_key(rank) < _queue_key(merged[name]):
                merged[name] = rank
    return merged


def counted(
    policy: model.Policy, selected: Sequence[model.NodeView], in_flight: frozenset[str] = frozenset()
) -> frozenset[str]:
    """Selected nodes that count against the policy's budget right now."""
    names = {n.name for n in selected}
    return frozenset({n.name for n in selected if holds(policy, n)} | (in_flight & names))


def holds(policy: model.Policy, node: model.NodeView) -> bool:
    """Whether a selected node takes up the policy's budget: unschedulable, or annotated as ours."""
    return node.unschedulable or node.cordoned_by == policy.name


def holders_text(policy: model.Policy, holders: Sequence[model.NodeView], shown: int = 5) -> str:
    """Who takes up the budget, in words: "n9 (cordoned outside gpu-health), n3 (cordoned by this policy)".

    The nodes that are there not because of this policy are the ones an
    operator can act on (uncordon, exclude), so they are named first.
    """

    def holder(node: model.NodeView) -> tuple[bool, str, str]:
        """(held by this policy, name, why in words): the sort key and the text in one."""
        if not node.unschedulable:
            return True, node.name, "being cordoned"  # admitted, its cordon not yet seen
        if node.cordoned_by == policy.name:
            return True, node.name, "cordoned by this policy"
        if node.cordoned_by:
            return False, node.name, f"cordoned by policy {node.cordoned_by}"
        return False, node.name, "cordoned outside gpu-health"

    ordered = sorted(holder(n) for n in holders)
    words = [f"{name} ({text})" for _, name, text in ordered[:shown]]
    if len(ordered) > shown:
        words.append(f"and {len(ordered) - shown} more")
    return ", ".join(words)


def _queue_key(rank: Rank) -> tuple[int, datetime.datetime]:
    return rank[0], rank[1] or _NEVER
