"""The disruption budget at run time: which node may be cordoned now, and who was told to wait.

`decisions.budget` decides from plain sets; this module keeps, while the
operator runs, what those sets cannot see: the one lock under which every
admission is decided (so concurrent reconciles, of any policy, decide one at
a time), the nodes admitted whose cordon is not yet in the cache ("in
flight"), and the waiting nodes already told so (DisruptionBudgetExceeded is
said once per wait).

A node is admitted only if the budget of every acting policy that selects it
admits it (`budget.admits_all`); an in-flight node counts in each of them.
Then each of those policies' fleet circuit breakers is asked too (`breakers`):
in a fault storm a breaker holds every new disruption back, whatever the budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Callable, Mapping, MutableMapping, Sequence, Set

from gpuhealth_operator.decisions import budget, isolation, model
from gpuhealth_operator.state import breakers, cache


@dataclasses.dataclass
class Admission:
    """The budget's memory; every collection is changed in place (kopf shares the memo by shallow copy)."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    """One budget decision at a time across all policies, so overlapping budgets are never both spent."""

    in_flight: set[str] = dataclasses.field(default_factory=set)
    """Nodes admitted whose cordon is not yet in the cache; each counts in every policy that selects it."""

    notified: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(policy, node) already told DisruptionBudgetExceeded while it waits."""

    breakers: breakers.Breakers = dataclasses.field(default_factory=breakers.Breakers)
    """Each policy's fleet circuit breaker (the Context's own, set by it)."""

    turned: Mapping[str, MutableMapping[str, datetime.datetime]] = dataclasses.field(default_factory=dict)
    """policy → node → when it turned Unhealthy (the Context's verdict index, set by it)."""

    def holders(self, policy: model.Policy, selection: cache.Selection) -> set[str]:
        """Selected nodes that take up the budget, those admitted but not yet seen cordoned included."""
        return selection.unavailable | (self.in_flight & selection.selected)

    async def admit(
        self,
        policy: model.Policy,
        name: str,
        nodes: cache.ClusterCache,
        wanting: Mapping[str, Mapping[str, budget.Rank]],
        now: datetime.datetime,
    ) -> bool:
        """Ask every acting policy that selects the node (`policy` first); if all admit it, it is in flight
        until `release`. `wanting` is policy → node → rank for the nodes each policy wants to cordon or drain.
        """
        async with self.lock:
            acting = self._acting(policy, name, nodes)
            if not acting:
                return False
            budgets, admitted = budget.admission(
                name, self._parts(acting), _labels(nodes), self._ranks(nodes, wanting, acting)
            )
            if not admitted:
                return False
            if not self._breakers_admit(name, budgets, now):
                return False
            self.in_flight.add(name)
            return True

    def _breakers_admit(self, name: str, budgets: list[budget.Budget], now: datetime.datetime) -> bool:
        """Every selecting policy's breaker, stepped to now, lets the disruption start (`Breakers.admit`,
        one call for all of them: each is decided before any is changed)."""
        selecting = [b for b in budgets if b.domain is None and name in b.selected]  # one per policy
        asked = [(b.policy, len(b.selected), self._turned(b.policy.name)) for b in selecting]
        return self.breakers.admit(name, asked, now)

    async def admit_gpus(  # noqa: PLR0917 - the budgets come from the rules the caller listed
        self,
        policy: model.Policy,
        name: str,
        nodes: cache.ClusterCache,
        gpu_budgets: Sequence[isolation.GPUBudget],
        wanted: int,
        now: datetime.datetime,
    ) -> tuple[int, str | None]:
        """How many of `wanted` new GPU isolations on the node may start now, and why fewer: the one GPU
        budget over every isolating policy that selects it, then every selecting policy's breaker, as
        for a cordon (an isolation is a disruption). Under the one lock; nothing is held after it
        (the caller creates the rules before it lists them again, under its own isolation lock).
        Topology budgets do not apply: they count unschedulable nodes, and an isolation leaves its node
        schedulable (a fallback to Cordon/Drain goes through `admit`, and so through them)."""
        async with self.lock:
            left, short = isolation.budget_left(name, gpu_budgets)
            granted = min(wanted, left)
            if granted <= 0:
                return 0, short
            budgets = budget.budgets_of(
                self._parts(self._acting(policy, name, nodes)), _labels(nodes), domains=False
            )
            if not budgets or not self._breakers_admit(name, budgets, now):
                for b in budgets:
                    paused = self.breakers.paused(b.policy.name)
                    if name in b.selected and paused is not None:
                        whose = "" if b.policy.name == policy.name else f"policy {b.policy.name}: "
                        return 0, f"{whose}its fleet circuit breaker is {paused.state.value}: {paused.reason}"
                return 0, "no acting policy admits a disruption of the node"
            return granted, None

    def _turned(self, policy: str) -> MutableMapping[str, datetime.datetime]:
        turned = self.turned.get(policy)
        return turned if turned is not None else {}

    def release(self, policy: model.Policy, name: str) -> None:
        """The admitted node's cordon is in the cache (or was not made): it is no longer in flight."""
        self.in_flight.discard(name)

    def waiting(self, policy: str, name: str) -> bool:
        return (policy, name) in self.notified

    def start_waiting(self, policy: str, name: str) -> bool:
        """Note that the node waits; True the first time in this wait (time to say so)."""
        if (policy, name) in self.notified:
            return False
        self.notified.add((policy, name))
        return True

    def stop_waiting(self, policy: str, name: str) -> None:
        self.notified.discard((policy, name))

    def wait_reason(
        self,
        policy: model.Policy,
        name: str,
        nodes: cache.ClusterCache,
        wanting: Mapping[str, Mapping[str, budget.Rank]],
    ) -> str:
        """Why the node waits, naming the policy whose budget is short and the nodes that hold it."""
        acting = self._acting(policy, name, nodes)
        budgets = budget.budgets_of(self._parts(acting), _labels(nodes))
        refusing = budget.refusing(name, budgets, budget.Ranks(self._ranks(nodes, wanting, acting)))
        if not refusing:
            for b in budgets:
                paused = self.breakers.paused(b.policy.name)
                if name in b.selected and paused is not None and paused.trial != name:
                    whose = "" if b.policy.name == policy.name else f"policy {b.policy.name}: "
                    return f"{whose}its fleet circuit breaker is {paused.state.value}: {paused.reason}"
            return "the budget has no place for it"
        first = refusing[0]
        whose = (
            "" if first.policy.name == policy.name else f"policy {first.policy.name}, which also selects it: "
        )
        if first.domain is not None:
            whose += f"topology budget {first.domain}: "
        limit = first.limit
        holders = sorted(first.unavailable)
        words = "selected GPU nodes" if first.domain is None else "selected GPU nodes in the domain"
        if len(holders) >= limit:
            views = [record.view for n in holders if (record := nodes.node(n)) is not None]
            return (
                f"{whose}{len(holders)} of its {len(first.selected)} {words} are already "
                f"unschedulable (maxUnavailable={limit}): {budget.holders_text(first.policy, views)}"
            )
        free = limit - len(holders)
        return (
            f"{whose}the {free} free place(s) under maxUnavailable={limit} go to worse or older faults first"
        )

    def _acting(
        self, policy: model.Policy, name: str, nodes: cache.ClusterCache
    ) -> list[tuple[model.Policy, cache.Selection]]:
        """Every acting policy with its selection, the asking policy first; none if it does not select the
        node. Each selection is asked of the cache once per admission (the budgets and the ranks share it)."""
        asking = nodes.selection(policy)
        if policy.dry_run or name not in asking.selected:
            return []
        others = sorted(
            (p for p in nodes.policies.values() if p.name != policy.name and not p.dry_run),
            key=lambda p: p.name,
        )
        return [(policy, asking), *((p, nodes.selection(p)) for p in others)]

    def budgets(
        self, acting: Sequence[model.Policy], nodes: cache.ClusterCache, *, domains: bool = True
    ) -> list[budget.Budget]:
        """The budgets of these policies: each one's `maxUnavailable`, then its topology budgets' domains."""
        parts = self._parts([(each, nodes.selection(each)) for each in acting])
        return budget.budgets_of(parts, _labels(nodes), domains=domains)

    def _parts(
        self, acting: Sequence[tuple[model.Policy, cache.Selection]]
    ) -> list[tuple[model.Policy, Set[str], Set[str]]]:
        """(policy, selected, unavailable) of each acting policy, its in-flight nodes counted."""
        return [(each, selection.selected, self.holders(each, selection)) for each, selection in acting]

    @staticmethod
    def _ranks(
        nodes: cache.ClusterCache,
        wanting: Mapping[str, Mapping[str, budget.Rank]],
        acting: Sequence[tuple[model.Policy, cache.Selection]],
    ) -> list[tuple[Mapping[str, budget.Rank], Set[str]]]:
        """`budget.Ranks`' parts: each acting policy's ranks, counted for the nodes it selects now (the
        selection `acting` holds for the very policy, else the cache's)."""
        known = {each.name: (each, selection) for each, selection in acting}
        parts: list[tuple[Mapping[str, budget.Rank], Set[str]]] = []
        for name, ranks in wanting.items():
            policy = nodes.policies.get(name)
            if policy is None or policy.dry_run:
                continue
            each, selection = known.get(name, (None, None))
            if selection is None or each != policy:  # not acting here, or another version of it
                selection = nodes.selection(policy)
            parts.append((ranks, selection.selected))
        return parts

    def forget_node(self, name: str) -> None:
        """The node is gone: it holds no place and waits for none."""
        self.in_flight.discard(name)
        self.notified.difference_update({k for k in self.notified if k[1] == name})

    def forget_policy(self, name: str) -> None:
        """The policy is gone: its waiting nodes (its budget was the nodes' own state, nothing to forget)."""
        self.notified.difference_update({k for k in self.notified if k[0] == name})


def _labels(nodes: cache.ClusterCache) -> Callable[[str], Mapping[str, str] | None]:
    def labels(name: str) -> Mapping[str, str] | None:
        record = nodes.node(name)
        return record.view.labels if record is not None else None

    return labels
