"""A node the GPU Operator is upgrading the driver of, or reconfiguring MIG on, is in maintenance.

Issue 30, item 3. While the GPU Operator's upgrade controller (k8s-operator-libs) moves a node through
`nvidia.com/gpu-driver-upgrade-state`, or mig-manager through `nvidia.com/mig.config.state`, the GPUs
vanish for minutes. Before, that was GPULost: the node was cordoned and drained, counted by the breaker,
and GPUHealthy False invited MachineHealthCheck/NHC to replace it. Now it is health Unknown (condition
GPUOperatorMaintenance), no disruptive action, no breaker count, GPUHealthy Unknown with that reason.
The label values are the ones those projects set (see docs/operations.md, "GPU Operator").
"""

import asyncio
import copy
import datetime
from collections.abc import Mapping
from typing import Any, cast

import pytest

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import conditions, keys, resources, vocabulary
from gpuhealth_operator.decisions import model, overrides, policies, signals, verdicts
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_sim.backtest import memcluster

Condition = vocabulary.Condition
Health = vocabulary.Health
T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
UPGRADE = keys.GPU_DRIVER_UPGRADE_STATE_LABEL
MIG = keys.MIG_CONFIG_STATE_LABEL
GPU_LABELS = {"pool": "gpu", keys.GPU_COUNT_LABEL: "8", keys.GPU_PRESENT_LABEL: "true"}


class Fleet:
    """Nodes, their agents' reports and one policy, judged by the operator's handlers and timer on an
    in-memory cluster under a test clock."""

    def __init__(self, *, uncordon: bool = True) -> None:
        self.cluster: Any = cast(Any, memcluster.MemoryKube())
        self.ctx = operator_context.new_context(self.cluster)
        self.now = T0
        self.ctx.clock = lambda: self.now
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [
                {"name": "lost", "condition": "GPULost", "action": "Drain"},
                {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            ],
            "maxUnavailable": "100%",
            "breaker": {"maxNewUnhealthy": 1, "windowSeconds": 3600},
            "recovery": {"healthyForSeconds": 0, "uncordon": uncordon},
        }
        self.policy: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        self.policy |= {"metadata": {"name": "p", "generation": 1}, "spec": spec}

    async def start(self, names: list[str]) -> None:
        await handlers.on_policy({"type": "ADDED", "object": self.policy}, memo=self.ctx)  # type: ignore[typeddict-item]
        for name in names:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "uid": name, "labels": dict(GPU_LABELS)},
                "spec": {},
            }
            self.cluster.put_node(copy.deepcopy(node))
            await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, self.ctx)
            await self.report(name)

    async def label(self, name: str, labels: Mapping[str, str | None]) -> None:
        """The GPU Operator (or mig-manager) relabels the node."""
        node = copy.deepcopy(self.cluster.nodes[name])
        current = node["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        stored = self.cluster.put_node(node)
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def report(self, name: str, *, gpus: int = 8, **per_gpu: Any) -> None:
        status = gpunode_facts.agent_status(
            gpus=gpus,
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides=dict.fromkeys(range(gpus), per_gpu),
        )
        status["agent"]["expectedGpuCount"] = 8
        status["agent"]["maxGpuCountSeen"] = 8
        stored = self.cluster.put_gpunode(name, status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)
        await ticker.tick(self.ctx, full=True)

    def cordoned(self, name: str) -> bool:
        return bool(self.cluster.nodes[name]["spec"].get("unschedulable"))

    def health(self, name: str) -> str | None:
        health = self.cluster.gpunodes[name].get("status", {}).get("health")
        return str(health) if health is not None else None

    def node_condition(self, name: str) -> Mapping[str, Any]:
        found = [
            c
            for c in self.cluster.nodes[name].get("status", {}).get("conditions", [])
            if c.get("type") == keys.NODE_CONDITION_TYPE
        ]
        assert found, f"no {keys.NODE_CONDITION_TYPE} condition on {name}"
        return dict(found[0])

    def turned_unhealthy(self) -> Mapping[str, datetime.datetime]:
        return self.ctx.verdicts.turned_unhealthy.get("p", {})


@pytest.mark.parametrize(
    ("label", "state"),
    [
        (UPGRADE, "pod-restart-required"),
        (UPGRADE, "validation-required"),
        (MIG, "pending"),
        (MIG, "rebooting"),
    ],
)
def test_a_node_in_gpu_operator_maintenance_whose_gpus_vanish_is_unknown_and_untouched(
    label: str, state: str
) -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        assert fleet.health("n") == "Healthy"
        await fleet.label("n", {label: state})
        await fleet.report("n", gpus=0)  # the driver unloaded: NVML lists no GPU
        await fleet.tick(30)
        for _ in range(10):  # ten minutes, the agent reporting every minute: not stale
            await fleet.report("n", gpus=8, lost=True)  # or lists them lost
            await fleet.tick(60)
        assert fleet.health("n") == "Unknown"
        assert not fleet.cordoned("n")
        assert "n" not in fleet.turned_unhealthy(), "no breaker count"
        condition = fleet.node_condition("n")
        assert (condition["status"], condition["reason"]) == ("Unknown", "GPUOperatorMaintenance")
        assert state in condition["message"]
        assert fleet.cluster.nodes["n"]["metadata"]["labels"][keys.HEALTH_LABEL] == "healthy"  # left as is

    asyncio.run(scenario())


def test_once_the_upgrade_is_done_and_the_gpus_are_back_the_node_is_healthy_and_nothing_happened() -> None:
    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        for state in ("cordon-required", "wait-for-jobs-required"):
            await fleet.label("n", {UPGRADE: state})
            await fleet.report("n")  # jobs still run on the old driver: the GPUs are there
            await fleet.tick(60)
        await fleet.label("n", {UPGRADE: "pod-restart-required"})
        await fleet.report("n", gpus=0)  # the driver unloads
        await fleet.tick(60)
        await fleet.label("n", {UPGRADE: "uncordon-required"})
        await fleet.report("n")  # the new driver is loaded: all 8 GPUs back
        await fleet.tick(60)
        await fleet.label("n", {UPGRADE: "upgrade-done"})
        await fleet.tick(60)
        assert fleet.health("n") == "Healthy"
        assert not fleet.cordoned("n")
        assert fleet.turned_unhealthy() == {}
        assert fleet.node_condition("n")["status"] == "True"

    asyncio.run(scenario())


def test_the_label_that_ends_the_upgrade_seen_before_the_report_of_the_gpus_back_is_no_fault() -> None:
    """The label and the agent's report come through two watches, in either order: for a grace after
    the maintenance the facts stay unknown; GPUs still lost after it are judged."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n", "m"])
        for name in ("n", "m"):
            await fleet.label(name, {UPGRADE: "pod-restart-required"})
            await fleet.report(name, gpus=8, lost=True)
        await fleet.tick(30)
        for name in ("n", "m"):
            await fleet.label(name, {UPGRADE: "upgrade-done"})  # seen before the report of the GPUs back
        await fleet.tick(1)
        assert fleet.health("n") == "Unknown"
        assert not fleet.cordoned("n")
        await fleet.report("n")
        await fleet.tick(30)
        await fleet.report("m", gpus=8, lost=True)  # still lost after the driver upgrade
        await fleet.tick(30)
        assert fleet.health("n") == "Healthy"
        assert not fleet.cordoned("n")
        assert fleet.turned_unhealthy().keys() == {"m"}
        assert fleet.health("m") == "Unhealthy"
        assert fleet.cordoned("m"), "lost GPUs after the grace are judged as any node's"

    asyncio.run(scenario())


@pytest.mark.parametrize(("label", "state"), [(UPGRADE, "upgrade-failed"), (MIG, "failed")])
def test_a_failed_upgrade_whose_gpus_are_lost_is_judged_as_any_node(label: str, state: str) -> None:
    """A failed upgrade is no maintenance: nobody is going to bring the GPUs back, the node is broken."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        await fleet.label("n", {label: state})
        await fleet.report("n", gpus=8, lost=True)
        await fleet.tick(30)
        assert fleet.health("n") == "Unhealthy"
        assert fleet.cordoned("n"), "drained per policy"
        assert fleet.cluster.nodes["n"]["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == "p"
        assert "n" in fleet.turned_unhealthy()
        assert fleet.node_condition("n")["status"] == "False"

    asyncio.run(scenario())


def test_upgrade_required_is_queued_not_maintenance() -> None:
    """upgrade-required only says the driver pod is outdated; the node may wait hours for its turn."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.label("n", {UPGRADE: "upgrade-required"})
        await fleet.report("n", gpus=8, lost=True)
        await fleet.tick(30)
        assert fleet.health("n") == "Unhealthy"
        assert fleet.cordoned("n")

    asyncio.run(scenario())


def test_a_node_we_cordoned_for_ecc_that_enters_a_driver_upgrade_keeps_our_cordon_until_it_is_over() -> None:
    """The driver reload clears the volatile ECC counters: no uncordon while the GPU Operator still works
    on the node, ours once it is done (the node is ours and recovered)."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.report("n", ecc={"uncorrectedVolatile": 2})
        await fleet.tick(30)
        assert fleet.cordoned("n")
        turned = dict(fleet.turned_unhealthy())
        assert "n" in turned
        # The GPU Operator starts its upgrade: the node is already cordoned (it notes that itself).
        await fleet.label("n", {UPGRADE: "cordon-required"})
        await fleet.tick(30)
        await fleet.label("n", {UPGRADE: "pod-restart-required"})
        await fleet.report("n", gpus=0)
        await fleet.tick(60)
        await fleet.label("n", {UPGRADE: "validation-required"})
        await fleet.report("n")  # the new driver: all GPUs back, volatile ECC counters reset
        await fleet.tick(120)
        assert fleet.cordoned("n"), "no uncordon by us during maintenance"
        assert fleet.health("n") == "Unknown"
        assert dict(fleet.turned_unhealthy()) == turned, "no new breaker count"
        await fleet.label("n", {UPGRADE: "upgrade-done"})
        await fleet.tick(60)
        assert fleet.health("n") == "Healthy"
        assert not fleet.cordoned("n"), "ours, and recovered"

    asyncio.run(scenario())


def test_a_running_drain_of_ours_stops_when_the_gpu_operator_takes_the_node() -> None:
    """Like the exclude label: the GPU Operator's own wait-for-jobs/drain is in charge of the workloads."""
    fleet = Fleet()
    asyncio.run(fleet.start(["n"]))
    assert stopping.why_stop(fleet.ctx, "p", "n") is None
    asyncio.run(fleet.label("n", {UPGRADE: "pod-restart-required"}))
    reason = stopping.why_stop(fleet.ctx, "p", "n")
    assert reason is not None
    assert "pod-restart-required" in reason
    asyncio.run(fleet.label("n", {UPGRADE: "upgrade-done"}))
    assert stopping.why_stop(fleet.ctx, "p", "n") is None


# The decision core, without a cluster.
POLICY = policies.parse_policy(
    "default",
    1,
    {
        "nodeSelector": {"matchLabels": {"pool": "gpu"}},
        "rules": [{"name": "lost", "condition": "GPULost", "action": "Drain"}],
        "recovery": {"healthyForSeconds": 0, "uncordon": True},
    },
)


def facts(gpus: int = 0) -> Any:
    status = gpunode_facts.agent_status(gpus=gpus, heartbeat=gpunode_facts.rfc3339(T0))
    status["agent"]["maxGpuCountSeen"] = 8
    return status


@pytest.mark.parametrize(
    ("state", "maintenance"),
    [
        ("upgrade-required", False),
        # Issue 45, item 4: before the driver pod restarts the GPUs are there and jobs run on them.
        ("cordon-required", False),
        ("wait-for-jobs-required", False),
        ("pod-deletion-required", False),
        ("drain-required", False),
        ("node-maintenance-required", False),
        ("post-maintenance-required", False),
        ("pod-restart-required", True),
        ("validation-required", True),
        ("uncordon-required", False),
        ("upgrade-done", False),
        ("upgrade-failed", False),
        ("", False),
    ],
)
def test_which_driver_upgrade_states_are_maintenance(state: str, maintenance: bool) -> None:
    node = model.NodeView("n", labels={**GPU_LABELS, UPGRADE: state})
    verdict = verdicts.judge(POLICY, node, facts(), {}, None, T0)
    assert (verdict.health is Health.UNKNOWN) is maintenance
    assert (verdict.wanted_action is None) is maintenance


@pytest.mark.parametrize(
    ("state", "maintenance"), [("pending", True), ("rebooting", True), ("success", False)]
)
def test_which_mig_states_are_maintenance(state: str, maintenance: bool) -> None:
    node = model.NodeView("n", labels={**GPU_LABELS, MIG: state})
    found = signals.gpu_operator_maintenance(node.labels)
    assert (found is not None) is maintenance


def test_maintenance_is_no_new_evidence_after_a_human_override_and_no_rule_names_it() -> None:
    node = model.NodeView("n", labels={**GPU_LABELS, UPGRADE: "pod-restart-required"})
    verdict = verdicts.judge(POLICY, node, facts(), {}, None, T0)
    assert verdict.conditions[Condition.GPU_OPERATOR_MAINTENANCE].status == "True"
    evidence = overrides.gather(verdict, facts(), frozenset())
    assert Condition.GPU_OPERATOR_MAINTENANCE.value not in evidence.episodes
    assert Condition.GPU_OPERATOR_MAINTENANCE not in conditions.RULE_CONDITIONS


def test_a_lost_gpu_held_from_before_the_maintenance_stays_as_it_was() -> None:
    """Maintenance holds every fact condition: neither cleared (no uncordon) nor newly set."""
    node = model.NodeView("n", labels=dict(GPU_LABELS))
    first = verdicts.judge(POLICY, node, facts(), {}, None, T0)
    assert first.health is Health.UNHEALTHY
    upgrading = model.NodeView("n", labels={**GPU_LABELS, UPGRADE: "pod-restart-required"})
    later = T0 + datetime.timedelta(seconds=60)
    held = verdicts.judge(POLICY, upgrading, facts(8), first.conditions, None, later)
    assert held.health is Health.UNKNOWN
    assert held.conditions[Condition.GPU_LOST].status == "True"
    assert not held.recovered
    assert held.wanted_action is None


# Issue 45, item 4: only the states where the driver really goes away make the facts unknown, and for a
# bounded time.


def events(fleet: Fleet, reason: str) -> list[Mapping[str, Any]]:
    return [e for e in fleet.cluster.event_log if e["reason"] == reason]


@pytest.mark.parametrize(
    "state", ["cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required"]
)
def test_an_ecc_error_while_jobs_still_run_in_an_early_upgrade_state_is_judged(state: str) -> None:
    """Jobs run on the GPUs until the driver pod restarts (the GPU Operator's default wait for jobs lasts
    as long as the longest job): a fault then is judged as on any node, whoever set the label."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        await fleet.label("n", {UPGRADE: state})
        await fleet.report("n", ecc={"uncorrectedVolatile": 1})
        await fleet.tick(30)
        assert fleet.health("n") == "Unhealthy"
        assert fleet.cordoned("n")
        assert fleet.cluster.nodes["n"]["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == "p"
        assert events(fleet, "EccUncorrectable")

    asyncio.run(scenario())


def test_a_drain_of_ours_goes_on_while_the_gpu_operator_only_drains_too() -> None:
    fleet = Fleet()
    asyncio.run(fleet.start(["n"]))
    asyncio.run(fleet.label("n", {UPGRADE: "drain-required"}))
    assert stopping.why_stop(fleet.ctx, "p", "n") is None


@pytest.mark.parametrize(("label", "state"), [(UPGRADE, "pod-restart-required"), (MIG, "rebooting")])
def test_a_maintenance_that_outlasts_its_limit_is_judged_again_and_said_so(label: str, state: str) -> None:
    """A label that stays (a stuck upgrade, or anyone who can label the Node) hides faults for at most
    MAINTENANCE_LIMIT_SECONDS: then the facts are judged again and a Warning Event says why, also after
    an operator restart (the clock is the GPUOperatorMaintenance condition's, kept in GPUNode status)."""

    async def scenario() -> None:
        fleet = Fleet()
        await fleet.start(["n"])
        await fleet.tick(1)
        await fleet.label("n", {label: state})
        await fleet.report("n", ecc={"uncorrectedVolatile": 1})
        await fleet.tick(30)
        assert fleet.health("n") == "Unknown"
        assert not fleet.cordoned("n")
        limit = verdicts.MAINTENANCE_LIMIT_SECONDS
        for _ in range(int(limit // 600) - 1):
            await fleet.report("n", ecc={"uncorrectedVolatile": 1})
            await fleet.tick(600)
        assert fleet.health("n") == "Unknown", "within the limit"
        # The operator restarts from the same cluster: the limit counts from the stored condition.
        fleet.ctx = operator_context.new_context(fleet.cluster, instance="t2", clock=lambda: fleet.now)
        await handlers.on_policy({"type": "ADDED", "object": fleet.policy}, memo=fleet.ctx)  # type: ignore[typeddict-item]
        await handling.handle(
            handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(fleet.cluster.nodes["n"])}, fleet.ctx
        )
        await handling.handle(
            handlers.on_gpunode,
            {"type": "ADDED", "object": copy.deepcopy(fleet.cluster.gpunodes["n"])},
            fleet.ctx,
        )
        await fleet.report("n", ecc={"uncorrectedVolatile": 1})
        await fleet.tick(700)
        await fleet.report("n", ecc={"uncorrectedVolatile": 1})
        await fleet.tick(30)
        assert fleet.health("n") == "Unhealthy"
        assert fleet.cordoned("n")
        said = events(fleet, "GPUOperatorMaintenance")
        assert [e["type"] for e in said][-1] == "Warning"
        assert f"{limit:g}s" in said[-1]["message"] and "judged again" in said[-1]["message"]
        assert len([e for e in said if e["type"] == "Warning"]) == 1, "said once"
        assert stopping.why_stop(fleet.ctx, "p", "n") is None, "our drain goes on"

    asyncio.run(scenario())


def test_taking_the_label_off_and_on_again_does_not_restart_the_limit_nor_hide_the_fault() -> None:
    """Whoever sets the label cannot renew its hour: off and on within the grace keeps the clock of
    the stored condition; off for longer ends the maintenance, and the fault is judged at once."""

    async def scenario() -> None:
        fleet = Fleet()

        async def wait(seconds: float) -> None:  # the agents report every minute, the fault still there
            for _ in range(int(seconds // 60)):
                for name in ("n", "m"):
                    await fleet.report(name, ecc={"uncorrectedVolatile": 1})
                await fleet.tick(60)

        await fleet.start(["n", "m"])
        await fleet.tick(1)
        for name in ("n", "m"):
            await fleet.label(name, {UPGRADE: "pod-restart-required"})
        await wait(verdicts.MAINTENANCE_LIMIT_SECONDS - 300)
        assert fleet.health("n") == "Unknown" and fleet.health("m") == "Unknown"
        await fleet.label("n", {UPGRADE: None})  # n: off, and on again 30 s later
        await fleet.tick(30)
        await fleet.label("n", {UPGRADE: "pod-restart-required"})
        await fleet.label("m", {UPGRADE: None})  # m: off for longer than the grace
        await wait(120)
        assert fleet.health("m") == "Unhealthy" and fleet.cordoned("m"), "the fault judged once off"
        assert fleet.health("n") == "Unknown"
        await wait(240)
        assert fleet.health("n") == "Unhealthy", "the limit counted from the first label"
        assert "n" in fleet.turned_unhealthy(), "(its cordon waits for the breaker: m was first)"

    asyncio.run(scenario())
