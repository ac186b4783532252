"""A link or port down is judged on what the node reports, not on what this process happened to see.

Issue 45, item 7. NvLinkDegraded and NicDegraded ("down after the operator saw it up") kept their
memory in the process only: after an operator restart or a leader change a GPU with an NVLink still
down, or a NIC port still DOWN, was judged healthy and its taint lifted after healthyForSeconds, and a
node that joined with a link already down was never flagged. Now a GPU's links up are compared with its
cohort's (same model, same number of links, across the fleet's GPUNodes), and a port DOWN whose
physState is not Disabled is a fault from one report.
"""

import asyncio
import copy
import datetime
from typing import Any, cast

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
LABELS = {"pool": "gpu", keys.GPU_COUNT_LABEL: "8", keys.GPU_PRESENT_LABEL: "true"}
UP = {"linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}
ONE_DOWN = {**UP, "linksUp": 17, "linksDown": 1}
PORT = {"name": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "rateGbps": 400.0}


class Fleet:
    def __init__(self) -> None:
        self.now = T0
        self.cluster: Any = cast(Any, memcluster.MemoryKube())
        self.ctx = self.operator("t")
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [
                {"name": "nvlink", "condition": "NvLinkDegraded", "action": "Taint"},
                {"name": "nic", "condition": "NicDegraded", "action": "Taint"},
            ],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 60, "uncordon": True},
        }
        self.policy: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        self.policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}

    def operator(self, instance: str) -> context.Context:
        ctx = operator_context.new_context(self.cluster, instance=instance, clock=lambda: self.now)
        return ctx

    async def start(self, names: list[str], **facts: Any) -> None:
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        for name in names:
            await self.join(name, **facts)

    async def join(self, name: str, **facts: Any) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": name, "labels": dict(LABELS)},
            "spec": {},
        }
        self.cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)
        await self.report(name, **facts)

    async def restart(self) -> None:
        """A new operator (a restart, a new leader) over the same cluster: it lists, then judges."""
        self.ctx = self.operator("t2")
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        for name in self.cluster.nodes:
            node = copy.deepcopy(self.cluster.nodes[name])
            await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)
        for name in self.cluster.gpunodes:
            gpunode = copy.deepcopy(self.cluster.gpunodes[name])
            await handling.handle(handlers.on_gpunode, {"type": "ADDED", "object": gpunode}, self.ctx)

    async def report(
        self,
        name: str,
        *,
        nvlink: dict[int, dict[str, Any]] | None = None,
        nics: list[dict[str, Any]] | None = None,
    ) -> None:
        links = {i: {"nvlink": dict(UP)} for i in range(8)} | {
            i: {"nvlink": v} for i, v in (nvlink or {}).items()
        }
        status = gpunode_facts.agent_status(
            gpus=8,
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides=links,
        )
        if nics is not None:
            status["nics"] = nics
        stored = self.cluster.put_gpunode(name, status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=True)

    def taint(self, name: str) -> str | None:
        for taint in self.cluster.nodes[name]["spec"].get("taints", []):
            if taint["key"] == keys.UNHEALTHY_TAINT:
                return str(taint["value"])
        return None

    def issues(self, name: str) -> str:
        return str(self.cluster.gpunodes[name].get("status", {}).get("issues", ""))


def test_an_nvlink_still_down_after_a_restart_keeps_its_taint() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        await fleet.report("n", nvlink={3: ONE_DOWN})
        await fleet.tick(1)
        assert fleet.taint("n") == "NvLinkDegraded"
        await fleet.restart()
        for _ in range(5):  # the agent reports every minute, the link still down
            await fleet.report("n", nvlink={3: ONE_DOWN})
            await fleet.tick(60)
        assert fleet.taint("n") == "NvLinkDegraded", "still down: the taint stays"
        assert "NvLinkDegraded" in fleet.issues("n")
        await fleet.report("n")  # the link is back
        await fleet.tick(1)
        await fleet.tick(61)
        assert fleet.taint("n") is None

    asyncio.run(scenario())


def test_a_node_that_joins_with_links_down_on_every_gpu_is_flagged_by_its_cohort() -> None:
    """An NVSwitch down: every GPU of the node has one link fewer up than the same GPUs elsewhere."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["a", "b"])
        await fleet.join("c", nvlink=dict.fromkeys(range(8), ONE_DOWN))
        await fleet.tick(1)
        assert fleet.taint("c") == "NvLinkDegraded"
        assert fleet.taint("a") is None and fleet.taint("b") is None

    asyncio.run(scenario())


def test_boards_that_never_have_links_up_are_no_fault() -> None:
    """PCIe boards without bridges: every link down on every GPU, as on all their peers."""

    async def scenario() -> None:
        fleet = Fleet()
        none_up = {**UP, "linksUp": 0, "linksDown": 18}
        await fleet.start(["a", "b"], nvlink=dict.fromkeys(range(8), none_up))
        await fleet.tick(1)
        assert fleet.taint("a") is None and fleet.taint("b") is None

    asyncio.run(scenario())


def test_a_nic_port_down_without_an_administrator_is_a_fault_also_after_a_restart() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"], nics=[PORT])
        await fleet.join("m", nics=[{**PORT, "state": "DOWN", "physState": "Polling"}])  # joins with it down
        await fleet.tick(1)
        assert fleet.taint("m") == "NicDegraded"
        await fleet.report("n", nics=[{**PORT, "state": "DOWN", "physState": "Polling"}])
        await fleet.tick(1)
        assert fleet.taint("n") == "NicDegraded"
        await fleet.restart()
        for _ in range(3):
            await fleet.report("n", nics=[{**PORT, "state": "DOWN", "physState": "Polling"}])
            await fleet.tick(60)
        assert fleet.taint("n") == "NicDegraded", "still down: the taint stays"

    asyncio.run(scenario())


def test_a_port_an_administrator_disabled_is_no_fault() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"], nics=[{**PORT, "state": "DOWN", "physState": "Disabled"}])
        await fleet.tick(1)
        assert fleet.taint("n") is None
        assert "NicDegraded" not in fleet.issues("n")

    asyncio.run(scenario())


def test_the_cohort_follows_the_gpunodes_stored_and_removed() -> None:
    """The expectation is counted from the GPUNodes the cache holds: a node that goes takes its GPUs."""
    store = cache.ClusterCache()

    def put(name: str, nvlink: dict[str, Any]) -> None:
        facts = gpunode_facts.agent_status(gpus=8, overrides={i: {"nvlink": nvlink} for i in range(8)})
        store.put_gpunode(
            {"metadata": {"name": name, "uid": name, "resourceVersion": "1"}, "status": facts}, T0
        )

    cohort = (gpunode_facts.MODEL, 18)
    put("c", ONE_DOWN)
    assert store.links.expected == {cohort: 17}, "one node alone: its own GPUs are the cohort"
    put("a", UP)
    put("b", UP)
    assert store.links.expected == {cohort: 18}
    store.remove_gpunode("a")
    store.remove_gpunode("b")
    assert store.links.expected == {cohort: 17}
    store.remove_gpunode("c")
    assert store.links.expected == {}


def test_a_node_at_rest_is_judged_again_when_its_cohort_learns_better() -> None:
    """The first node of a model to join has only itself to go by; once its peers join with more links up,
    the next pass over it (the timer's full pass) judges it again: a node at rest is left alone only while
    what its GPUs' cohorts expect is what it was judged against."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["c"], nvlink=dict.fromkeys(range(8), ONE_DOWN))
        await fleet.tick(1)
        await fleet.report("c", nvlink=dict.fromkeys(range(8), ONE_DOWN))
        await fleet.tick(1)
        assert fleet.taint("c") is None, "alone: its own GPUs are its cohort"
        await fleet.join("a")
        await fleet.join("b")
        await fleet.tick(1)  # a full pass: c is at rest, its report unchanged
        assert fleet.taint("c") == "NvLinkDegraded"

    asyncio.run(scenario())
