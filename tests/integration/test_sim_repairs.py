"""The simulated fleet plays repair Jobs on the real API server: kwok starts their pods and leaves them
Running, the repair executor ends each as the node's scenario says, and the step's effect shows where
the operator reads it, in the agent's report (GPUNode status).

The Jobs are created here the way the operator creates them (the repair-action label on the pod,
`spec.nodeName`, the GPU UUIDs in the env); the Job controller of the local control plane finishes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import sim_fleets
from gpuhealth_agent import simulated
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import agentpool, agents, fleetfile, repairs

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
PREFIX = "itrepair"
RESET_FIXES, FAILING, REBOOT = (f"{PREFIX}-{i}" for i in range(3))
ECC = {"eccUncorrectedVolatile": 2, "eccUncorrectedAggregate": 2, "retiredPagesPending": True}
FLEET = {
    "seed": 5,
    "agent": {"intervalSeconds": 0.5, "heartbeatSeconds": 5},
    "labels": {"gpuhealth.io/test": PREFIX},
    "pools": [{"name": PREFIX, "nodes": f"{PREFIX}-{{0..2}}", "gpu": {"model": H100, "count": 8}}],
    "overrides": [
        {"nodes": RESET_FIXES, "scenario": {"timeline": [{"after": "0s", "gpu": 3, "set": ECC}]}},
        {
            "nodes": FAILING,
            "scenario": {
                "timeline": [{"after": "0s", "gpu": 3, "set": ECC}],
                "repair": {"ResetGPU": "fails", "RebootNode": "noEffect", "validation": ["fail", "pass"]},
            },
        },
        # Well after the agent's first turn: NVML tells no one of an XID from before they subscribed.
        {"nodes": REBOOT, "scenario": {"timeline": [{"after": "10s", "gpu": 6, "xid": 79}]}},
    ],
}
TIMEOUT = 60


@pytest.fixture(scope="module")
def running_fleet(crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[agentpool.Fleet]:
    with sim_fleets.running(k8s, fleetfile.parse(FLEET, source="test fleet"), workers=2) as sim:
        yield sim


@pytest.fixture
def executor(
    running_fleet: agentpool.Fleet, k8s: client.ApiClient, namespace: str
) -> Iterator[repairs.Executor]:
    seconds = {"ResetGPU": 0.2, "RebootNode": 0.2, "Validation": 0.2}
    played = repairs.Executor(k8s, running_fleet, namespace=namespace, seconds=seconds, poll_seconds=0.1)
    played.start()
    try:
        yield played
    finally:
        played.stop()


def status(k8s: client.ApiClient, node: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(k8s)
    obj = custom.get_cluster_custom_object(resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, node)
    return dict(obj.get("status") or {})


def gpu(k8s: client.ApiClient, node: str, index: int) -> dict[str, Any] | None:
    gpus = status(k8s, node).get("gpus") or []
    return dict(gpus[index]) if len(gpus) == 8 else None


def run_job(k8s: client.ApiClient, namespace: str, name: str, node: str, action: str, gpus: str = "") -> None:
    labels = {keys.REPAIR_ACTION_LABEL: action, keys.NODE_LABEL: node}
    env = [
        {"name": keys.REPAIR_NODE_ENV, "value": node},
        {"name": keys.REPAIR_GPUS_ENV, "value": gpus},
        {"name": keys.REPAIR_ACTION_ENV, "value": action},
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "step", "image": "example.invalid/step", "env": env}],
                },
            },
        },
    }
    client.BatchV1Api(k8s).create_namespaced_job(namespace, job)


def job_ended(k8s: client.ApiClient, namespace: str, name: str) -> str:
    return sim_fleets.job_ended(k8s, namespace, name, timeout_seconds=TIMEOUT)


def pod_of(k8s: client.ApiClient, namespace: str, job: str) -> client.V1Pod:
    pods = client.CoreV1Api(k8s).list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    (pod,) = pods
    return pod


def ask_release(k8s: client.ApiClient, node: str, value: str | None) -> None:
    """What the operator does before a reset (issue 48): the GPUNode's release ask; with a value, wait
    for the agent's answer (`status.agent.released`)."""
    client.CustomObjectsApi(k8s).patch_cluster_custom_object(
        resources.GROUP,
        resources.VERSION,
        resources.GPUNODE_PLURAL,
        node,
        {"metadata": {"annotations": {keys.RELEASE_GPUS_ANNOTATION: value}}},
        _content_type="application/merge-patch+json",
    )
    if value is not None:
        waiting.wait_until(
            lambda: (status(k8s, node).get("agent") or {}).get("released") == value,
            timeout_seconds=TIMEOUT,
            message=f"{node}'s agent released the GPUs",
        )


def test_a_reset_while_the_agent_holds_the_gpu_fails(
    running_fleet: agentpool.Fleet, executor: repairs.Executor, k8s: client.ApiClient, namespace: str
) -> None:
    """Issue 48, Deliver 5: nvidia-smi --gpu-reset refuses while a process has the GPU open; the sim's
    agent holds it until released, and the sim counts the reset that met a holder."""
    waiting.wait_until(lambda: gpu(k8s, FAILING, 3), timeout_seconds=TIMEOUT, message="GPU 3 reported")
    run_job(k8s, namespace, "held", REBOOT, "ResetGPU", simulated.gpu_uuid(REBOOT, 0))
    assert job_ended(k8s, namespace, "held") == "Failed"
    assert executor.refused_resets == 1
    (played,) = [p for p in executor.played if p.node == REBOOT]
    assert "in use by gpu-health-agent" in played.outcome.message, played.outcome.message


def test_a_reset_that_fixes_clears_the_gpus_volatile_state(
    running_fleet: agentpool.Fleet, executor: repairs.Executor, k8s: client.ApiClient, namespace: str
) -> None:
    before = waiting.wait_until(
        lambda: (g := gpu(k8s, RESET_FIXES, 3)) and g["ecc"]["uncorrectedVolatile"] == 2 and g,
        timeout_seconds=TIMEOUT,
        message="the ECC fault on GPU 3 reported",
    )
    assert before["uuid"] == simulated.gpu_uuid(RESET_FIXES, 3)
    ask_release(k8s, RESET_FIXES, "cycle-1")
    run_job(k8s, namespace, "reset", RESET_FIXES, "ResetGPU", before["uuid"])
    assert job_ended(k8s, namespace, "reset") == "Succeeded"
    ask_release(k8s, RESET_FIXES, None)  # the agent takes NVML back and reports the reset's effect
    pod = pod_of(k8s, namespace, "reset")
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    # The agent's report after the Job ended: volatile state clear, aggregate counts kept.
    after = waiting.wait_until(
        lambda: (g := gpu(k8s, RESET_FIXES, 3)) and g["ecc"]["uncorrectedVolatile"] == 0 and g,
        timeout_seconds=TIMEOUT,
        message="GPU 3 reads clean after the reset",
    )
    assert after["ecc"]["uncorrectedAggregate"] == 2
    assert after["retiredPages"].get("pending") is False
    assert [p.node for p in executor.played] == [RESET_FIXES] and executor.errors == 0


def test_failing_steps_and_validations_end_their_pods_as_the_scenario_says(
    running_fleet: agentpool.Fleet, executor: repairs.Executor, k8s: client.ApiClient, namespace: str
) -> None:
    uuid = simulated.gpu_uuid(FAILING, 3)
    run_job(k8s, namespace, "reset", FAILING, "ResetGPU", uuid)
    assert job_ended(k8s, namespace, "reset") == "Failed"
    terminated = pod_of(k8s, namespace, "reset").status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (1, "Error")
    run_job(k8s, namespace, "reboot", FAILING, "RebootNode")
    assert job_ended(k8s, namespace, "reboot") == "Succeeded"  # noEffect: it ran, nothing changed
    run_job(k8s, namespace, "validate-1", FAILING, "Validation")
    assert job_ended(k8s, namespace, "validate-1") == "Failed"
    run_job(k8s, namespace, "validate-2", FAILING, "Validation")
    assert job_ended(k8s, namespace, "validate-2") == "Succeeded"  # the second attempt passes
    # Nothing fixed the fault, and the node did not reboot.
    reported = status(k8s, FAILING)
    assert reported["gpus"][3]["ecc"]["uncorrectedVolatile"] == 2
    assert reported["agent"]["bootId"] == agents.boot_id(FAILING, 0)


def test_a_reboot_that_fixes_brings_a_lost_gpu_back_with_a_new_boot(
    running_fleet: agentpool.Fleet, executor: repairs.Executor, k8s: client.ApiClient, namespace: str
) -> None:
    lost = waiting.wait_until(
        lambda: (g := gpu(k8s, REBOOT, 6)) and g.get("lost") and g.get("xids") and g,
        timeout_seconds=TIMEOUT,
        message="GPU 6 lost with XID 79",
    )
    assert [x["code"] for x in lost["xids"]] == [79]
    boot = status(k8s, REBOOT)["agent"]["bootId"]
    assert boot == agents.boot_id(REBOOT, 0)
    run_job(k8s, namespace, "reboot", REBOOT, "RebootNode")
    assert job_ended(k8s, namespace, "reboot") == "Succeeded"

    def rebooted() -> dict[str, Any] | None:
        found = status(k8s, REBOOT)
        gpus = found.get("gpus") or []
        if found["agent"].get("bootId") == boot or len(gpus) != 8:
            return None
        return found if not gpus[6].get("lost") and not gpus[6].get("xids") else None

    after = waiting.wait_until(rebooted, timeout_seconds=TIMEOUT, message="a new boot with GPU 6 back")
    assert after["agent"]["bootId"] == agents.boot_id(REBOOT, 1)
