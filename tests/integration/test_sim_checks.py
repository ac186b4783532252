"""The simulated fleet plays active checks on the real API server: kube-scheduler places a check pod on a
kwok node by its `nvidia.com/gpu` request, kwok leaves it Running, the check executor ends it as the
node's scenario `checks:` says, and kube-scheduler preempts it for a workload that wants the GPUs.

The Jobs are made here the way the operator makes them (DESIGN.md "Active checks"): the check labels on
the pod, the node chosen by a node selector and all its GPUs requested, PriorityClass gpu-health-check;
the Job controller of the local control plane finishes them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import check_jobs
import sim_fleets
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import agentpool, checks, fleetfile

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
PREFIX = "itcheck"
PASSING, FAILING, FIGURES, PREEMPTED = (f"{PREFIX}-{i}" for i in range(4))
FLEET = {
    "seed": 7,
    "agent": {"intervalSeconds": 1, "heartbeatSeconds": 5},
    "labels": {"gpuhealth.io/test": PREFIX},
    "pools": [{"name": PREFIX, "nodes": f"{PREFIX}-{{0..3}}", "gpu": {"model": H100, "count": 8}}],
    "overrides": [
        {"nodes": FAILING, "scenario": {"checks": {"DcgmDiag": ["fail", "pass"]}}},
        {"nodes": FIGURES, "scenario": {"checks": {"Nccl": {"busBandwidthGBps": 310.5, "seconds": 20}}}},
    ],
}
TIMEOUT = 60


@pytest.fixture(scope="module")
def running_fleet(crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[agentpool.Fleet]:
    with sim_fleets.running(k8s, fleetfile.parse(FLEET, source="test fleet"), workers=2) as sim:
        yield sim


@pytest.fixture(scope="module")
def priority_class(k8s: client.ApiClient) -> str:
    """The chart's PriorityClass of check pods (charts/gpu-health/templates/checks.yaml), as it ships."""
    check_jobs.ensure_priority_class(k8s)
    return check_jobs.PRIORITY_CLASS


@pytest.fixture
def executor(
    running_fleet: agentpool.Fleet, k8s: client.ApiClient, namespace: str
) -> Iterator[checks.Executor]:
    # The node whose check a workload preempts runs long enough to be still running when it arrives.
    played = checks.Executor(
        k8s, running_fleet, namespace=namespace, seconds=0.2, node_seconds={PREEMPTED: 60.0}, poll_seconds=0.1
    )
    played.start()
    try:
        yield played
    finally:
        played.stop()


def gpu_pod(node: str, *, labels: dict[str, str], priority_class: str | None) -> dict[str, Any]:
    """A pod spec asking the scheduler for all 8 GPUs of `node` (never `nodeName`: the scheduler decides)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "check" if priority_class else "work",
                "image": "example.invalid/gpu",
                "resources": {"limits": {keys.GPU_RESOURCE: "8"}, "requests": {keys.GPU_RESOURCE: "8"}},
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"labels": labels}, "spec": spec}


def run_check(k8s: client.ApiClient, namespace: str, node: str, template: str, priority_class: str) -> str:
    name = f"check-{template.lower()}-{secrets.token_hex(3)}"
    labels = {
        keys.CHECK_LABEL: "quick",
        keys.CHECK_TEMPLATE_LABEL: template,
        keys.POLICY_LABEL: "fleet",
        keys.NODE_LABEL: node,
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {"backoffLimit": 0, "template": gpu_pod(node, labels=labels, priority_class=priority_class)},
    }
    client.BatchV1Api(k8s).create_namespaced_job(namespace, job)
    return name


def job_ended(k8s: client.ApiClient, namespace: str, name: str) -> str:
    return sim_fleets.job_ended(k8s, namespace, name, timeout_seconds=TIMEOUT)


def terminated(k8s: client.ApiClient, namespace: str, job: str) -> client.V1ContainerStateTerminated:
    (pod,) = client.CoreV1Api(k8s).list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    (container,) = pod.status.container_statuses
    assert pod.spec.node_name is not None
    return container.state.terminated


def pod_running(k8s: client.ApiClient, namespace: str, selector: str) -> client.V1Pod:
    def running() -> client.V1Pod | None:
        pods = client.CoreV1Api(k8s).list_namespaced_pod(namespace, label_selector=selector).items
        return next(
            (p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp), None
        )

    found: client.V1Pod = waiting.wait_until(
        running, timeout_seconds=TIMEOUT, message=f"a Running pod {selector}"
    )
    return found


def test_a_check_the_scenario_does_not_name_passes(
    executor: checks.Executor, k8s: client.ApiClient, namespace: str, priority_class: str
) -> None:
    job = run_check(k8s, namespace, PASSING, "DcgmDiagQuick", priority_class)
    assert job_ended(k8s, namespace, job) == "Succeeded"
    end = terminated(k8s, namespace, job)
    assert (end.exit_code, end.message or "") == (0, "")  # no figures: an empty termination message
    assert [(p.node, p.template, p.attempt) for p in executor.played] == [(PASSING, "DcgmDiagQuick", 0)]


def test_each_attempt_ends_as_the_scenarios_list_says(
    executor: checks.Executor, k8s: client.ApiClient, namespace: str, priority_class: str
) -> None:
    first = run_check(k8s, namespace, FAILING, "DcgmDiag", priority_class)
    assert job_ended(k8s, namespace, first) == "Failed"
    assert terminated(k8s, namespace, first).exit_code == 1
    second = run_check(k8s, namespace, FAILING, "DcgmDiag", priority_class)
    assert job_ended(k8s, namespace, second) == "Succeeded"
    assert [(p.node, p.attempt, p.outcome.succeeded) for p in executor.played] == [
        (FAILING, 0, False),
        (FAILING, 1, True),
    ]


def test_figures_are_the_termination_message(
    executor: checks.Executor, k8s: client.ApiClient, namespace: str, priority_class: str
) -> None:
    job = run_check(k8s, namespace, FIGURES, "Nccl", priority_class)
    assert job_ended(k8s, namespace, job) == "Succeeded"
    assert json.loads(terminated(k8s, namespace, job).message) == {"busBandwidthGBps": 310.5, "seconds": 20}


def test_a_workload_preempts_a_check_and_the_executor_leaves_it_alone(
    executor: checks.Executor, k8s: client.ApiClient, namespace: str, priority_class: str
) -> None:
    job = run_check(k8s, namespace, PREEMPTED, "DcgmDiagQuick", priority_class)
    check = pod_running(k8s, namespace, f"job-name={job}")
    assert check.spec.node_name == PREEMPTED
    core = client.CoreV1Api(k8s)
    work = gpu_pod(PREEMPTED, labels={"app": "training"}, priority_class=None)
    core.create_namespaced_pod(
        namespace, {**work, "metadata": {"name": "training", "labels": {"app": "training"}}}
    )
    placed = pod_running(k8s, namespace, "app=training")
    assert placed.spec.node_name == PREEMPTED  # the scheduler made room: the check was preempted
    waiting.wait_until(
        lambda: not core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items,
        timeout_seconds=TIMEOUT,
        message="the preempted check pod gone",
    )
    assert job_ended(k8s, namespace, job) == "Failed"
    assert (executor.played, executor.errors) == ([], 0)
