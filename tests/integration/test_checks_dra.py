"""Issue 51, item 2 on DRA nodes: a node whose GPUs only a DRA driver publishes (ResourceSlices of the
fake NVIDIA driver, no `nvidia.com/gpu` capacity) is checked too, its check pod holding every GPU through
a claim that the real kube-scheduler allocates; a workload that claims the GPUs preempts the check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

import check_jobs
import dra_checks
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.fleet import dra

pytestmark = pytest.mark.integration

GPUS = dra_checks.GPUS
TIMEOUT = 30.0
jobs_namespace = check_jobs.jobs_namespace_fixture("checks-dra")
operator = operator_fixtures.operator_fixture(
    "checks-dra", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("cdra")


def test_a_dra_only_node_is_checked_with_a_claim_of_every_gpu_and_nothing_is_left_behind(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    dra_checks.add_node(fleet, k8s, name)
    check_jobs.check_policy(fleet)
    job = check_jobs.wait_job(k8s, jobs_namespace, name)
    pod_spec = job["spec"]["template"]["spec"]
    first = pod_spec["containers"][0]["resources"]
    assert keys.GPU_RESOURCE not in first.get("limits", {}), "no device-plugin request on a DRA node"
    assert first["claims"] == [{"name": "gpus"}]
    (claim_ref,) = pod_spec["resourceClaims"]
    (template,) = waiting.wait_until(
        lambda: dra_checks.templates(k8s, jobs_namespace),
        timeout_seconds=TIMEOUT,
        message="the claim's template",
    )
    assert template["metadata"]["name"] == claim_ref["resourceClaimTemplateName"]
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Job",
        job["metadata"]["name"],
        job["metadata"]["uid"],
    )
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": dra.DEVICE_CLASS, "allocationMode": "All"}

    pod = check_jobs.bound_pod(k8s, jobs_namespace, job)  # placed by the real kube-scheduler
    assert pod["spec"]["nodeName"] == name
    results = waiting.wait_until(
        lambda: dra_checks.allocated(k8s, jobs_namespace, pod["metadata"]["name"]),
        timeout_seconds=TIMEOUT,
        message="the check's claim allocated",
    )
    assert sorted(r["device"] for r in results) == sorted(dra.device_name(i) for i in range(GPUS))
    assert {(r["driver"], r["pool"]) for r in results} == {(dra.DRIVER, name)}

    check_jobs.end(k8s, jobs_namespace, job, ok=True, message='{"durationSeconds": 2}')
    (run,) = check_jobs.wait_run(fleet, name, "Passed")
    assert run["figures"] == {"durationSeconds": 2}
    assert fleet.said(name, "CheckPassed", "quick")
    # The Job goes once recorded; its template and the pod's claim go with it (garbage collector).
    waiting.wait_until(
        lambda: (
            not check_jobs.jobs(k8s, jobs_namespace, name)
            and not dra_checks.templates(k8s, jobs_namespace)
            and not dra_checks.claims(k8s, jobs_namespace)
        ),
        timeout_seconds=TIMEOUT,
        message="the Job, its claim template and its claim deleted",
    )


@pytest.fixture
def workload_claim(k8s: client.ApiClient, namespace: str) -> Iterator[str]:
    """A namespace with a ResourceClaimTemplate of 8 GPUs, as a training job would claim them."""
    body = {
        "apiVersion": f"{dra.GROUP}/{dra.VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "eight-gpus"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": dra.DEVICE_CLASS, "count": GPUS}}
                    ]
                }
            }
        },
    }
    dra_checks.objects(k8s).create_namespaced_custom_object(
        dra.GROUP, dra.VERSION, namespace, "resourceclaimtemplates", body
    )
    yield namespace


def workload(node: str) -> dict[str, Any]:
    """A training pod claiming 8 GPUs of `node` through DRA, at the default priority (0)."""
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
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
        },
    }


def test_a_workload_claiming_the_gpus_ends_the_check_within_10_s_and_the_run_is_preempted(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, workload_claim: str
) -> None:
    name = f"{fleet.label}-b"
    dra_checks.add_node(fleet, k8s, name)
    check_jobs.check_policy(
        fleet, rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Drain"}]
    )
    job = check_jobs.wait_job(k8s, jobs_namespace, name)
    pod = check_jobs.bound_pod(k8s, jobs_namespace, job)
    waiting.wait_until(
        lambda: dra_checks.allocated(k8s, jobs_namespace, pod["metadata"]["name"]),
        timeout_seconds=TIMEOUT,
        message="the check holding all 8 GPUs",
    )

    core = client.CoreV1Api(k8s)
    arrived = time.monotonic()
    core.create_namespaced_pod(workload_claim, workload(name))

    def running() -> bool:
        listed = core.read_namespaced_pod("train", workload_claim, _preload_content=False)
        got = yaml.safe_load(listed.data)
        return bool(got["spec"].get("nodeName") == name and got["status"].get("phase") == "Running")

    waiting.wait_until(running, timeout_seconds=10, message="the workload Running on the node")
    took = time.monotonic() - arrived
    print(f"DRA workload arrival -> Running on the checked node: {took:.2f} s")
    assert took < 10

    (run,) = check_jobs.wait_run(fleet, name, "Preempted")
    assert run["name"] == "quick"
    assert fleet.said(name, "CheckPreempted", "preempted")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # never a failure, and no new check while the workload runs
        conditions = (fleet.gpunode(name).get("status") or {}).get("conditions") or []
        assert not [c for c in conditions if c["type"] == "ActiveCheckFailed" and c["status"] == "True"]
        assert not fleet.node(name)["spec"].get("unschedulable")
        assert not check_jobs.jobs(k8s, jobs_namespace, name)
        time.sleep(0.5)
    assert not fleet.events(name, "CheckFailed")
