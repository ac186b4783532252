"""IsolateGPU beside a second acting policy on the same node (issue 24 item 7), on the in-memory cluster.

The GPUNode status reports the acting policies' strongest verdict, which may be the other policy's
(a drain for an Xid) or, on a tie, the first by name. What a fleet operator must see either way:
the DeviceTaintRule exists exactly while its GPU is faulty, `status.isolatedGPUs` and
`isolatedFraction` list the isolated GPU whichever verdict is shown, a restarted operator neither
isolates again nor loses the isolation, and `ACTION` shows `Isolated` where the isolation is the
strongest action of the strongest health.
"""

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
from gpuhealth_operator.decisions import device_taints
from gpuhealth_operator.ladder.isolate import device_rules, isolating
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context
from gpuhealth_sim.backtest import memcluster

GPUS = 8
DBE = 3
"""The GPU with the double-bit ECC error, isolated."""
XID = 5
"""The GPU with a critical Xid, which drains the node under the second policy."""
HOT = 0
VERSION = "v1beta2"
T0 = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)
RULE = device_taints.rule_name("n", DBE)


def policy_body(name: str, rules: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "rules": rules,
            "isolation": {"maxGPUsPerNode": 2},
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
            **spec,
        },
    }


ISOLATE = policy_body("iso", [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}])
DRAIN = policy_body("drain", [{"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": [79]}])
"""Sorts before `iso`, and its drain is the stronger action once an Xid fires."""
THERMAL = policy_body(
    "a-fleet",
    [
        {"name": "hot", "condition": "ThermalThrottled", "action": "Label"},
        {"name": "ecc", "condition": "EccUncorrectable", "action": "Label"},
    ],
)
"""Sorts before `iso` and judges the ECC fault too (Unhealthy, Labeled): a tie on health."""


def event(kind: str, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": copy.deepcopy(body)}  # type: ignore[typeddict-item]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


class Cluster(memcluster.MemoryKube):
    def node_rules(self) -> dict[str, str]:
        """Rule name → its policy label, the probes' left out."""
        return {
            name: rule["metadata"]["labels"][keys.POLICY_LABEL]
            for name, rule in self.rules.items()
            if keys.NODE_LABEL in rule["metadata"].get("labels", {})
        }

    def status(self) -> dict[str, Any]:
        return dict(self.gpunodes["n"]["status"])

    def reasons(self, reason: str) -> list[str]:
        return [e["message"] for e in self.event_log if e["reason"] == reason]


@pytest.fixture(autouse=True)
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_rules, "PROBE_TIMEOUT_SECONDS", 0.05)
    monkeypatch.setattr(device_rules, "PROBE_POLL_SECONDS", 0.01)


def new_context(cluster: Cluster, clock: Clock) -> context.Context:
    ctx = operator_context.new_context(cluster, clock=clock)  # type: ignore[arg-type]
    return ctx


async def start(cluster: Cluster, clock: Clock, *policies: dict[str, Any]) -> context.Context:
    ctx = new_context(cluster, clock)
    cluster.serve_device_taint_rules(VERSION)
    for body in policies:
        cluster.policies[body["metadata"]["name"]] = copy.deepcopy(body)
        await handlers.on_policy(event("ADDED", body), memo=ctx)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "uid": "uid-n", "labels": {keys.GPU_COUNT_LABEL: str(GPUS)}},
        "spec": {},
        "status": {"capacity": {keys.GPU_RESOURCE: str(GPUS)}},
    }
    cluster.put_node(copy.deepcopy(node))
    await handling.handle(handlers.on_node, event("ADDED", node), ctx)
    cluster.put_slice(gpunode_facts.resource_slice("n", GPUS))
    await report(cluster, ctx, clock)
    return ctx


async def restart(cluster: Cluster, clock: Clock) -> context.Context:
    """A new process: a new cache filled from the cluster, kopf lists the policies, Nodes, GPUNodes."""
    ctx = new_context(cluster, clock)
    for body in cluster.policies.values():
        await handlers.on_policy(event("ADDED", body), memo=ctx)
    await handling.handle(handlers.on_node, event("ADDED", cluster.nodes["n"]), ctx)
    await handling.handle(handlers.on_gpunode, event("ADDED", cluster.gpunodes["n"]), ctx)
    return ctx


async def report(
    cluster: Cluster,
    ctx: context.Context,
    clock: Clock,
    *,
    dbe: bool = False,
    xid: bool = False,
    hot: bool = False,
    xid_code: int = 79,
    after: float = 1,
) -> None:
    """`after` seconds later, the agent's report, then a full timer pass."""
    clock.now += datetime.timedelta(seconds=after)
    overrides: dict[int, dict[str, Any]] = {}
    if dbe:
        overrides[DBE] = {"ecc": {"uncorrectedVolatile": 1}}
    if xid:
        overrides[XID] = {"xids": [{"code": xid_code, "count": 1}]}
    if hot:
        overrides[HOT] = {"temperatureCelsius": 95, "slowdownTemperatureCelsius": 90}
    stored = cluster.put_gpunode("n", gpunode_facts.agent_status(gpus=GPUS, overrides=overrides))
    await handling.handle(handlers.on_gpunode, event("MODIFIED", stored), ctx)
    await ticker.tick(ctx, full=True)


def isolated(status: dict[str, Any]) -> list[tuple[int, str, str]]:
    """What the GPUNode shows isolated: (index, rule, state) per GPU."""
    return [(g.get("index"), g["rule"], g["state"]) for g in status.get(isolating.STATUS_FIELD) or []]


def by_policy(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {p["policy"]: (p["health"], p["action"]) for p in status.get("policies") or []}


def assert_isolated(cluster: Cluster) -> None:
    """The GPU is isolated by policy iso, and the GPUNode says so whichever verdict it shows."""
    assert cluster.node_rules() == {RULE: "iso"}
    status = cluster.status()
    assert isolated(status) == [(DBE, RULE, "Isolated")], (status.get("action"), status.get("policies"))
    assert status.get(isolating.FRACTION_FIELD) == f"1/{GPUS}"


def assert_restored(cluster: Cluster) -> None:
    assert cluster.node_rules() == {}, "the repaired GPU is still kept out of service"
    status = cluster.status()
    assert isolating.STATUS_FIELD not in status and isolating.FRACTION_FIELD not in status, status


async def recover(cluster: Cluster, ctx: context.Context, clock: Clock) -> None:
    for _ in range(5):  # healthyForSeconds 2, and the uncordon's
        await report(cluster, ctx, clock)


def test_the_isolated_gpu_stays_listed_while_a_drain_policys_verdict_is_shown() -> None:
    """DBE on GPU 3 (isolated), then a critical Xid on GPU 5 (policy drain drains the node: its verdict
    is shown), then the operator restarts, then both GPUs recover."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, DRAIN)
        await report(cluster, ctx, clock, dbe=True)
        assert_isolated(cluster)
        assert cluster.status()["action"] == "Isolated"
        assert by_policy(cluster.status()) == {
            "drain": ("Unhealthy", "None"),
            "iso": ("Unhealthy", "Isolated"),
        }

        await report(cluster, ctx, clock, dbe=True, xid=True)
        assert cluster.nodes["n"]["spec"].get("unschedulable"), "the Xid drains the node"
        assert cluster.status()["action"] in {"Draining", "Drained"}, "the drain is the strongest action"
        assert by_policy(cluster.status())["iso"] == ("Unhealthy", "Isolated")
        assert_isolated(cluster)
        assert "drain" not in ctx.steps.isolate.support, "a policy without IsolateGPU probes nothing"

        ctx = await restart(cluster, clock)
        for _ in range(3):
            await report(cluster, ctx, clock, dbe=True, xid=True)
            assert_isolated(cluster)
        assert len(cluster.reasons("GPUIsolated")) == 1, "isolated again after the restart"
        assert cluster.reasons("GPURestored") == [] and cluster.reasons("OverriddenByUser") == []
        assert "drain" not in ctx.steps.isolate.support, "a policy without IsolateGPU probes nothing"

        await recover(cluster, ctx, clock)
        assert_restored(cluster)
        assert len(cluster.reasons("GPURestored")) == 1
        assert cluster.status()["action"] == "None"

    asyncio.run(scenario())


def test_a_gpu_that_recovered_while_the_operator_was_down_is_restored_beside_a_drain_policy() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, DRAIN)
        await report(cluster, ctx, clock, dbe=True)
        await report(cluster, ctx, clock, dbe=True, xid=True)
        assert_isolated(cluster)

        ctx = await restart(cluster, clock)  # the GPUs were repaired while no operator ran
        await recover(cluster, ctx, clock)
        assert_restored(cluster)
        assert len(cluster.reasons("GPUIsolated")) == 1
        assert len(cluster.reasons("GPURestored")) == 1

    asyncio.run(scenario())


def test_isolated_shows_as_the_action_on_a_tie_and_after_the_other_policy_is_deleted() -> None:
    """`a-fleet` labels the ECC fault and heat (Unhealthy, Labeled, first by name); `iso` isolates
    (Unhealthy, Isolated): the isolation is the strongest action, so ACTION shows it, before and
    after a restart and once `a-fleet` is deleted."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, THERMAL)
        await report(cluster, ctx, clock, dbe=True)
        assert_isolated(cluster)
        await report(cluster, ctx, clock, dbe=True, hot=True)
        assert cluster.nodes["n"]["metadata"]["labels"].get(keys.THERMAL_LABEL) == "true"
        assert by_policy(cluster.status()) == {
            "a-fleet": ("Unhealthy", "Labeled"),
            "iso": ("Unhealthy", "Isolated"),
        }
        assert cluster.status()["action"] == "Isolated"
        assert_isolated(cluster)

        ctx = await restart(cluster, clock)
        await report(cluster, ctx, clock, dbe=True, hot=True)
        assert cluster.status()["action"] == "Isolated"
        assert_isolated(cluster)

        body = cluster.policies.pop("a-fleet")
        await handlers.on_policy(event("DELETED", body), memo=ctx)
        await report(cluster, ctx, clock, dbe=True, hot=True)
        assert "policies" not in cluster.status()
        assert cluster.status()["action"] == "Isolated"
        assert_isolated(cluster)
        assert len(cluster.reasons("GPUIsolated")) == 1

        await recover(cluster, ctx, clock)
        assert_restored(cluster)

    asyncio.run(scenario())


def test_a_thermal_verdict_shown_after_the_dbe_clears_still_lists_the_gpu_until_it_is_restored() -> None:
    """The DBE clears while the node stays hot: `a-fleet`'s Degraded is the most severe health, so its
    Labeled is shown, while the rule stands for healthyForSeconds; the GPU is listed until it goes."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, THERMAL)
        await report(cluster, ctx, clock, dbe=True, hot=True)
        assert_isolated(cluster)
        await report(cluster, ctx, clock, hot=True, after=0.5)  # the DBE is gone; the rule not yet
        assert cluster.status()["health"] == "Degraded"
        assert cluster.node_rules() == {RULE: "iso"}
        assert_isolated(cluster)
        for _ in range(4):
            await report(cluster, ctx, clock, hot=True)
        assert_restored(cluster)
        assert cluster.status()["action"] == "Labeled"

    asyncio.run(scenario())


def test_deleting_the_drain_policy_keeps_the_isolation_listed() -> None:
    """The deleted policy's drain stays (as documented: a human uncordons), so the strongest action
    is still the drain; the GPU stays isolated and listed."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, DRAIN)
        await report(cluster, ctx, clock, dbe=True, xid=True)
        assert_isolated(cluster)
        body = cluster.policies.pop("drain")
        await handlers.on_policy(event("DELETED", body), memo=ctx)
        await report(cluster, ctx, clock, dbe=True, xid=True)
        assert "policies" not in cluster.status()
        assert cluster.nodes["n"]["spec"].get("unschedulable")
        assert cluster.status()["action"] == "Drained"
        assert_isolated(cluster)
        assert len(cluster.reasons("GPUIsolated")) == 1

    asyncio.run(scenario())


ISOLATE_XID = policy_body(
    "iso-xid",
    [{"name": "xid", "condition": "XidCritical", "action": "IsolateGPU", "xids": [48]}],
    maxUnavailableGPUs=2,
)
"""A second isolating policy (Xid 48, a GPU's own DBE, on GPU 5), sorting after `iso`; room for both."""


def test_two_isolating_policies_gpus_are_both_listed_and_each_restored_by_its_own_policy() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(
            cluster, clock, {**ISOLATE, "spec": {**ISOLATE["spec"], "maxUnavailableGPUs": 2}}, ISOLATE_XID
        )
        await report(cluster, ctx, clock, dbe=True, xid=True, xid_code=48)
        xid_rule = device_taints.rule_name("n", XID)
        want = [(DBE, RULE, "Isolated"), (XID, xid_rule, "Isolated")]
        assert cluster.node_rules() == {RULE: "iso", xid_rule: "iso-xid"}
        assert isolated(cluster.status()) == want
        assert cluster.status().get(isolating.FRACTION_FIELD) == f"2/{GPUS}"
        assert cluster.status()["action"] == "Isolated"

        ctx = await restart(cluster, clock)
        for _ in range(3):
            await report(cluster, ctx, clock, dbe=True, xid=True, xid_code=48)
        assert cluster.node_rules() == {RULE: "iso", xid_rule: "iso-xid"}
        assert isolated(cluster.status()) == want
        assert len(cluster.reasons("GPUIsolated")) == 2
        assert cluster.reasons("OverriddenByUser") == [] and cluster.reasons("GPURestored") == []

        for _ in range(5):  # the Xid GPU is repaired, the DBE one is not
            await report(cluster, ctx, clock, dbe=True)
        assert cluster.node_rules() == {RULE: "iso"}
        assert isolated(cluster.status()) == [(DBE, RULE, "Isolated")]
        assert cluster.status().get(isolating.FRACTION_FIELD) == f"1/{GPUS}"

    asyncio.run(scenario())


def test_a_rule_a_human_deletes_while_the_drain_is_shown_is_listed_overridden_once() -> None:
    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, DRAIN)
        await report(cluster, ctx, clock, dbe=True, xid=True)
        assert_isolated(cluster)
        del cluster.rules[RULE]  # kubectl delete devicetaintrule
        for _ in range(12):  # the rule list is read again within 10 s
            await report(cluster, ctx, clock, dbe=True, xid=True)
        assert cluster.node_rules() == {}, "isolated again on the same evidence"
        status = cluster.status()
        assert isolated(status) == [(DBE, RULE, "Overridden")]
        assert isolating.FRACTION_FIELD not in status
        assert len(cluster.reasons("OverriddenByUser")) == 1

        ctx = await restart(cluster, clock)
        for _ in range(3):
            await report(cluster, ctx, clock, dbe=True, xid=True)
        assert cluster.node_rules() == {}, "isolated again after a restart on the same evidence"
        assert isolated(cluster.status()) == [(DBE, RULE, "Overridden")]
        assert len(cluster.reasons("OverriddenByUser")) == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("restarted", [False, True])
def test_a_policy_edited_to_drop_isolategpu_restores_its_gpu_live_and_after_a_restart(
    restarted: bool,
) -> None:
    """`iso` loses its IsolateGPU rule (now it only labels the fault) beside the drain policy: its rule
    is restored as it is live, also when the operator restarts in between (its GPU is listed in the
    status it no longer reads back as its own)."""

    async def scenario() -> None:
        cluster, clock = Cluster(), Clock()
        ctx = await start(cluster, clock, ISOLATE, DRAIN)
        await report(cluster, ctx, clock, dbe=True)
        assert_isolated(cluster)
        edited = policy_body("iso", [{"name": "ecc", "condition": "EccUncorrectable", "action": "Label"}])
        edited["metadata"]["generation"] = 2
        cluster.policies["iso"] = edited
        if restarted:
            ctx = await restart(cluster, clock)
        else:
            await handlers.on_policy(event("MODIFIED", edited), memo=ctx)
        for _ in range(4):
            await report(cluster, ctx, clock, dbe=True)
        assert_restored(cluster)
        assert len(cluster.reasons("GPURestored")) == 1

    asyncio.run(scenario())
