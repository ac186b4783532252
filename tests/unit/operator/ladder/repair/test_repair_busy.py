"""Issue 45 items 2 and 3: no repair step, validation or new-node validation beside a workload pod, and no
phase that waits for ever for one to go.

On the in-memory cluster (`memory_fleet`) with pods put on the nodes as a scheduler (or a `nodeName`)
would bind them: the drain evicts what its options let it, and the test looks at what a user sees —
the Jobs created, the Node's annotations and labels, the GPUNode status, the Events.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import pytest

import gpunode_facts
import handling
import memory_fleet
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.runtime import handlers

RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]
RESET_ONLY = [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300}]


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test body run on a loop of its own (the unit tier has no asyncio plugin)."""

    @functools.wraps(test)
    def sync(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return sync


def fleet_with(
    *,
    drain: Mapping[str, Any] | None = None,
    steps: list[dict[str, Any]] | None = None,
    max_concurrent: int = 1,
) -> memory_fleet.MemoryFleet:
    fleet = memory_fleet.MemoryFleet(RULES)
    # The drain's deadline is the wall clock's (client.drain): the test's clock starts from it.
    fleet.now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    spec = fleet.policies[0]["spec"]
    spec["drain"] = {"timeoutSeconds": 900, **(drain or {})}
    spec["recovery"] = {"uncordon": True, "healthyForSeconds": 3600}
    spec["breaker"] = {"maxNewUnhealthy": 10}  # two faulty nodes are no fault storm here
    spec["repair"] = {
        "steps": steps or copy.deepcopy(RESET_ONLY),
        "validation": {"timeoutSeconds": 600},
        "maxConcurrent": max_concurrent,
    }
    return fleet


def report(*, faulty: bool, boot: str = "boot-1") -> dict[str, Any]:
    overrides = {0: {"ecc": {"uncorrectedVolatile": 2}}} if faulty else {}
    facts = gpunode_facts.agent_status(overrides=overrides)
    facts["agent"]["bootId"] = boot
    return facts


def pod(
    node: str,
    name: str,
    *,
    namespace: str = "team",
    owner: str | None = "ReplicaSet",
    empty_dir: bool = False,
    phase: str = "Running",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def job_kinds(fleet: memory_fleet.MemoryFleet, node: str) -> list[str]:
    """The repair Jobs created for the node, by action, in order."""
    return [
        j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL]
        for j in fleet.cluster.job_log
        if j["spec"]["template"]["spec"].get("nodeName") == node
    ]


def annotations(fleet: memory_fleet.MemoryFleet, node: str) -> Mapping[str, str]:
    return fleet.cluster.nodes[node]["metadata"].get("annotations") or {}


def action(fleet: memory_fleet.MemoryFleet, node: str) -> str | None:
    return (fleet.cluster.gpunodes[node].get("status") or {}).get("action")


def messages(fleet: memory_fleet.MemoryFleet, node: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in fleet.cluster.event_log
        if e["reason"] == reason and e["involvedObject"]["name"] == node
    ]


FAULTY: dict[int, dict[str, bool]] = {}
"""id(fleet) → node → whether its agent reports the fault: what its heartbeats say (`settle`)."""


async def deliver(fleet: memory_fleet.MemoryFleet, node: str, *, faulty: bool) -> None:
    FAULTY.setdefault(id(fleet), {})[node] = faulty
    await fleet.deliver(node, report(faulty=faulty))


async def settle(fleet: memory_fleet.MemoryFleet, seconds: float = 1.0, times: int = 3) -> None:
    """Timer passes, each after the agents' heartbeats (and the drains they start, tasks of this loop,
    a chance to run)."""
    for _ in range(times):
        fleet.now += datetime.timedelta(seconds=seconds)
        for node in list(fleet.cluster.nodes.values()):  # the Node watch: the operator's own writes too
            event = {"type": "MODIFIED", "object": copy.deepcopy(node)}
            await handling.handle(handlers.on_node, event, fleet.ctx)
        for node, faulty in FAULTY.get(id(fleet), {}).items():
            if node in fleet.cluster.gpunodes:
                await fleet.deliver(node, report(faulty=faulty))
        await fleet.tick(0)
        await asyncio.sleep(0)
        for task in list(fleet.ctx.steps.drain.tasks.values()):
            if not task.done():
                await asyncio.wait_for(asyncio.shield(task), 10)


async def drained_faulty(fleet: memory_fleet.MemoryFleet, name: str) -> None:
    await fleet.start([name])
    await deliver(fleet, name, faulty=False)
    await deliver(fleet, name, faulty=True)
    await settle(fleet)


# --- item 2: pods the drain leaves on purpose ------------------------------------------------------------


@pytest.mark.parametrize(
    ("drain", "kept"),
    [
        ({"deleteEmptyDirData": False}, {"empty_dir": True}),
        ({"excludeNamespaces": ["team"]}, {}),
    ],
    ids=["emptyDir-data-kept", "excluded-namespace"],
)
@run
async def test_no_reset_beside_a_pod_the_drain_leaves_on_purpose(
    drain: Mapping[str, Any], kept: Mapping[str, Any]
) -> None:
    fleet = fleet_with(drain=drain)
    fleet.cluster.put_pod(pod("n", "train-0", **kept))
    await drained_faulty(fleet, "n")
    await settle(fleet, 10.0)

    assert job_kinds(fleet, "n") == [], "no reset Job starts beside the training pod"
    assert fleet.cordoned("n")
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, "n"), "no cycle holds a maxConcurrent place"
    assert action(fleet, "n") == "Drained"
    (said,) = messages(fleet, "n", "RemediationPaused")
    assert said.startswith("Repair of the drained node by policy p waits: 1 workload pod(s)"), said
    assert "team/train-0" in said and "it starts once they are gone" in said, said

    del fleet.cluster.pods["team/train-0"]  # the job finished (its pod gone): now the repair starts
    await settle(fleet, 11.0)
    assert job_kinds(fleet, "n") == ["ResetGPU"]


# --- item 3: a pod that lands after a step ----------------------------------------------------------------


def job_name(fleet: memory_fleet.MemoryFleet, node: str, kind: str) -> str:
    (name,) = [
        j["metadata"]["name"]
        for j in fleet.cluster.job_log
        if j["spec"]["template"]["spec"].get("nodeName") == node
        and j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == kind
    ]
    return name


async def reset_worked(fleet: memory_fleet.MemoryFleet, node: str) -> None:
    """The node's reset Job succeeds and the agent reports the fault gone."""
    fleet.cluster.end_job(job_name(fleet, node, "ResetGPU"), True, fleet.now.timestamp())
    await settle(fleet, 1.0, times=1)
    await deliver(fleet, node, faulty=False)


@run
async def test_a_pod_that_stays_after_the_reset_fails_validation_in_time_and_frees_the_place() -> None:
    """A bare pod tolerating the cordon lands after the reset worked: no validation Job beside it, and
    not Validating for ever holding maxConcurrent 1 — the phase's deadline fails it, the single step
    left retires the node, and the node waiting behind it gets its repair."""
    fleet = fleet_with(max_concurrent=1)
    await drained_faulty(fleet, "a")
    assert job_kinds(fleet, "a") == ["ResetGPU"]
    await fleet.start(["b"])
    await deliver(fleet, "b", faulty=False)
    await deliver(fleet, "b", faulty=True)
    await settle(fleet)
    assert job_kinds(fleet, "b") == [], "b waits for a's place"

    fleet.cluster.put_pod(pod("a", "intruder", owner=None))  # tolerates the cordon; force is off
    await reset_worked(fleet, "a")
    await settle(fleet, 10.0)
    assert job_kinds(fleet, "a") == ["ResetGPU"], "no validation Job beside the pod"
    assert action(fleet, "a") == "Validating"

    await settle(fleet, 300.0)  # 600 s validation timeout from the phase's start, and a bit
    (failed,) = messages(fleet, "a", "ValidationFailed")
    assert "team/intruder" in failed, failed
    assert fleet.labels("a").get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, "a"), "its maxConcurrent place is free"
    assert fleet.cordoned("a"), "a retired node stays cordoned"
    assert job_kinds(fleet, "a") == ["ResetGPU"]
    await settle(fleet, 1.0)
    assert job_kinds(fleet, "b") == ["ResetGPU"], "the node waiting behind it is repaired"


@run
async def test_an_evictable_pod_that_lands_after_the_reset_is_drained_then_validation_runs() -> None:
    fleet = fleet_with()
    await drained_faulty(fleet, "a")
    fleet.cluster.put_pod(pod("a", "web-0"))  # a ReplicaSet's pod tolerating the cordon: evictable
    await reset_worked(fleet, "a")
    await settle(fleet, 11.0)  # the drain looks at a Drained node's pods again every 10 s
    assert "team/web-0" in fleet.cluster.evicted, "the node goes back to the drain"
    await settle(fleet, 1.0)
    assert job_kinds(fleet, "a") == ["ResetGPU", "Validation"], "validation once the node is empty"
    (said,) = messages(fleet, "a", "RemediationPaused")  # once per wait, not once per pass
    assert "team/web-0" in said and "the drain evicts them first" in said, said


async def restart(fleet: memory_fleet.MemoryFleet) -> None:
    """A new operator process on the same cluster: nothing in memory, the cluster as it is."""
    fleet.ctx = operator_context.new_context(fleet.cluster, instance="t2", clock=lambda: fleet.now)
    for policy in fleet.policies:
        await handlers.on_policy({"type": "ADDED", "object": policy}, memo=fleet.ctx)  # type: ignore[typeddict-item]
    for node in list(fleet.cluster.nodes.values()):
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(node)}, fleet.ctx)
    for gpunode in list(fleet.cluster.gpunodes.values()):
        event = {"type": "ADDED", "object": copy.deepcopy(gpunode)}
        await handling.handle(handlers.on_gpunode, event, fleet.ctx)


@run
async def test_a_restart_mid_wait_keeps_the_phase_deadline() -> None:
    """The phase's start is on the Node (the repair annotation): a new process waits no longer."""
    fleet = fleet_with()
    await drained_faulty(fleet, "a")
    fleet.cluster.put_pod(pod("a", "intruder", owner=None))
    await reset_worked(fleet, "a")
    await settle(fleet, 100.0, times=4)
    assert action(fleet, "a") == "Validating" and not messages(fleet, "a", "ValidationFailed")
    await restart(fleet)
    await settle(fleet, 100.0, times=3)  # 700 s after the phase began: past its 600 s
    (failed,) = messages(fleet, "a", "ValidationFailed")
    assert "team/intruder" in failed, failed
    assert job_kinds(fleet, "a") == ["ResetGPU"], "no validation Job beside the pod, before or after"
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, "a")


# --- new-node validation: a node already serving a pod, and one deleted and created again ----------------


def stamp(fleet: memory_fleet.MemoryFleet, minutes: float) -> str:
    """The test clock's now plus `minutes`, as a creationTimestamp."""
    return (fleet.now + datetime.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_nodes_fleet() -> memory_fleet.MemoryFleet:
    fleet = fleet_with()
    fleet.policies[0]["metadata"]["creationTimestamp"] = stamp(fleet, -60)
    fleet.policies[0]["spec"]["repair"]["validation"]["newNodes"] = True
    return fleet


async def join(fleet: memory_fleet.MemoryFleet, name: str, *, uid: str, created: str) -> None:
    """A Node registers (created after the policy) and its agent reports."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created},
        "spec": {},
    }
    fleet.cluster.put_node(copy.deepcopy(node))
    await handling.handle(handlers.on_node, {"type": "ADDED", "object": node}, fleet.ctx)
    await deliver(fleet, name, faulty=False)


async def leave(fleet: memory_fleet.MemoryFleet, name: str) -> None:
    """The Node deleted, and its GPUNode with it (owned by the Node)."""
    gone = fleet.cluster.delete_node(name)
    await handling.handle(handlers.on_node, {"type": "DELETED", "object": gone}, fleet.ctx)
    gpunode = fleet.cluster.delete_gpunode(name)
    await handling.handle(handlers.on_gpunode, {"type": "DELETED", "object": gpunode}, fleet.ctx)
    FAULTY.get(id(fleet), {}).pop(name, None)


def unvalidated(fleet: memory_fleet.MemoryFleet, name: str) -> bool:
    taints = fleet.cluster.nodes[name]["spec"].get("taints") or []
    return any(t.get("key") == keys.UNVALIDATED_TAINT for t in taints)


@run
async def test_a_new_node_already_serving_a_bare_pod_is_not_tainted_nor_diagnosed() -> None:
    fleet = new_nodes_fleet()
    await fleet.start([])
    fleet.cluster.put_pod(pod("n", "notebook", owner=None))  # no controller; the policy's drain has no force
    await join(fleet, "n", uid="n-1", created=stamp(fleet, 0))
    await settle(fleet)
    assert not unvalidated(fleet, "n"), "a node in service is not new"
    assert job_kinds(fleet, "n") == [], "no DCGM diagnostic on the GPUs the pod uses"


@run
async def test_a_node_deleted_and_created_again_under_its_name_is_validated_as_new() -> None:
    """Its first life was in service when first seen (never validated); its second life is a new node."""
    fleet = new_nodes_fleet()
    await fleet.start([])
    fleet.cluster.put_pod(pod("n", "web-0"))
    await join(fleet, "n", uid="n-1", created=stamp(fleet, 0))
    await settle(fleet)
    assert not unvalidated(fleet, "n")
    del fleet.cluster.pods["team/web-0"]
    await leave(fleet, "n")
    await join(fleet, "n", uid="n-2", created=stamp(fleet, 1))
    await settle(fleet, times=5)
    assert unvalidated(fleet, "n"), "the re-created node is new: tainted until validated"
    assert job_kinds(fleet, "n") == ["Validation"]


@run
async def test_a_node_whose_uid_changed_unseen_is_validated_as_new() -> None:
    """The Node deleted and created again between two of our looks (no DELETED event reached us)."""
    fleet = new_nodes_fleet()
    await fleet.start([])
    fleet.cluster.put_pod(pod("n", "web-0"))
    await join(fleet, "n", uid="n-1", created=stamp(fleet, 0))
    await settle(fleet)
    del fleet.cluster.pods["team/web-0"]
    await join(fleet, "n", uid="n-2", created=stamp(fleet, 1))
    await settle(fleet)
    assert unvalidated(fleet, "n"), "another Node under the name is new"


@run
async def test_a_busy_wait_then_a_wait_for_max_concurrent_are_each_said() -> None:
    fleet = fleet_with(drain={"deleteEmptyDirData": False}, max_concurrent=1)
    await drained_faulty(fleet, "a")  # a's repair holds the one place
    fleet.cluster.put_pod(pod("b", "train-0", empty_dir=True))
    await fleet.start(["b"])
    await deliver(fleet, "b", faulty=False)
    await deliver(fleet, "b", faulty=True)
    await settle(fleet)
    (busy,) = messages(fleet, "b", "RemediationPaused")
    assert "team/train-0" in busy, busy
    del fleet.cluster.pods["team/train-0"]
    await settle(fleet)
    waits = [m for m in messages(fleet, "b", "DisruptionBudgetExceeded") if "maxConcurrent" in m]
    assert len(waits) == 1 and "held by node a" in waits[0], waits
    assert job_kinds(fleet, "b") == []
