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
    assert hostengine.address(pods) == expected
