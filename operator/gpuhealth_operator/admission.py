"""The disruption budget at run time: which node may be cordoned now, and who was told to wait.

`decisions.budget` decides from plain sets; this module keeps, while the
operator runs, what those sets cannot see: the per-policy locks that make
concurrent reconciles decide one at a time, the nodes admitted whose cordon is
not yet in the cache ("in flight"), and the waiting nodes already told so
(DisruptionBudgetExceeded is said once per wait).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Mapping

from gpuhealth_operator import cache
from gpuhealth_operator.decisions import budget, model, policies


@dataclasses.dataclass
class Admission:
    """The budget's memory; every collection is changed in place (kopf shares the memo by shallow copy)."""

    locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """policy → lock: one budget decision at a time per policy, so cordons never exceed maxUnavailable."""

    in_flight: collections.defaultdict[str, set[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(set)
    )
    """policy → nodes admitted by the budget whose cordon is not yet in the cache."""

    notified: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(policy, node) already told DisruptionBudgetExceeded while it waits."""

    def holders(self, policy: model.Policy, selection: cache.Selection) -> set[str]:
        """Selected nodes that take up the budget, those admitted but not yet seen cordoned included."""
        return selection.unavailable | (self.in_flight[policy.name] & selection.selected)

    async def admit(
        self,
        policy: model.Policy,
        name: str,
        selection: cache.Selection,
        wanting: Mapping[str, budget.Rank],
    ) -> bool:
        """Ask the budget; if admitted, the node is in flight until `release`."""
        async with self.locks[policy.name]:
            if budget.admits(policy, name, selection.selected, self.holders(policy, selection), wanting):
                self.in_flight[policy.name].add(name)
                return True
            return False

    def release(self, policy: model.Policy, name: str) -> None:
        """The admitted node's cordon is in the cache (or was not made): it is no longer in flight."""
        self.in_flight[policy.name].discard(name)

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

    def wait_reason(self, policy: model.Policy, selection: cache.Selection, nodes: cache.ClusterCache) -> str:
        """Why the budget makes a node wait, naming the nodes that hold it."""
        limit = policies.resolve_max_unavailable(policy, len(selection.selected))
        holders = sorted(self.holders(policy, selection))
        if len(holders) >= limit:
            views = [record.view for n in holders if (record := nodes.node(n)) is not None]
            return (
                f"{len(holders)} of its {len(selection.selected)} selected nodes are already unschedulable "
                f"(maxUnavailable={limit}): {budget.holders_text(policy, views)}"
            )
        free = limit - len(holders)
        return f"the {free} free place(s) under maxUnavailable={limit} go to worse or older faults first"

    def forget_node(self, name: str) -> None:
        """The node is gone: it holds no place and waits for none."""
        for nodes in self.in_flight.values():
            nodes.discard(name)
        self.notified.difference_update({k for k in self.notified if k[1] == name})

    def forget_policy(self, name: str) -> None:
        """The policy is gone: its lock (unless held), in-flight set and waiting nodes."""
        lock = self.locks.get(name)
        if lock is not None and not lock.locked():
            del self.locks[name]
        self.in_flight.pop(name, None)
        self.notified.difference_update({k for k in self.notified if k[0] == name})
