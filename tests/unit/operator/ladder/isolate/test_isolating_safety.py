"""IsolateGPU's safety (issue 24): what a drill, a new term, a flaky probe, a fault storm, an overlapping
policy and a deleted policy do to the GPUs a policy isolates, on the in-memory cluster."""

import asyncio
import copy
import datetime
from typing import Any

import kopf
import pytest

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import device_taints, times
from gpuhealth_operator.ladder.isolate import device_rules, isolating, isolation_support
from gpuhealth_operator.runtime import handlers, passes, ticker
from gpuhealth_operator.shared import context
from gpuhealth_sim.backtest import memcluster

GPUS = 8
FAULTY = 3
VERSION = "v1beta2"
T0 = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def policy_body(name: str = "iso", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
            "isolation": {"maxGPUsPerNode": 2},
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
            **spec,
        },
    }


def event(kind: str, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": copy.deepcopy(body)}  # type: ignore[typeddict-item]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster; `acting=False`: it serves DeviceTaintRules and ignores them (the
    DRADeviceTaintRules gate off: no status); `probe_failures`: 503s answering the probe rule's create."""

    def __init__(self, *, acting: bool = True, probe_failures: int = 0) -> None:
        super().__init__()
        self.acting = acting
        self.probe_failures = probe_failures

    def put_rule(self, body: Any) -> Any:
        rule = super().put_rule(body)
        if not self.acting:
            del self.rules[rule["metadata"]["name"]]["status"]
        return rule

    async def create(self, path: str, body: Any) -> Any:
        labels = body.get("metadata", {}).get("labels", {})
        if path.endswith("/devicetaintrules") and keys.NODE_LABEL not in labels and self.probe_failures:
            self.probe_failures -= 1
            raise kube.ApiError(503, "Service Unavailable", "etcdserver: leader changed")
        return await super().create(path, body)

    def node_rules(self) -> dict[str, str]:
        """Rule name → its policy label, the probe's left out."""
        return {
            name: rule["metadata"]["labels"][keys.POLICY_LABEL]
            for name, rule in self.rules.items()
            if keys.NODE_LABEL in rule["metadata"].get("labels", {})
        }


@pytest.fixture(autouse=True)
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster that ignores rules gives the probe no status: wait a moment for it, not 15 s."""
    monkeypatch.setattr(device_rules, "PROBE_TIMEOUT_SECONDS", 0.05)
    monkeypatch.setattr(device_rules, "PROBE_POLL_SECONDS", 0.01)
    monkeypatch.setattr(device_rules, "PROBE_RETRY_SECONDS", 0.0, raising=False)


def new_context(cluster: Cluster, clock: Clock, kept: Any = None) -> context.Context:
    """A term's context; `kept`: the cache an earlier term of the same process kept."""
    ctx = operator_context.new_context(cluster, cluster=kept, clock=clock)  # type: ignore[arg-type]
    return ctx


async def start(
    cluster: Cluster, clock: Clock, nodes: tuple[str, ...], *policies: dict[str, Any]
) -> context.Context:
    ctx = new_context(cluster, clock)
    cluster.serve_device_taint_rules(VERSION)
    for body in policies:
        cluster.policies[body["metadata"]["name"]] = copy.deepcopy(body)
        await handlers.on_policy(event("ADDED", body), memo=ctx)
    for name in nodes:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {keys.GPU_COUNT_LABEL: str(GPUS)}},
            "spec": {},
            "status": {"capacity": {keys.GPU_RESOURCE: str(GPUS)}},
        }
        cluster.put_node(copy.deepcopy(node))
        await handling.handle(handlers.on_node, event("ADDED", node), ctx)
        cluster.put_slice(gpunode_facts.resource_slice(name, GPUS))
        await report(cluster, ctx, name, faulty=False)
    return ctx


async def report(
    cluster: Cluster, ctx: context.Context, node: str, *, faulty: bool = True, annotations: Any = None
) -> None:
    overrides = {FAULTY: {"ecc": {"uncorrectedVolatile": 1}}} if faulty else None
    if annotations is not None and node in cluster.gpunodes:
        cluster.gpunodes[node]["metadata"]["annotations"] = annotations
    stored = cluster.put_gpunode(node, gpunode_facts.agent_status(gpus=GPUS, overrides=overrides))
    if annotations is not None:
        stored["metadata"]["annotations"] = annotations
    await handling.handle(handlers.on_gpunode, event("MODIFIED", stored), ctx)


async def new_term(cluster: Cluster, clock: Clock, ctx: context.Context) -> context.Context:
    """The next term of the same process: a new context on the cache it kept; kopf lists the policies."""
    successor = new_context(cluster, clock, kept=ctx.cache)
    for body in cluster.policies.values():
        await handlers.on_policy(event("ADDED", body), memo=successor)
    return successor


def reasons(cluster: Cluster) -> list[str]:
    return [e["reason"] for e in cluster.event_log]


# --- item 2: a drill never changes what a real action decides ------------------------------------


def test_a_drill_in_a_new_term_does_not_turn_a_gate_off_cluster_into_isolation() -> None:
    """Served but ignored (gate off): a real fault must drain the node. A drill in the next term, before
    any real fault, must not leave a "discovery only" answer behind that isolates the GPU instead."""

    async def scenario() -> None:
        cluster, clock = Cluster(acting=False), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        assert ctx.steps.isolate.support["iso"].api_version is None, "the first term's probe: node ladder"
        successor = await new_term(cluster, clock, ctx)
        drill = {keys.DRILL_ANNOTATION: "EccUncorrectable", keys.DRILL_STARTED_ANNOTATION: times.render(T0)}
        await report(cluster, successor, "n", faulty=False, annotations=drill)
        assert "Drill" in reasons(cluster)
        clock.now += datetime.timedelta(seconds=5)
        await report(cluster, successor, "n", annotations={})  # the drill is over; a real fault
        assert cluster.node_rules() == {}, "a rule the cluster ignores: the faulty GPU stays in service"
        assert cluster.nodes["n"]["spec"].get("unschedulable"), "the node ladder: cordoned and drained"

    asyncio.run(scenario())


def test_a_new_term_probes_again_before_any_fault() -> None:
    """The gate was switched on between two terms: the new term's probe says so, no fault needed."""

    async def scenario() -> None:
        cluster, clock = Cluster(acting=False), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        assert isolation_support.condition(ctx, ctx.cache.policies["iso"])["status"] == "False"
        cluster.acting = True
        successor = await new_term(cluster, clock, ctx)
        condition = isolation_support.condition(successor, successor.cache.policies["iso"])
        assert condition is not None and condition["status"] == "True", condition

    asyncio.run(scenario())


def test_a_drill_before_the_probe_says_the_answer_is_not_known_and_stores_none() -> None:
    """A drill on a policy whose probe has no answer yet words it as provisional and leaves the
    probe to the real action: the policy still says NotProbed."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        ctx.steps.isolate.support.clear()  # as before a term's first probe
        drill = {keys.DRILL_ANNOTATION: "EccUncorrectable", keys.DRILL_STARTED_ANNOTATION: times.render(T0)}
        await report(cluster, ctx, "n", faulty=False, annotations=drill)
        said = [
            e["message"] for e in cluster.event_log if e["reason"] == "Drill" and "policy iso" in e["message"]
        ]
        assert said and "not probed yet" in said[-1], said
        assert "iso" not in ctx.steps.isolate.support or not ctx.steps.isolate.support["iso"].definite
        assert cluster.node_rules() == {}

    asyncio.run(scenario())


# --- item 8: a transient error while probing --------------------------------------------------------


def test_one_transient_probe_error_does_not_turn_isolation_into_drains() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(probe_failures=1), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        await report(cluster, ctx, "n")
        assert list(cluster.node_rules()) == [device_taints.rule_name("n", FAULTY)]
        assert not cluster.nodes["n"]["spec"].get("unschedulable"), "isolated, not cordoned"

    asyncio.run(scenario())


def test_a_probe_that_keeps_failing_leaves_the_answer_unknown_and_the_node_waiting() -> None:
    """Every attempt fails: no fallback on a guess. The GPU waits (Pending), the policy says the probe
    failed (Unknown), and the probe is tried again later; once it answers, the GPU is isolated."""

    async def scenario() -> None:
        cluster, clock = Cluster(probe_failures=1000), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        condition = isolation_support.condition(ctx, ctx.cache.policies["iso"])
        assert condition is not None and condition["status"] == "Unknown", condition
        assert "503" in condition["message"]
        await report(cluster, ctx, "n")
        assert not cluster.nodes["n"]["spec"].get("unschedulable"), "no fallback on an unknown answer"
        assert cluster.gpunodes["n"]["status"].get("action") == "Pending"
        cluster.probe_failures = 0
        for _ in range(15):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert list(cluster.node_rules()) == [device_taints.rule_name("n", FAULTY)]
        assert not cluster.nodes["n"]["spec"].get("unschedulable")

    asyncio.run(scenario())


def test_a_probe_that_fails_for_longer_than_its_limit_takes_the_node_ladder_until_it_answers() -> None:
    """Waiting on an unknown answer is bounded: a faulty GPU is not left in service for as long as a
    webhook or an API server keeps refusing the probe. After `PROBE_FALLBACK_SECONDS` of failures the
    node is drained (the ladder works without DRA) and the policy says why; the probe is still tried,
    and once it answers, isolation resumes."""

    async def scenario() -> None:
        cluster, clock = Cluster(probe_failures=1000), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        await report(cluster, ctx, "n")
        assert not cluster.nodes["n"]["spec"].get("unschedulable"), "no fallback on one bad moment"
        for _ in range(int(isolation_support.PROBE_FALLBACK_SECONDS // 10) + 2):
            clock.now += datetime.timedelta(seconds=10)
            await ticker.tick(ctx)
        assert cluster.nodes["n"]["spec"].get("unschedulable"), "the faulty GPU's node was left in service"
        assert not cluster.node_rules()
        condition = isolation_support.condition(ctx, ctx.cache.policies["iso"])
        assert condition is not None and condition["reason"] == "ProbeTimedOut", condition
        assert "503" in condition["message"] and "node ladder" in condition["message"]
        cluster.probe_failures = 0
        for _ in range(3):
            clock.now += datetime.timedelta(seconds=10)
            await ticker.tick(ctx)
        condition = isolation_support.condition(ctx, ctx.cache.policies["iso"])
        assert condition is not None and condition["reason"] == "DeviceTaintRules", condition
        # The answer came: the faulty GPU gets its rule, and the drained node is not handed back while faulty.
        assert list(cluster.node_rules()) == [device_taints.rule_name("n", FAULTY)]
        assert cluster.nodes["n"]["spec"].get("unschedulable")

    asyncio.run(scenario())


# --- item 3: isolation is a disruption: the breaker and one budget over all policies -------------


def test_an_open_breaker_holds_isolations_back() -> None:
    """A storm on 20 nodes: the breaker (at most 2 new Unhealthy) opens, and no more than the cordon
    path would start is isolated; the rest wait."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        nodes = tuple(f"n{i:02}" for i in range(20))
        ctx = await start(
            cluster, clock, nodes, policy_body(maxUnavailableGPUs="100%", breaker={"maxNewUnhealthy": 2})
        )
        for name in nodes:
            await report(cluster, ctx, name)
        assert len(cluster.node_rules()) <= 2, sorted(cluster.node_rules())
        assert "Pending" in {cluster.gpunodes[n]["status"].get("action") for n in nodes}

    asyncio.run(scenario())


def test_overlapping_isolating_policies_share_the_gpu_budget() -> None:
    """Two policies over the same nodes, each allowing 1 GPU isolated: 1 GPU isolated in all."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(
            cluster,
            clock,
            ("a", "b"),
            policy_body("iso", maxUnavailableGPUs=1),
            policy_body("iso-too", maxUnavailableGPUs=1),
        )
        await report(cluster, ctx, "a")
        clock.now += datetime.timedelta(seconds=1)
        await report(cluster, ctx, "b")
        for _ in range(3):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert list(cluster.node_rules()) == [device_taints.rule_name("a", FAULTY)]
        assert cluster.gpunodes["b"]["status"].get("action") == "Pending"
        assert not cluster.nodes["b"]["spec"].get("unschedulable")

    asyncio.run(scenario())


# --- item 10: a deleted or renamed policy's rules ---------------------------------------------------


async def delete_policy(cluster: Cluster, ctx: context.Context, name: str) -> None:
    body = cluster.policies.pop(name)
    await handlers.on_policy(event("DELETED", body), memo=ctx)


def test_a_deleted_policys_rule_is_restored_when_no_isolating_policy_selects_the_node() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        await report(cluster, ctx, "n")
        assert cluster.node_rules()
        await delete_policy(cluster, ctx, "iso")
        clock.now += datetime.timedelta(seconds=1)
        await ticker.tick(ctx)
        assert cluster.node_rules() == {}, "orphaned: a repaired GPU would stay out of service for good"
        restored = [e["message"] for e in cluster.event_log if e["reason"] == "GPURestored"]
        assert restored and "deleted" in restored[-1], restored

    asyncio.run(scenario())


def test_a_policy_deleted_while_the_operator_was_down_has_its_rule_restored() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        await report(cluster, ctx, "n")
        assert cluster.node_rules()
        cluster.policies.pop("iso")  # deleted while no operator ran: no event ever comes
        restarted = new_context(cluster, clock)  # a new process: a new cache, filled by priming
        for name, node in cluster.nodes.items():
            await handling.handle(handlers.on_node, event("ADDED", node), restarted)
            await handling.handle(handlers.on_gpunode, event("ADDED", cluster.gpunodes[name]), restarted)
        clock.now += datetime.timedelta(seconds=1)
        await ticker.tick(restarted)
        assert cluster.node_rules() == {}

    asyncio.run(scenario())


def test_a_deleted_policys_rule_is_adopted_by_another_isolating_policy_of_the_node() -> None:
    """Renamed (deleted, created anew under another name): the new policy adopts the rule, keeps the GPU
    isolated while it is faulty, and restores it once it has recovered."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body("old"))
        await report(cluster, ctx, "n")
        rule = device_taints.rule_name("n", FAULTY)
        assert cluster.node_rules() == {rule: "old"}
        renamed = policy_body("new")
        cluster.policies["new"] = renamed
        await handlers.on_policy(event("ADDED", renamed), memo=ctx)
        await delete_policy(cluster, ctx, "old")
        for _ in range(3):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert cluster.node_rules() == {rule: "new"}, "adopted, and the GPU still isolated"
        assert not cluster.nodes["n"]["spec"].get("unschedulable")
        await report(cluster, ctx, "n", faulty=False)  # repaired
        for _ in range(15):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert cluster.node_rules() == {}, "the adopting policy restores the repaired GPU"

    asyncio.run(scenario())


def test_an_adopted_rule_of_a_recovered_gpu_is_restored_at_once_not_at_the_next_report() -> None:
    """The GPU recovered while its policy was being replaced: the adopting policy restores it on the pass
    the adoption asks for, not at the next agent report or the 300 s full pass."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body("old"))
        await report(cluster, ctx, "n")
        rule = device_taints.rule_name("n", FAULTY)
        assert cluster.node_rules() == {rule: "old"}
        renamed = policy_body("new")
        cluster.policies["new"] = renamed
        await handlers.on_policy(event("ADDED", renamed), memo=ctx)
        await delete_policy(cluster, ctx, "old")
        clock.now += datetime.timedelta(seconds=5)
        await report(cluster, ctx, "n", faulty=False)  # repaired; healthy for longer than healthyForSeconds
        clock.now += datetime.timedelta(seconds=5)
        await report(cluster, ctx, "n", faulty=False)
        for _ in range(5):  # timer passes between full ones; no agent report comes (a 300 s heartbeat)
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx, full=False)
            await passes.settle(ctx)  # what the term's passes task runs meanwhile
        assert cluster.node_rules() == {}, "adopted, then restored at once: the GPU has recovered"
        said = [e["message"] for e in cluster.event_log if e["reason"] == "GPURestored"]
        assert said, reasons(cluster)

    asyncio.run(scenario())


def test_an_invalid_policys_rule_is_neither_adopted_nor_restored() -> None:
    """A policy edited into an invalid spec is still there (its error in status): its rules stay, as
    its cordons do, even with another isolating policy selecting the node."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body("iso"))
        await report(cluster, ctx, "n")
        rule = device_taints.rule_name("n", FAULTY)
        other = policy_body("other")
        cluster.policies["other"] = other
        await handlers.on_policy(event("ADDED", other), memo=ctx)
        broken = policy_body("iso", maxUnavailableGPUs="0%")
        broken["metadata"]["generation"] = 2
        await handlers.on_policy(event("MODIFIED", broken), memo=ctx)
        assert "iso" in ctx.cache.policy_errors
        for _ in range(3):
            clock.now += datetime.timedelta(seconds=1)
            await ticker.tick(ctx)
        assert cluster.node_rules() == {rule: "iso"}

    asyncio.run(scenario())


def test_an_open_breaker_names_itself_to_a_drill_and_a_new_isolation_waits_for_it() -> None:
    """The breaker's reason reaches the GPU's decision (what a dry run or drill says)."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        nodes = tuple(f"n{i}" for i in range(6))
        ctx = await start(
            cluster, clock, nodes, policy_body(maxUnavailableGPUs="100%", breaker={"maxNewUnhealthy": 1})
        )
        for name in nodes:
            await report(cluster, ctx, name)
        waiting = [
            gpu.reason
            for (_, node), state in ctx.steps.isolate.isolations.items()
            if state.decision is not None
            for gpu in state.decision.gpus
            if gpu.outcome == "Wait"
        ]
        assert waiting and all("circuit breaker" in reason for reason in waiting), waiting

    asyncio.run(scenario())


def test_a_drill_while_the_probe_has_no_answer_says_the_gpu_would_wait() -> None:
    """The probe met only transient errors: a real fault would wait, and the drill says so."""

    async def scenario() -> None:
        cluster, clock = Cluster(probe_failures=1000), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body())
        drill = {keys.DRILL_ANNOTATION: "EccUncorrectable", keys.DRILL_STARTED_ANNOTATION: times.render(T0)}
        await report(cluster, ctx, "n", faulty=False, annotations=drill)
        said = [
            e["message"] for e in cluster.event_log if e["reason"] == "Drill" and "policy iso" in e["message"]
        ]
        assert said and "wait to isolate the faulty GPU" in said[-1] and "503" in said[-1], said
        assert not ctx.steps.isolate.support["iso"].definite, "the drill stored no answer"

    asyncio.run(scenario())


def drain_policy() -> dict[str, Any]:
    body = policy_body("drain")
    body["spec"]["rules"] = [{"name": "xid", "condition": "XidCritical", "action": "Drain"}]
    return body


@pytest.mark.parametrize("restarted", [False, True])
def test_the_last_isolating_policy_deleted_beside_another_policy_has_its_rule_restored(
    restarted: bool,
) -> None:
    """A Drain policy selects the node too and rewrites its GPUNode status (no isolated GPUs listed
    any more) before the sweep: the rule is still found, live and after a restart."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ("n",), policy_body("iso"), drain_policy())
        await report(cluster, ctx, "n")
        assert cluster.node_rules()
        if restarted:
            cluster.policies.pop("iso")
            ctx = new_context(cluster, clock)
            await handlers.on_policy(event("ADDED", cluster.policies["drain"]), memo=ctx)
            await handling.handle(handlers.on_node, event("ADDED", cluster.nodes["n"]), ctx)
            await handling.handle(handlers.on_gpunode, event("ADDED", cluster.gpunodes["n"]), ctx)
        else:
            await delete_policy(cluster, ctx, "iso")
        for _ in range(3):
            clock.now += datetime.timedelta(seconds=1)
            await report(cluster, ctx, "n")
            await ticker.tick(ctx, full=True)
        assert not cluster.gpunodes["n"]["status"].get(isolating.STATUS_FIELD)
        assert cluster.node_rules() == {}

    asyncio.run(scenario())
