"""#26 item 4, validation of new nodes (`spec.repair.validation.newNodes`), against a real API server.

A node created after the policy is tainted `gpuhealth.io/unvalidated` and validated by a Job; the test
plays the node (its pod ends, as in test_operator_repair.py). A node that existed before the policy is
never touched.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from kubernetes import client

import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
jobs_namespace = repair_jobs.jobs_namespace_fixture("newnodes-it")
operator = operator_fixtures.operator_fixture(
    "newnodes", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("new")
validation_jobs = repair_jobs.jobs
end = repair_jobs.end


def policy(fleet: operator_harness.Fleet, *, dry_run: bool = False, force: bool = False) -> None:
    fleet.policy(
        fleet.label,
        {
            "dryRun": dry_run,
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"force": force},
            "repair": {
                "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
                "validation": {"timeoutSeconds": 120, "newNodes": True},
                "maxConcurrent": 2,
            },
        },
    )
    created = fleet.custom.get_cluster_custom_object(
        "gpuhealth.io", "v1alpha1", "gpuhealthpolicies", fleet.label
    )["metadata"]["creationTimestamp"]
    since = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    # creationTimestamp has whole seconds: a node "created after the policy" must be in a later second.
    waiting.wait_until(
        lambda: datetime.datetime.now(datetime.UTC) >= since + datetime.timedelta(seconds=1.2),
        timeout_seconds=5,
        message="a second after the policy",
    )


def tainted(fleet: operator_harness.Fleet, name: str) -> bool:
    return any(t.get("key") == keys.UNVALIDATED_TAINT for t in fleet.node(name)["spec"].get("taints") or [])


def wait_job(k8s: client.ApiClient, namespace: str, node: str) -> dict[str, Any]:
    waiting.wait_until(
        lambda: validation_jobs(k8s, namespace, node), timeout_seconds=TIMEOUT, message=f"{node}: a Job"
    )
    (job,) = validation_jobs(k8s, namespace, node)
    return job


def test_a_new_node_is_tainted_until_its_validation_passes(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    old = f"{fleet.label}-old"
    fleet.add_node(old)
    policy(fleet)
    name = f"{fleet.label}-new"
    fleet.add_node(name)
    waiting.wait_until(lambda: tainted(fleet, name), timeout_seconds=TIMEOUT, message="tainted")
    job = wait_job(k8s, jobs_namespace, name)
    assert job["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == "Validation"
    assert job["spec"]["template"]["spec"]["nodeName"] == name
    assert tainted(fleet, name), "the taint holds while the validation runs"
    end(k8s, jobs_namespace, job, ok=True)

    waiting.wait_until(lambda: not tainted(fleet, name), timeout_seconds=TIMEOUT, message="taint removed")
    waiting.wait_until(
        lambda: fleet.events(name, "ValidationPassed"), timeout_seconds=TIMEOUT, message="ValidationPassed"
    )
    assert keys.VALIDATED_ANNOTATION in (fleet.node(name)["metadata"].get("annotations") or {})
    waiting.wait_until(
        lambda: any(
            e.get("result") == "ValidationPassed"
            for e in (fleet.gpunode(name).get("status") or {}).get("repairs") or []
        ),
        timeout_seconds=TIMEOUT,
        message="status.repairs[] ValidationPassed",
    )
    # The node there before the policy: never tainted, no Job (it was judged every pass meanwhile).
    assert not tainted(fleet, old)
    assert not validation_jobs(k8s, jobs_namespace, old)
    assert not fleet.events(old, "ValidationPassed")


def test_a_new_node_failing_validation_stays_tainted_and_needs_repair(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    policy(fleet)
    name = f"{fleet.label}-bad"
    fleet.add_node(name)
    job = wait_job(k8s, jobs_namespace, name)
    end(k8s, jobs_namespace, job, ok=False)
    for reason in ("ValidationFailed", "NodeRetired"):
        waiting.wait_until(lambda r=reason: fleet.events(name, r), timeout_seconds=TIMEOUT, message=reason)
    deadline = time.monotonic() + 3  # several timer passes (0.5 s) and reconciles: both marks stay
    while time.monotonic() < deadline:
        node = fleet.node(name)
        assert node["metadata"]["labels"].get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL
        assert tainted(fleet, name)
        time.sleep(0.5)
    assert keys.VALIDATION_FAILED_ANNOTATION in (node["metadata"].get("annotations") or {})
    # A human returns it: taint and label off; it is never validated as new again.
    fleet.core.patch_node(
        name,
        {
            "metadata": {"labels": {keys.NEEDS_REPAIR_LABEL: None}},
            "spec": {"taints": [t for t in node["spec"]["taints"] if t["key"] != keys.UNVALIDATED_TAINT]},
        },
    )
    waiting.wait_until(lambda: not tainted(fleet, name), timeout_seconds=TIMEOUT, message="untainted")
    deadline = time.monotonic() + 3  # several timer passes (0.5 s): it must stay untainted
    while time.monotonic() < deadline:
        assert not tainted(fleet, name)
        assert len(validation_jobs(k8s, jobs_namespace, name)) <= 1
        time.sleep(0.5)


def test_a_dry_run_policy_only_says_it_would_validate(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    policy(fleet, dry_run=True)
    name = f"{fleet.label}-dry"
    fleet.add_node(name)
    waiting.wait_until(
        lambda: any("would validate new node" in m for m in fleet.messages(name, "DryRun")),
        timeout_seconds=TIMEOUT,
        message="DryRun would validate",
    )
    assert not tainted(fleet, name)
    assert not validation_jobs(k8s, jobs_namespace, name)


def test_a_node_leaving_the_selection_mid_validation_loses_its_job_and_taint(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    policy(fleet)
    name = f"{fleet.label}-gone"
    fleet.add_node(name)
    wait_job(k8s, jobs_namespace, name)
    assert tainted(fleet, name)
    fleet.core.patch_node(name, {"metadata": {"labels": {fleet.LABEL_KEY: "elsewhere"}}})
    waiting.wait_until(
        lambda: not validation_jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="Job deleted"
    )
    waiting.wait_until(lambda: not tainted(fleet, name), timeout_seconds=TIMEOUT, message="taint removed")
    assert not fleet.events(name, "ValidationFailed")


def test_a_node_deleted_and_created_again_under_its_name_is_new_again(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, namespace: str
) -> None:
    """Issue 45 item 8: its first life was in service when first seen (a pod ran on it), so it was never
    validated; the Node deleted and registered again under the name is a new node, validated before work."""
    policy(fleet, force=True)  # the first life's bare pod is evictable: in service by any count
    name = f"{fleet.label}-again"
    core = client.CoreV1Api(k8s)
    pod = {
        "metadata": {"name": "work"},
        "spec": {
            "nodeName": name,  # bound before the Node registers: busy from the operator's first look
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    core.create_namespaced_pod(namespace, pod)
    fleet.add_node(name)
    waiting.wait_until(
        lambda: fleet.gpunode(name).get("status", {}).get("health") == "Healthy",
        timeout_seconds=TIMEOUT,
        message="judged",
    )
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # sampled: a node in service is never tainted (a negative)
        assert not tainted(fleet, name), "a node already running a pod is in service, not new"
        time.sleep(0.2)

    core.delete_namespaced_pod("work", namespace, grace_period_seconds=0)
    core.delete_node(name)

    def gpunode_gone() -> bool:  # the garbage collector follows the GPUNode's ownerReference
        try:
            fleet.gpunode(name)
        except client.ApiException as error:
            return error.status == 404
        return False

    waiting.wait_until(gpunode_gone, timeout_seconds=TIMEOUT, message="GPUNode collected")
    fleet.add_node(name)
    waiting.wait_until(lambda: tainted(fleet, name), timeout_seconds=TIMEOUT, message="new again: tainted")
    job = wait_job(k8s, jobs_namespace, name)
    end(k8s, jobs_namespace, job, ok=True)
    waiting.wait_until(lambda: not tainted(fleet, name), timeout_seconds=TIMEOUT, message="validated")
