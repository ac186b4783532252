"""Issue 51: active checks run on idle nodes, against a real API server, kube-scheduler and kwok.

The operator creates a check Job whose pod the scheduler binds to the idle node (all its GPUs, in
PriorityClass gpu-health-check); the test plays the node (the pod exits, with a termination message);
the run lands in GPUNode `status.checks[]` with an Event, and condition ActiveCheckFailed is judged by
the policy's rules like any condition.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

import check_jobs
import operator_fixtures
import operator_harness
import repair_jobs
from check_jobs import condition
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
jobs_namespace = check_jobs.jobs_namespace_fixture("checks-run")
operator = operator_fixtures.operator_fixture(
    "checks-run", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("chk")


def test_an_idle_node_is_checked_through_the_scheduler_and_its_pass_recorded(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    jobs_namespace: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, gpus=4)
    check_jobs.check_policy(fleet)
    job = check_jobs.wait_job(k8s, jobs_namespace, name)
    labels = job["metadata"]["labels"]
    assert (labels[keys.CHECK_LABEL], labels[keys.CHECK_TEMPLATE_LABEL]) == ("quick", check_jobs.TEMPLATE)
    assert (labels[keys.POLICY_LABEL], labels[keys.NODE_LABEL]) == (fleet.label, name)
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 60)
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["type"] == "DisruptionTarget"
    pod_spec = spec["template"]["spec"]
    assert "nodeName" not in pod_spec, "the scheduler places a check, so that it can preempt it"
    assert pod_spec["priorityClassName"] == "gpu-health-check"
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] == "4"
    assert spec["template"]["metadata"]["labels"][keys.CHECK_LABEL] == "quick"
    pod = check_jobs.bound_pod(k8s, jobs_namespace, job)
    assert pod["spec"]["nodeName"] == name

    check_jobs.end(k8s, jobs_namespace, job, ok=True, message=json.dumps({"durationSeconds": 3}))
    (run,) = check_jobs.wait_run(fleet, name, "Passed")
    assert (run["name"], run["template"], run["policy"]) == ("quick", check_jobs.TEMPLATE, fleet.label)
    assert run["figures"] == {"durationSeconds": 3}
    assert run["started"] and run["time"]
    assert fleet.said(name, "CheckPassed", "quick")
    waiting.wait_until(
        lambda: not check_jobs.jobs(k8s, jobs_namespace, name),
        timeout_seconds=TIMEOUT,
        message="the finished check Job deleted",
    )
    # Checked within everySeconds: no second Job for a few timer passes.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert not check_jobs.jobs(k8s, jobs_namespace, name)
        time.sleep(0.5)
    text = operator.metrics()
    assert (
        f'gpuhealth_operator_checks_total{{check="quick",policy="{fleet.label}",result="Passed"}} 1.0' in text
    )
    assert "gpuhealth_operator_checks_in_flight 0.0" in text
    assert f'gpuhealth_operator_check_gpu_seconds_total{{check="quick",policy="{fleet.label}"}}' in text


def test_a_failed_check_under_a_drain_rule_cordons_the_node(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-bad"
    fleet.add_node(name)
    check_jobs.check_policy(
        fleet, rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Drain"}]
    )
    job = check_jobs.wait_job(k8s, jobs_namespace, name)
    check_jobs.end(k8s, jobs_namespace, job, ok=False, message="diag: GPU 3 memory test failed")
    (run,) = check_jobs.wait_run(fleet, name, "Failed")
    assert run["message"] == "diag: GPU 3 memory test failed"
    assert fleet.said(name, "CheckFailed", "GPU 3 memory test failed")
    waiting.wait_until(
        lambda: fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordoned"
    )
    waiting.wait_until(
        lambda: (c := condition(fleet, name, "ActiveCheckFailed")) is not None and c["status"] == "True",
        timeout_seconds=TIMEOUT,
        message="ActiveCheckFailed True",
    )
    assert fleet.node(name)["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label


def test_a_later_pass_on_request_clears_the_condition(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-req"
    fleet.add_node(name)
    check_jobs.check_policy(
        fleet, rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Label"}]
    )
    first = check_jobs.wait_job(k8s, jobs_namespace, name)
    check_jobs.end(k8s, jobs_namespace, first, ok=False, message="failed")
    check_jobs.wait_run(fleet, name, "Failed")
    waiting.wait_until(
        lambda: (c := condition(fleet, name, "ActiveCheckFailed")) is not None and c["status"] == "True",
        timeout_seconds=TIMEOUT,
        message="ActiveCheckFailed True",
    )
    waiting.wait_until(
        lambda: not check_jobs.jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="Job deleted"
    )
    # Not due for everySeconds: a request runs it now.
    fleet.annotate_gpunode(name, {keys.CHECK_NOW_ANNOTATION: json.dumps({"id": "tok-1", "check": "quick"})})
    again = check_jobs.wait_job(k8s, jobs_namespace, name)
    assert again["metadata"]["annotations"][keys.CHECK_REQUEST_ANNOTATION] == "tok-1"
    waiting.wait_until(
        lambda: keys.CHECK_NOW_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {}),
        timeout_seconds=TIMEOUT,
        message="the request's annotation removed",
    )
    check_jobs.end(k8s, jobs_namespace, again, ok=True)
    (passed,) = check_jobs.wait_run(fleet, name, "Passed")
    assert passed["requestId"] == "tok-1"
    waiting.wait_until(
        lambda: (c := condition(fleet, name, "ActiveCheckFailed")) is None or c["status"] == "False",
        timeout_seconds=TIMEOUT,
        message="ActiveCheckFailed cleared by the later pass",
    )


def test_a_dry_run_policy_says_it_would_check_and_starts_nothing(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-dry"
    fleet.add_node(name)
    check_jobs.check_policy(fleet, dryRun=True)
    assert fleet.said(name, "DryRun", "would check")
    assert not check_jobs.jobs(k8s, jobs_namespace, name)
