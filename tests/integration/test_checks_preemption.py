"""Issue 51: a check never costs a job anything. A workload that wants the GPUs of a node under check
makes kube-scheduler preempt the check (its PriorityClass is below every workload): the workload is bound
within 10 s, the run is Preempted (Event CheckPreempted), never a failure (no ActiveCheckFailed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

import check_jobs
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

jobs_namespace = check_jobs.jobs_namespace_fixture("checks-preempt")
operator = operator_fixtures.operator_fixture(
    "checks-preempt", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("pre")


@pytest.fixture
def workloads(k8s: client.ApiClient, namespace: str) -> Iterator[str]:
    yield namespace


def workload(node: str, gpus: int) -> dict[str, object]:
    """A training pod wanting every GPU of `node`, through the scheduler, at the default priority (0)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


def test_a_workload_preempts_a_running_check_within_10_s_and_the_run_is_preempted(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, workloads: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, gpus=8)
    check_jobs.check_policy(
        fleet, rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Drain"}]
    )
    job = check_jobs.wait_job(k8s, jobs_namespace, name)
    check_jobs.bound_pod(k8s, jobs_namespace, job)  # the check holds all 8 GPUs

    core = client.CoreV1Api(k8s)
    arrived = time.monotonic()
    core.create_namespaced_pod(workloads, workload(name, 8))
    waiting.wait_until(
        lambda: core.read_namespaced_pod("train", workloads).spec.node_name == name,
        timeout_seconds=10,
        message="the workload bound to the node (the check preempted)",
    )
    assert time.monotonic() - arrived < 10

    (run,) = check_jobs.wait_run(fleet, name, "Preempted")
    assert run["name"] == "quick"
    assert fleet.said(name, "CheckPreempted", "preempted")
    # Never a failure: no ActiveCheckFailed, no cordon, and no new check while the workload runs.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        conditions = (fleet.gpunode(name).get("status") or {}).get("conditions") or []
        assert not [c for c in conditions if c["type"] == "ActiveCheckFailed" and c["status"] == "True"]
        assert not fleet.node(name)["spec"].get("unschedulable")
        assert not check_jobs.jobs(k8s, jobs_namespace, name)
        time.sleep(0.5)
    assert not fleet.events(name, "CheckFailed")
