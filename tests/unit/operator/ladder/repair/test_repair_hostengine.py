"""Issue 48, Deliver 3: validation talks to the node's running DCGM host engine, else starts its own.

On the in-memory cluster (`repair_memory`: the test plays the agent and the GPU Operator's operand
DaemonSets; the standalone DCGM operand `nvidia-dcgm` listens on hostPort 5555). What a user sees on the
Validation Job: `GPUHEALTH_HOSTENGINE=<node IP>:5555` in its containers where the node runs the GPU
Operator's host engine (the template then runs `dcgmi diag --host` against it and starts none), empty
where it runs none (the template starts its own); a ResetGPU Job never carries it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import repair_memory
from gpuhealth_api import keys
from gpuhealth_operator.decisions import hostengine

DP = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm"


def env_of(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


async def until_validation(fleet: repair_memory.Fleet) -> dict[str, Any]:
    await fleet.start()
    await fleet.tick(times=10)
    (reset,) = fleet.jobs("ResetGPU")
    assert keys.REPAIR_HOSTENGINE_ENV not in env_of(reset), "a reset Job told of a host engine"
    fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.epoch())
    fleet.faulty = False
    await fleet.tick(times=3)
    (validation,) = fleet.jobs("Validation")
    return validation


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({DP: "true", DCGM: "true"}, f"{repair_memory.HOST_IP}:5555"),  # nvidia-dcgm runs: use it
        ({DP: "true", DCGM: "false"}, ""),  # the GPU Operator without standalone DCGM: start one
        ({}, ""),  # no GPU Operator
    ],
    ids=["gpu-operator-dcgm", "no-standalone-dcgm", "no-gpu-operator"],
)
def test_the_validation_job_names_the_nodes_running_host_engine(
    labels: dict[str, str], expected: str
) -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet(labels=labels)
        validation = await until_validation(fleet)
        env = env_of(validation)
        assert env.get(keys.REPAIR_HOSTENGINE_ENV) == expected, env

    asyncio.run(story())


def pod(**changes: Any) -> dict[str, Any]:
    body = repair_memory.operand_pod(DCGM)
    for key, value in changes.items():
        body["status" if key in {"phase", "hostIP"} else "metadata"][key] = value
    return body


def tenants_pod(**changes: Any) -> dict[str, Any]:
    """A tenant's pod that looks like nvidia-dcgm: the same nodeSelector, name, hostPort 5555 and owner
    kind (the tenant's own DaemonSet `nvidia-dcgm`: a drain leaves it on the node, as it does the operand)."""
    return pod(namespace="team-a", **changes)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([pod()], "10.0.0.7:5555"),
        ([pod(hostIP="fd00::7")], "[fd00::7]:5555"),
        ([pod(phase="Pending")], None),  # not started: nothing listens yet
        ([pod(deletionTimestamp="2026-12-01T12:00:00Z")], None),  # leaving
        ([pod(hostIP="10.0.0.7; reboot")], None),  # not an IP: never a command argument
        ([repair_memory.operand_pod(DP)], None),  # another operand
    ],
    ids=["running", "ipv6", "pending", "deleting", "not-an-ip", "other-operand"],
)
def test_which_pod_counts_as_a_running_host_engine(pods: list[dict[str, Any]], expected: str | None) -> None:
    assert hostengine.address(pods, repair_memory.OPERATOR_NAMESPACE) == expected


@pytest.mark.parametrize(
    "pods",
    [
        [tenants_pod()],  # the operand's look, in a tenant's namespace
        [pod(ownerReferences=[])],  # in the GPU Operator's namespace, but a bare pod
        [pod(ownerReferences=[{"apiVersion": "v1", "kind": "ReplicationController", "controller": True}])],
        [pod(ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet"}])],  # owner, not controller
    ],
    ids=["tenant-namespace", "bare-pod", "other-controller", "owner-not-controller"],
)
def test_a_pod_that_only_looks_like_the_gpu_operators_host_engine_is_not_trusted(
    pods: list[dict[str, Any]],
) -> None:
    """A validation that talked to a tenant's "host engine" would take that tenant's word that the GPUs
    are healthy and return a faulty node to service: only the GPU Operator's own DaemonSet pod counts."""
    assert hostengine.address(pods, repair_memory.OPERATOR_NAMESPACE) is None
    # The real operand beside the look-alike is still found, whichever comes first.
    assert hostengine.address([*pods, pod()], repair_memory.OPERATOR_NAMESPACE) == "10.0.0.7:5555"


def test_a_tenants_look_alike_on_the_node_leaves_the_validation_job_to_start_its_own_engine() -> None:
    """What a user sees: with only a tenant's look-alike on the node the Validation Job is told of no host
    engine (it starts its own); with the GPU Operator in the namespace the operator was told, its own."""

    async def story(operator_namespace: str, expected: str) -> None:
        labels = {DP: "true", DCGM: "true"}
        fleet = repair_memory.Fleet(labels=labels, gpu_operator_namespace=operator_namespace)
        await fleet.start()
        await fleet.tick(times=10)
        (reset,) = fleet.jobs("ResetGPU")
        # The tenant's DaemonSet pod selects the DCGM label too, so it is there again once the operands are.
        fleet.cluster.pods["team-a/fake-dcgm"] = tenants_pod(name="fake-dcgm", hostIP=repair_memory.HOST_IP)
        fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.epoch())
        fleet.faulty = False
        await fleet.tick(times=3)
        (validation,) = fleet.jobs("Validation")
        assert env_of(validation).get(keys.REPAIR_HOSTENGINE_ENV) == expected

    asyncio.run(story("elsewhere", ""))  # the real operand is not where the operator was told it runs
    asyncio.run(story(repair_memory.OPERATOR_NAMESPACE, f"{repair_memory.HOST_IP}:5555"))
