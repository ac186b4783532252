"""Issue 51: where a check never starts. Each guard (unschedulable, excluded, GPU Operator maintenance, a
pod using GPUs) keeps its node free of check Jobs while an idle control node beside it is checked; two
policies selecting one node start one check; maxConcurrent holds over all policies.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

import check_jobs
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

jobs_namespace = check_jobs.jobs_namespace_fixture("checks-guards")
operator = operator_fixtures.operator_fixture(
    "checks-guards", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("grd")


def gpu_pod(node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


def never(k8s: client.ApiClient, namespace: str, nodes: list[str], seconds: float = 3) -> None:
    """No check Job on any of `nodes` for several timer passes (0.5 s each)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in nodes:
            assert not check_jobs.jobs(k8s, namespace, node), f"a check Job on guarded node {node}"
        time.sleep(0.5)


def test_no_check_on_a_guarded_or_busy_node(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, namespace: str
) -> None:
    control = f"{fleet.label}-ctl"
    guarded = {
        "cordoned": {},
        "excluded": {keys.EXCLUDE_LABEL: "true"},
        "maint": {"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"},
        "busy": {},
    }
    names = {kind: f"{fleet.label}-{kind}" for kind in guarded}
    for kind, labels in guarded.items():
        fleet.add_node(names[kind], labels=labels)
    fleet.core.patch_node(names["cordoned"], {"spec": {"unschedulable": True}})
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, gpu_pod(names["busy"]))
    waiting.wait_until(
        lambda: client.CoreV1Api(k8s).read_namespaced_pod("train", namespace).status.phase == "Running",
        timeout_seconds=30,
        message="the GPU pod runs",
    )
    fleet.add_node(control)
    check_jobs.check_policy(fleet)
    check_jobs.wait_job(k8s, jobs_namespace, control)
    never(k8s, jobs_namespace, list(names.values()))


def test_two_policies_one_check_and_max_concurrent_over_all(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    nodes = [f"{fleet.label}-{i}" for i in range(3)]
    for node in nodes:
        fleet.add_node(node)
    check_jobs.check_policy(fleet, check_jobs.active_check(maxConcurrent=1))
    fleet.policy(
        f"{fleet.label}-b",
        {
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Event"}],
            "activeChecks": [check_jobs.active_check(name="deep", maxConcurrent=1)],
        },
    )
    waiting.wait_until(lambda: check_jobs.jobs(k8s, jobs_namespace), timeout_seconds=30, message="a check")
    ended = 0
    deadline = time.monotonic() + 20
    while ended < 2 and time.monotonic() < deadline:
        running = [
            j
            for j in check_jobs.jobs(k8s, jobs_namespace)
            if j["metadata"]["labels"][keys.NODE_LABEL] in nodes
        ]
        assert len(running) <= 1, "maxConcurrent 1 over both policies"
        if running:
            check_jobs.end(k8s, jobs_namespace, running[0], ok=True)
            node = running[0]["metadata"]["labels"][keys.NODE_LABEL]
            waiting.wait_until(
                lambda n=node, uid=running[0]["metadata"]["uid"]: all(
                    j["metadata"]["uid"] != uid for j in check_jobs.jobs(k8s, jobs_namespace, n)
                ),
                timeout_seconds=30,
                message="the ended check's Job deleted",
            )
            ended += 1
        time.sleep(0.2)
    assert ended == 2, "the next check started once a place was free"
