"""A reboot's effect on another tool's Node condition is judged on a version written after the new boot.

Issue 45, item 5. node-problem-detector (or any tool) writes its condition; the kubelet keeps what was
last written across a reboot until that tool, started again, writes a fresh one (NPD: seconds after it
starts). A RebootNode step judged on the condition written before the reboot saw the fault "stay" and
retired a node that the reboot had fixed. Now the step waits (a bounded time) for the condition's
`lastHeartbeatTime`/`lastTransitionTime` to be after the boot the agent reports (`bootTime`).
"""

import asyncio
import copy
import datetime
from typing import Any, cast

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.ladder.repair import reading
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
LABELS = {"pool": "gpu", keys.GPU_COUNT_LABEL: "8", keys.GPU_PRESENT_LABEL: "true"}


def at(seconds: float) -> str:
    return str(gpunode_facts.rfc3339(T0 + datetime.timedelta(seconds=seconds)))


class Fleet:
    """One node with a KernelDeadlock rule repaired by a reboot, on the in-memory cluster."""

    def __init__(self) -> None:
        self.now = T0
        self.cluster: Any = cast(Any, memcluster.MemoryKube(clock=self.epoch))
        self.ctx = operator_context.new_context(self.cluster, clock=lambda: self.now)
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [
                {
                    "name": "kd",
                    "nodeCondition": {"type": "KernelDeadlock", "status": "True"},
                    "action": "Drain",
                }
            ],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 0, "uncordon": True},
            "repair": {"steps": [{"name": "reboot", "action": "RebootNode", "timeoutSeconds": 1800}]},
        }
        self.policy: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        self.policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}

    def epoch(self) -> float:
        return self.now.timestamp()

    async def start(self) -> None:
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n", "uid": "n", "labels": dict(LABELS)},
            "spec": {},
            "status": {"conditions": []},
        }
        self.cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)
        await self.report("boot-1", boot_time=at(-86400))

    async def condition(self, status: str, *, heartbeat: float, transition: float) -> None:
        """node-problem-detector writes its KernelDeadlock condition."""
        node = copy.deepcopy(self.cluster.nodes["n"])
        kept = [
            c for c in node.setdefault("status", {}).get("conditions", []) if c["type"] != "KernelDeadlock"
        ]
        kept.append(
            {
                "type": "KernelDeadlock",
                "status": status,
                "reason": "DockerHung" if status == "True" else "KernelHasNoDeadlock",
                "lastHeartbeatTime": at(heartbeat),
                "lastTransitionTime": at(transition),
            }
        )
        node["status"]["conditions"] = kept
        stored = self.cluster.put_node(node)
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def report(self, boot: str, *, boot_time: str | None) -> None:
        status = gpunode_facts.agent_status(
            gpus=8, heartbeat=gpunode_facts.rfc3339(self.now), observed=gpunode_facts.rfc3339(self.now)
        )
        status["agent"]["bootId"] = boot
        if boot_time is not None:
            status["agent"]["bootTime"] = boot_time
        stored = self.cluster.put_gpunode("n", status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=True)

    def action(self) -> str:
        return str(self.cluster.gpunodes["n"].get("status", {}).get("action"))

    def labels(self) -> dict[str, str]:
        return dict(self.cluster.nodes["n"]["metadata"].get("labels", {}))

    def results(self) -> list[tuple[str, str]]:
        return [(r.get("step", ""), r.get("result", "")) for r in reading.history(self.ctx, "n")]

    async def rebooting(self, *, boot_time: str | None = at(100)) -> None:
        """The condition fires, the node is cordoned and drained, the RebootNode Job starts and the node
        reboots at T0+100 (the agent comes back with a new bootId and its bootTime)."""
        await self.start()
        await self.condition("True", heartbeat=-30, transition=-600)
        for _ in range(4):
            await self.tick(5)
        assert self.action() == "Repairing", self.action()
        assert any("RebootNode" in str(j) for j in self.cluster.job_log), "the reboot Job started"
        self.now = T0 + datetime.timedelta(seconds=130)
        await self.report("boot-2", boot_time=boot_time)


def test_a_reboot_is_not_judged_on_the_condition_written_before_it() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.rebooting()
        await fleet.tick(5)  # the Node still holds the condition as written before the reboot
        assert fleet.action() == "Repairing", "waits for a version written after the new boot"
        assert fleet.labels().get(keys.NEEDS_REPAIR_LABEL) is None, "not retired"
        assert ("reboot", "NoEffect") not in fleet.results()
        await fleet.condition("False", heartbeat=150, transition=150)  # NPD started again: no deadlock
        await fleet.tick(5)
        await fleet.tick(5)
        assert ("reboot", "Succeeded") in fleet.results(), fleet.results()
        assert fleet.labels().get(keys.NEEDS_REPAIR_LABEL) is None
        assert not fleet.cluster.nodes["n"]["spec"].get("unschedulable"), "returned to service"

    asyncio.run(scenario())


def test_a_fresh_condition_still_true_after_the_reboot_is_no_effect() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.rebooting()
        await fleet.condition("True", heartbeat=150, transition=-600)  # written after the boot: still there
        await fleet.tick(5)
        await fleet.tick(5)
        assert ("reboot", "NoEffect") in fleet.results(), fleet.results()
        assert fleet.labels().get(keys.NEEDS_REPAIR_LABEL) == "manual", "no step left: retired"

    asyncio.run(scenario())


def test_no_fresh_condition_within_the_wait_is_judged_on_what_the_node_holds() -> None:
    """The wait is bounded (`reading.FRESH_CONDITION_WAIT_SECONDS`): a tool that never writes again
    (uninstalled) leaves its last version, judged as it stands."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.rebooting()
        await fleet.tick(5)
        assert fleet.action() == "Repairing"
        await fleet.tick(reading.FRESH_CONDITION_WAIT_SECONDS)
        await fleet.tick(5)
        assert ("reboot", "NoEffect") in fleet.results(), fleet.results()

    asyncio.run(scenario())


def test_without_a_boot_time_the_condition_must_be_written_after_the_reboot_step_began() -> None:
    """An agent that reports no bootTime (an older one): the step's start stands in for the boot."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.rebooting(boot_time=None)
        await fleet.tick(5)
        assert fleet.action() == "Repairing", "the condition predates the step: wait"
        await fleet.condition("False", heartbeat=150, transition=150)
        await fleet.tick(5)
        await fleet.tick(5)
        assert ("reboot", "Succeeded") in fleet.results(), fleet.results()

    asyncio.run(scenario())


def test_a_boot_time_far_ahead_of_the_operators_clock_cannot_hold_the_step() -> None:
    """A skewed node, or an agent that lies about its boot: the wait is bounded all the same."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.rebooting(boot_time=at(86400))  # a day ahead
        await fleet.tick(5)
        assert ("reboot", "NoEffect") in fleet.results(), "judged on what the Node holds: no wait"

    asyncio.run(scenario())
