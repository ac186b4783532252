"""Every decision is said both ways: a condition that clears, a label or taint of ours that goes.

Issue 45 ("Events for every decision both ways"). A condition turning True posts its Warning Event and
a Label or Taint rule marks the node; when the condition cleared and the mark was lifted nothing was
said, so `kubectl get events` told half the story. Now a cleared condition posts a Normal Event with
its name as the reason ("... cleared"), and a label or taint of ours removed posts `NodeUnlabeled` or
`NodeUntainted` (Normal), once each.
"""

import asyncio
import copy
import datetime
from collections.abc import Mapping
from typing import Any, cast

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
LABELS = {"pool": "gpu", keys.GPU_COUNT_LABEL: "8", keys.GPU_PRESENT_LABEL: "true"}
HOT = {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}
PCIE_SLOW = {
    "pcie": {"generation": 3, "maxGeneration": 5, "width": 16, "maxWidth": 16},
    "utilizationPercent": 95,
}


class Fleet:
    def __init__(self) -> None:
        self.now = T0
        self.cluster: Any = cast(Any, memcluster.MemoryKube())
        self.ctx = operator_context.new_context(self.cluster, clock=lambda: self.now)
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [
                {"name": "thermal", "condition": "ThermalThrottled", "action": "Label"},
                {"name": "pcie", "condition": "PcieDegraded", "action": "Taint"},
            ],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 60, "uncordon": True},
        }
        self.policy: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        self.policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}

    async def start(self) -> None:
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n", "uid": "n", "labels": dict(LABELS)},
            "spec": {},
        }
        self.cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)
        await self.report()

    async def report(self, **gpu0: Any) -> None:
        status = gpunode_facts.agent_status(
            gpus=8,
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides={0: gpu0},
        )
        stored = self.cluster.put_gpunode("n", status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=True)

    def said(self, reason: str) -> list[Mapping[str, Any]]:
        return [e for e in self.cluster.event_log if e["reason"] == reason]


def test_a_cleared_condition_and_the_label_and_taint_it_lifts_are_each_said_once() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start()
        await fleet.tick(1)
        await fleet.report(**HOT, **PCIE_SLOW)
        await fleet.tick(1)
        labels = fleet.cluster.nodes["n"]["metadata"]["labels"]
        assert labels.get(keys.THERMAL_LABEL) == "true"
        assert [t["key"] for t in fleet.cluster.nodes["n"]["spec"].get("taints", [])] == [
            keys.UNHEALTHY_TAINT
        ]
        assert [e["type"] for e in fleet.said("ThermalThrottled")] == ["Warning"]
        await fleet.report()  # cool again, the link at full speed
        for _ in range(4):
            await fleet.tick(30)
        assert keys.THERMAL_LABEL not in fleet.cluster.nodes["n"]["metadata"]["labels"]
        assert not fleet.cluster.nodes["n"]["spec"].get("taints")
        for condition in ("ThermalThrottled", "PcieDegraded"):
            events = fleet.said(condition)
            assert [e["type"] for e in events] == ["Warning", "Normal"], condition
            assert "cleared" in events[-1]["message"]
            assert events[-1]["count"] == 1
        (unlabeled,) = fleet.said("NodeUnlabeled")
        assert keys.THERMAL_LABEL in unlabeled["message"] and unlabeled["type"] == "Normal"
        (untainted,) = fleet.said("NodeUntainted")
        assert keys.UNHEALTHY_TAINT in untainted["message"] and "PcieDegraded" in untainted["message"]
        await fleet.tick(30)
        await fleet.tick(300)
        assert len(fleet.said("NodeUnlabeled")) == 1 and len(fleet.said("NodeUntainted")) == 1, "once"

    asyncio.run(scenario())
