"""IsolateGPU passes on the in-memory cluster, under a clock the test turns: what the cluster changes
between and during passes (a Node deleted mid-pass, a rule deleted by a human) and what a held
isolation costs in reads."""

import asyncio
import copy
import datetime
from typing import Any

import kopf

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import device_taints
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context, settings
from gpuhealth_operator.state import recent
from gpuhealth_sim.backtest import memcluster

NODE = "dra-0"
GPUS = 8
FAULTY = 3
VERSION = "v1beta2"
POLICY: dict[str, Any] = {
    "apiVersion": resources.API_VERSION,
    "kind": resources.POLICY_KIND,
    "metadata": {"name": "iso", "generation": 1},
    "spec": {
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
        "isolation": {"maxGPUsPerNode": 2},
        "recovery": {"uncordon": True, "healthyForSeconds": 2},
    },
}
T0 = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def event(kind: str, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": body}  # type: ignore[typeddict-item]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster, counting LISTs, with a hook run when the policy's rules are listed."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: dict[str, int] = {"resourceslices": 0, "devicetaintrules": 0}
        self.on_rules_list: Any = None

    async def list_all(self, path: str, query: Any = None) -> list[Any]:
        plural = path.rstrip("/").rsplit("/", 1)[1]
        if plural in self.lists:
            self.lists[plural] += 1
        if plural == "devicetaintrules" and self.on_rules_list is not None:
            hook, self.on_rules_list = self.on_rules_list, None
            await hook()
        return await super().list_all(path, query)


async def faulty_dra_node(cluster: Cluster, clock: Clock, *nodes: str, **spec: Any) -> context.Context:
    """A context on `cluster` under `clock`, the IsolateGPU policy (with `spec`) and DRA nodes."""
    config = settings.Settings()
    ctx = operator_context.new_context(cluster, config=config, clock=clock)
    cluster.serve_device_taint_rules(VERSION)
    policy = copy.deepcopy(POLICY)
    policy["spec"].update(spec)
    await handlers.on_policy(event("ADDED", policy), memo=ctx)
    for name in nodes or (NODE,):
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {keys.GPU_COUNT_LABEL: str(GPUS)}},
            "spec": {},
            "status": {"capacity": {keys.GPU_RESOURCE: str(GPUS)}},
        }
        cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, event("ADDED", copy.deepcopy(node)), ctx)
        cluster.put_slice(gpunode_facts.resource_slice(name, GPUS))
    return ctx


async def report_fault(cluster: Cluster, ctx: context.Context, node: str = NODE) -> None:
    faulty = gpunode_facts.agent_status(gpus=GPUS, overrides={FAULTY: {"ecc": {"uncorrectedVolatile": 1}}})
    stored = cluster.put_gpunode(node, faulty)
    await handling.handle(handlers.on_gpunode, event("MODIFIED", copy.deepcopy(stored)), ctx)


def test_a_node_deleted_while_its_rules_are_listed_is_left_alone() -> None:
    """The Node's deletion is handled while the isolation pass awaits the API server: the pass ends
    without a rule, an error or memory of the node."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await faulty_dra_node(cluster, clock)

        async def delete_node() -> None:
            node = cluster.nodes.pop(NODE)
            await handling.handle(handlers.on_node, event("DELETED", copy.deepcopy(node)), ctx)

        cluster.on_rules_list = delete_node
        await report_fault(cluster, ctx)
        assert cluster.on_rules_list is None, "the pass listed the rules"
        assert cluster.rules == {}
        assert not [key for key in ctx.steps.isolate.isolations if key[1] == NODE]

    asyncio.run(scenario())


def test_a_held_isolation_lists_once_per_reuse_period_and_still_sees_a_human_delete_its_rule() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await faulty_dra_node(cluster, clock)
        await report_fault(cluster, ctx)
        rule = device_taints.rule_name(NODE, FAULTY)
        assert list(cluster.rules) == [rule]

        cluster.lists = dict.fromkeys(cluster.lists, 0)
        for _ in range(60):  # a minute of 1 s timer passes with the GPU still faulty
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        per_minute = 60 / recent.SECONDS
        assert 0 < cluster.lists["devicetaintrules"] <= per_minute + 1, cluster.lists
        assert cluster.lists["resourceslices"] <= per_minute + 1, cluster.lists

        del cluster.rules[rule]  # a human takes the GPU back
        deleted_at = clock.now
        while not [e for e in cluster.event_log if e["reason"] == "OverriddenByUser"]:
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
            assert (clock.now - deleted_at).total_seconds() <= recent.SECONDS + 1, "override not seen"
        assert cluster.rules == {}, "not isolated again on the same evidence"

    asyncio.run(scenario())


class LosingCluster(Cluster):
    """Creates the first DeviceTaintRule, then loses the answer (a timeout after the server acted)."""

    lost = False

    async def create(self, path: str, body: Any) -> Any:
        answer = await super().create(path, body)
        if keys.NODE_LABEL in body["metadata"].get("labels", {}) and not self.lost:  # not the probe's
            self.lost = True
            raise kube.ApiError(504, "Gateway Timeout", "the answer was lost")
        return answer


def test_a_rule_whose_creation_answer_was_lost_still_counts_against_the_gpu_budget() -> None:
    """maxUnavailableGPUs 1: the first GPU's rule was created though its answer never came; a second
    node's GPU a moment later must wait, not be isolated on a rule list read before that create."""

    async def scenario() -> None:
        cluster, clock = LosingCluster(), Clock()
        ctx = await faulty_dra_node(cluster, clock, "a", "b", maxUnavailableGPUs=1)
        await report_fault(cluster, ctx, "a")  # the pass fails on the lost answer (logged, retried)
        assert list(cluster.rules) == [device_taints.rule_name("a", FAULTY)]
        clock.now += datetime.timedelta(seconds=1)
        await report_fault(cluster, ctx, "b")
        assert list(cluster.rules) == [device_taints.rule_name("a", FAULTY)], "the GPU budget exceeded"
        assert cluster.gpunodes["b"]["status"].get("action") == "Pending"

    asyncio.run(scenario())


def test_two_isolating_policies_over_one_node_isolate_its_gpu_once_and_see_no_override() -> None:
    """A second policy selecting the same node: one rule for the GPU, no cordon, and none of the
    rule-list reuse mistakes the other policy's rule for a human's deletion of its own."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await faulty_dra_node(cluster, clock)
        second = copy.deepcopy(POLICY)
        second["metadata"]["name"] = "iso-too"
        await handlers.on_policy(event("ADDED", second), memo=ctx)
        await report_fault(cluster, ctx)
        for _ in range(30):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert list(cluster.rules) == [device_taints.rule_name(NODE, FAULTY)]
        assert not cluster.nodes[NODE]["spec"].get("unschedulable"), "isolated, not cordoned"
        reasons = {e["reason"] for e in cluster.event_log}
        assert "GPUIsolated" in reasons and "OverriddenByUser" not in reasons, reasons

    asyncio.run(scenario())


def node_rule_log(cluster: Cluster) -> list[tuple[str, str]]:
    """Rules created and deleted, by name, but the probe's (a new leader probes again)."""
    return [
        (what, rule["metadata"]["name"])
        for what, rule in cluster.rule_log
        if keys.NODE_LABEL in rule["metadata"].get("labels", {})
    ]


def test_a_new_leader_reads_the_rules_in_place_and_adds_none() -> None:
    """A second replica taking over starts with nothing reused: it lists the rule its predecessor made,
    keeps the GPU isolated and neither creates a second rule nor calls the first an override."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        await report_fault(cluster, await faulty_dra_node(cluster, clock))
        before = node_rule_log(cluster)
        successor = await faulty_dra_node(cluster, clock)  # the next term's context, same cluster
        await report_fault(cluster, successor)
        for _ in range(15):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(successor)
        assert node_rule_log(cluster) == before, "no rule created or deleted by the new leader"
        assert cluster.gpunodes[NODE]["status"].get("action") == "Isolated"
        assert "OverriddenByUser" not in {e["reason"] for e in cluster.event_log}

    asyncio.run(scenario())


def test_a_node_whose_faults_outgrow_isolation_is_cordoned_by_the_report_that_shows_them() -> None:
    """One GPU isolated, then a report with three faulty GPUs (over `maxGPUsPerNode`: 2): the node takes
    the ladder, cordoned in that report's own pass, not a timer pass later (its verdict is judged with
    what the pass decided for its GPUs, not amended from the one judged before)."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await faulty_dra_node(cluster, clock)
        await report_fault(cluster, ctx)
        assert set(cluster.rules) == {device_taints.rule_name(NODE, FAULTY)}
        assert not cluster.nodes[NODE]["spec"].get("unschedulable")

        clock.now += datetime.timedelta(seconds=5)
        ecc = {"ecc": {"uncorrectedVolatile": 1}}
        faulty = gpunode_facts.agent_status(gpus=GPUS, overrides={FAULTY: ecc, 4: ecc, 5: ecc})
        stored = cluster.put_gpunode(NODE, faulty)
        await handling.handle(handlers.on_gpunode, event("MODIFIED", copy.deepcopy(stored)), ctx)

        node = cluster.nodes[NODE]
        assert node["spec"].get("unschedulable") is True, "cordoned by the report's own pass"
        assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == "iso"
        assert ctx.verdicts["iso", NODE].wanted_action is vocabulary.Action.DRAIN

    asyncio.run(scenario())
