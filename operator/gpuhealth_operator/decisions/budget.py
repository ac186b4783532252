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
budgets queue waiting nodes in one order (`Ranks`): were each to
rank by its own rules, two budgets could each keep their last free place for a
different node, and neither node would ever be cordoned.

Admission never raises that count above the limit. Nodes the policy already
holds are always admitted (they hold budget already, and a drain in progress
must be allowed to finish or resume after a restart); so are wanting nodes
that are unschedulable for another reason, since acting on them takes nothing
more away. The rest queue by severity, then detection time, then name, so the
worst and oldest faults go first and the order is deterministic.

Topology budgets (`spec.topology.budgets`, issue 28) are more budgets of the
same kind (`domain_budgets`): one per value of each budget's label among the
policy's nodes, counting what the policy's budget counts, limited by
`policies.resolve_topology_budget`. A node is admitted only if every budget
that selects it admits it, domain budgets included; a node without the label
is in no domain of that key.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set

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
    return _first(name, queue, wanting, free)


@dataclasses.dataclass(frozen=True)
class Domain:
    """One domain of a topology budget: the policy's nodes whose label `entry.key` has `value`."""

    entry: model.TopologyBudget
    value: str

    def __str__(self) -> str:
        return f"{self.entry.key}={self.value}"


@dataclasses.dataclass(frozen=True)
class Budget:
    """One acting policy's budget, or one domain of a topology budget of it, from the caller's indexes."""

    policy: model.Policy
    selected: Set[str]
    """The GPU nodes the policy selects (of the domain, for a domain budget)."""
    unavailable: Set[str]
    """What `counted` returns for them, in-flight cordons included."""
    domain: Domain | None = None
    """None: the policy's `maxUnavailable`; else the domain of a topology budget this budget bounds."""

    @property
    def limit(self) -> int:
        """How many of `selected` may be unschedulable at once."""
        if self.domain is None:
            return policies.resolve_max_unavailable(self.policy, len(self.selected))
        return policies.resolve_topology_budget(self.domain.entry, len(self.selected))

    def describe(self) -> str:
        """In words: "maxUnavailable=2", or "topology budget example.com/rack=r1 (maxUnavailable=1)"."""
        if self.domain is None:
            return f"maxUnavailable={self.limit}"
        return f"topology budget {self.domain} (maxUnavailable={self.limit})"


def domain_budgets(
    policy: model.Policy,
    selected: Set[str],
    unavailable: Set[str],
    labels: Callable[[str], Mapping[str, str] | None],
) -> list[Budget]:
    """The policy's topology budgets, one `Budget` per domain, from its budget's own sets.

    `selected` and `unavailable` are the policy's (what `Budget` holds for its
    `maxUnavailable`), `labels` a node's current labels (None: unknown, in no
    domain). A node is in the domain of its label's value, whatever the value
    (an empty one too); a node without the label is in no domain of that key.
    A domain's percentage is of its selected nodes. Domains in label order, keys
    in the policy's order.
    """
    result: list[Budget] = []
    if not policy.topology.budgets:
        return result
    values = {name: labels(name) or {} for name in selected | unavailable}
    for entry in policy.topology.budgets:
        members: dict[str, tuple[set[str], set[str]]] = {}
        for name, node_labels in values.items():
            value = node_labels.get(entry.key)
            if value is None:
                continue
            domain_selected, domain_unavailable = members.setdefault(value, (set(), set()))
            if name in selected:
                domain_selected.add(name)
            if name in unavailable:
                domain_unavailable.add(name)
        result.extend(
            Budget(policy, frozenset(sel), frozenset(unav), Domain(entry, value))
            for value, (sel, unav) in sorted(members.items())
        )
    return result


def budgets_of(
    acting: Sequence[tuple[model.Policy, Set[str], Set[str]]],
    labels: Callable[[str], Mapping[str, str] | None],
    *,
    domains: bool = True,
) -> list[Budget]:
    """The budgets of the acting policies, from each one's (policy, selected, unavailable): its
    `maxUnavailable`, then (unless `domains` is False) its topology budgets' domains (`domain_budgets`)."""
    result: list[Budget] = []
    for policy, selected, unavailable in acting:
        own = Budget(policy, selected, unavailable)
        result.append(own)
        if domains:
            result.extend(domain_budgets(policy, own.selected, own.unavailable, labels))
    return result


def admission(
    name: str,
    acting: Sequence[tuple[model.Policy, Set[str], Set[str]]],
    labels: Callable[[str], Mapping[str, str] | None],
    wanting: Iterable[tuple[Mapping[str, Rank], Set[str]]],
) -> tuple[list[Budget], bool]:
    """The budget's whole answer to one admission, in one call: the acting policies' budgets
    (`budgets_of`) and whether they all admit `name` (`admits_all`, `wanting` being `Ranks`' parts)."""
    budgets = budgets_of(acting, labels)
    return budgets, admits_all(name, budgets, Ranks(wanting))


def at_budget(budgets: Iterable[Budget]) -> list[Budget]:
    """The domain budgets among `budgets` with no free place (unschedulable nodes reach the limit), in order:
    what a policy's status lists as at its budget (only those, so it stays short)."""
    return [b for b in budgets if b.domain is not None and len(b.unavailable) >= b.limit]


def busy_domain(name: str, budgets: Iterable[Budget], busy: Set[str]) -> Budget | None:
    """The first domain budget of `name` whose limit the `busy` nodes of the domain already reach, or None.

    For a step that is only ever taken on nodes holding a place (a repair runs on a node we cordoned):
    the places bound it already, except where a domain is over its budget (a cordoned node relabelled
    into it); then at most `limit` of the domain's nodes are busy at once all the same.
    """
    for b in budgets:
        if b.domain is not None and name in b.selected and len((busy & b.selected) - {name}) >= b.limit:
            return b
    return None


def admits_all(name: str, budgets: Sequence[Budget], wanting: Ranks) -> bool:
    """Whether every budget that selects `name` admits it; False if none selects it (see `refusing`)."""
    return any(name in b.selected for b in budgets) and not refusing(name, budgets, wanting)


def refusing(name: str, budgets: Sequence[Budget], wanting: Ranks) -> list[Budget]:
    """The budgets, of those that select `name`, that do not admit it now (in the given order).

    `budgets` are those of every acting (not dry-run) policy; `wanting` ranks
    every node any of them wants to cordon or drain, in one order for all
    (`Ranks`). A budget's queue holds every wanting node it selects,
    not only those its own rules want: a place it gives to one node is gone
    for the others. Nodes that another budget blocks outright (it selects them
    and has no free place) leave every queue while blocked, so a full pool
    policy does not make a fleet-wide one keep its place for a node that
    cannot be cordoned anyway. With one budget this is `admits`.
    """
    if name not in wanting:
        return [b for b in budgets if name in b.selected]
    free = [b.limit - len(b.unavailable) for b in budgets]
    full = [b for b, room in zip(budgets, free, strict=True) if room <= 0]

    def blocked(node: str) -> bool:
        return any(node in b.selected and node not in b.unavailable for b in full)

    refused = []
    for b, room in zip(budgets, free, strict=True):
        if name not in b.selected or name in b.unavailable:
            continue  # not this budget's node, or one it holds already
        if room <= 0:
            refused.append(b)
            continue
        queue = wanting.among(b.selected) - b.unavailable
        if len(queue) <= room:
            continue
        if not _first(name, queue, wanting, room, blocked if full else None):
            refused.append(b)
    return refused


def _first(
    name: str,
    queue: Set[str],
    wanting: Mapping[str, Rank],
    places: int,
    skip: Callable[[str], bool] | None = None,
) -> bool:
    """Whether `name` is among the first `places` of `queue` in queue order (nodes `skip` says aside).

    Counts those ahead instead of sorting: a pass, stopped once the places are gone.
    """
    mine = (_queue_key(wanting[name]), name)
    ahead = 0
    for node in queue:
        if node != name and (_queue_key(wanting[node]), node) < mine and (skip is None or not skip(node)):
            ahead += 1
            if ahead >= places:
                return False
    return True


class Ranks(Mapping[str, Rank]):
    """Per node, the most urgent rank any acting policy gives it: one queue order for all budgets.

    A policy's wish counts only for the nodes it selects now (a verdict judged
    before a node left the policy wants nothing of the others' budgets). A
    view over the policies' own indexes, built in O(policies) per admission:
    merging them into one dict would cost a pass over every wanting node.
    """

    def __init__(self, parts: Iterable[tuple[Mapping[str, Rank], Set[str]]]) -> None:
        self._parts = [(ranks, selected) for ranks, selected in parts if ranks]
        """(the policy's node → rank index, the nodes it selects), per acting policy."""

    def __getitem__(self, name: str) -> Rank:
        best: Rank | None = None
        for ranks, selected in self._parts:
            rank = ranks.get(name)
            if (
                rank is not None
                and name in selected
                and (best is None or _queue_key(rank) < _queue_key(best))
            ):
                best = rank
        if best is None:
            raise KeyError(name)
        return best

    def __contains__(self, name: object) -> bool:
        return any(name in ranks and name in selected for ranks, selected in self._parts)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for ranks, selected in self._parts:
            for name in ranks:
                if name in selected and name not in seen:
                    seen.add(name)
                    yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def among(self, nodes: Set[str]) -> set[str]:
        """The wanting nodes among `nodes` (a budget's selection): set operations, no pass over the fleet."""
        found: set[str] = set()
        for ranks, selected in self._parts:
            found |= (ranks.keys() & nodes) & selected
        return found


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
