"""Nodes, policies and agent reports judged by the operator's own handlers and timer, on the in-memory
cluster (`gpuhealth_sim.backtest.memcluster`) under a test clock: for unit tests of behaviour over time
that need no API server (the integration tier runs the same handlers against a real one)."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


class MemoryFleet:
    """Each policy of `policies` holds `rules` with maxUnavailable 100 % (no budget in the way)."""

    def __init__(self, rules: Sequence[Mapping[str, Any]], policies: Sequence[str] = ("p",)) -> None:
        self.cluster: Any = memcluster.MemoryKube()
        self.ctx = operator_context.new_context(self.cluster)
        self.now = T0
        self.ctx.clock = lambda: self.now
        self.policies = [
            {
                "apiVersion": resources.API_VERSION,
                "kind": resources.POLICY_KIND,
                "metadata": {"name": name, "generation": 1},
                "spec": {"rules": [dict(r) for r in rules], "maxUnavailable": "100%"},
            }
            for name in policies
        ]

    async def start(self, names: Sequence[str]) -> None:
        """The policies, then one Node per name, as their watch events."""
        for policy in self.policies:
            await handlers.on_policy({"type": "ADDED", "object": policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        for name in names:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}, "spec": {}}
            self.cluster.put_node(copy.deepcopy(node))
            await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)

    async def deliver(self, name: str, status: Mapping[str, Any]) -> None:
        """The agent writes `status` to the node's GPUNode; the operator gets its watch event."""
        stored = self.cluster.put_gpunode(name, dict(status))
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def edit_node(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """Someone else edits the Node (`edit` changes a copy in place); the operator gets its event."""
        node = copy.deepcopy(self.cluster.nodes[name])
        edit(node)
        stored = self.cluster.put_node(node)
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float, *, full: bool = True) -> None:
        """`seconds` pass, then a timer pass."""
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=full)

    def cordoned(self, name: str) -> bool:
        return bool(self.cluster.nodes[name]["spec"].get("unschedulable"))

    def labels(self, name: str) -> Mapping[str, str]:
        return self.cluster.nodes[name]["metadata"].get("labels") or {}

    def taint(self, name: str) -> str | None:
        """The value of our NoSchedule taint on the Node, None without it."""
        taints = self.cluster.nodes[name]["spec"].get("taints") or []
        return next((t.get("value") for t in taints if t.get("key") == keys.UNHEALTHY_TAINT), None)
