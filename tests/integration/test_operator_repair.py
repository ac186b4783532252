"""#26 repair against a real API server: drained → Job → effect → validation → back in service, or retired.

The operator runs with `--repair-templates` naming a ConfigMap in a namespace of this module; its Job
templates' pods carry `kwok.x-k8s.io/status: custom`, so kwok leaves them alone and the test plays the
node: it ends a pod (pods/status: phase and terminated containers, as a kubelet writes them), the
Job controller (kube-controller-manager) marks the Job Complete or Failed, and the test writes the
agent's next report (the GPU's fault gone, a new bootId) as the agent would.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys, resources
from gpuhealth_operator.decisions import repair
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
jobs_namespace = repair_jobs.jobs_namespace_fixture("repair-it")
operator = operator_fixtures.operator_fixture(
    "repair", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("rep")
jobs = repair_jobs.jobs
job_pod = repair_jobs.job_pod
end = repair_jobs.end
BOOT = "boot-1"


# --- the agent, the node and the cluster as the test plays them ---------------------------------------


def report(fleet: operator_harness.Fleet, name: str, *, faulty: bool, boot: str = BOOT) -> None:
    overrides = {0: {"ecc": {"uncorrectedVolatile": 2}}} if faulty else {}
    facts = gpunode_facts.agent_status(overrides=overrides)
    facts["agent"]["bootId"] = boot
    fleet.report(name, facts)


def policy(
    fleet: operator_harness.Fleet,
    name: str,
    *,
    dry_run: bool = False,
    drain: dict[str, Any] | None = None,
    **repair: Any,
) -> None:
    spec: dict[str, Any] = {
        "steps": [
            {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120},
            {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120},
        ],
        "validation": {"timeoutSeconds": 120},
        "maxConcurrent": 1,
    }
    spec.update(repair)
    fleet.policy(
        name,
        {
            "dryRun": dry_run,
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": drain or {"timeoutSeconds": 30, "force": True},
            # Long: a validated node returns at once, never after this wait.
            "recovery": {"uncordon": True, "healthyForSeconds": 3600},
            "repair": spec,
        },
    )


def status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def wait_action(fleet: operator_harness.Fleet, name: str, action: str, timeout: float = TIMEOUT) -> None:
    waiting.wait_until(
        lambda: status(fleet, name).get("action") == action,
        timeout_seconds=timeout,
        message=f"{name}: action {action} (now {status(fleet, name).get('action')})",
    )


def heartbeat(
    fleet: operator_harness.Fleet, name: str, *, faulty: bool, boot: str = BOOT
) -> Callable[[], None]:
    """The agent reporting every second, as a real one does: a step's effect is judged only from a report
    the operator first saw after it saw the step's Job finished (its own clock), never from one before."""
    last = [0.0]

    def beat() -> None:
        if time.monotonic() - last[0] >= 1.0:
            report(fleet, name, faulty=faulty, boot=boot)
            last[0] = time.monotonic()

    return beat


def wait_job(
    k8s: client.ApiClient, namespace: str, node: str, action: str, agent: Callable[[], None] | None = None
) -> dict[str, Any]:
    """The node's Job of `action` (ResetGPU, RebootNode, Validation) once it exists, and its pod;
    `agent` (a `heartbeat`) reports meanwhile."""

    def found() -> dict[str, Any] | None:
        if agent is not None:
            agent()
        return next(
            (
                j
                for j in jobs(k8s, namespace, node)
                if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == action
            ),
            None,
        )

    waiting.wait_until(found, timeout_seconds=TIMEOUT, message=f"{node}: a {action} Job")
    job = found()
    assert job is not None
    return job


def results(fleet: operator_harness.Fleet, name: str) -> list[tuple[str, str]]:
    return [(e.get("action", ""), e["result"]) for e in status(fleet, name).get("repairs") or []]


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def annotations(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("annotations") or {}


def faulty_and_drained(fleet: operator_harness.Fleet, name: str, **repair: Any) -> None:
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    policy(fleet, fleet.label, **repair)
    report(fleet, name, faulty=True)


# --- the cases ----------------------------------------------------------------------------------------


def test_reset_then_validation_returns_the_node_at_once(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    job = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    wait_action(fleet, name, "Repairing")
    assert cordoned(fleet, name)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeName"] == name
    assert {"operator": "Exists"} in pod_spec["tolerations"]
    # issue 45, item 6: the pod selects the label of this Node's UID, which the Node carries meanwhile
    uid = fleet.node(name)["metadata"]["uid"]
    assert pod_spec["nodeSelector"] == {keys.REPAIR_NODE_UID_LABEL: uid}
    assert fleet.node(name)["metadata"]["labels"][keys.REPAIR_NODE_UID_LABEL] == uid
    assert pod_spec["serviceAccountName"] == "default" and pod_spec["automountServiceAccountToken"] is False
    env = {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"]}
    uuid = gpunode_facts.healthy_gpu(0)["uuid"]
    assert env == {"GPUHEALTH_NODE": name, "GPUHEALTH_GPU_UUIDS": uuid, "GPUHEALTH_REPAIR_ACTION": "ResetGPU"}
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 120
    assert job["metadata"]["labels"][keys.POLICY_LABEL] == fleet.label
    waiting.wait_until(
        lambda: fleet.events(name, "RepairStarted"), timeout_seconds=TIMEOUT, message="RepairStarted"
    )  # said right after the Job's creation
    (started,) = fleet.messages(name, "RepairStarted")
    assert f"GPU 0 ({uuid})" in started, started

    end(k8s, jobs_namespace, job, ok=True)
    # the agent's next reports: the GPU's volatile ECC count reset
    validation = wait_job(k8s, jobs_namespace, name, "Validation", heartbeat(fleet, name, faulty=False))
    wait_action(fleet, name, "Validating")
    assert cordoned(fleet, name), "validation runs on the cordoned node"
    end(k8s, jobs_namespace, validation, ok=True)

    waiting.wait_until(lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="uncordoned")
    for reason in ("ValidationPassed", "RepairSucceeded", "NodeUncordoned"):
        waiting.wait_until(lambda r=reason: fleet.events(name, r), timeout_seconds=TIMEOUT, message=reason)
    assert "validated" in fleet.messages(name, "NodeUncordoned")[0]
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name)
    assert keys.REPAIR_NODE_UID_LABEL not in fleet.node(name)["metadata"]["labels"]
    assert keys.CORDONED_BY_ANNOTATION not in annotations(fleet, name)
    waiting.wait_until(
        lambda: (
            results(fleet, name)
            == [
                ("ResetGPU", "Started"),
                ("ResetGPU", "Succeeded"),
                ("Validation", "Started"),
                ("Validation", "ValidationPassed"),
            ]
        ),
        timeout_seconds=TIMEOUT,
        message=f"history (now {results(fleet, name)})",
    )
    assert not fleet.events(name, "RepairFailed")


def test_reset_without_effect_then_reboot_with_a_new_boot_id(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    reset = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    end(k8s, jobs_namespace, reset, ok=True)
    # reports after the Job: the fault stays
    reboot = wait_job(k8s, jobs_namespace, name, "RebootNode", heartbeat(fleet, name, faulty=True))
    (failed,) = fleet.messages(name, "RepairFailed")
    assert "NoEffect" in failed and "reboot" in failed, failed
    env = {e["name"]: e["value"] for e in reboot["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert len(env["GPUHEALTH_GPU_UUIDS"].split(",")) == 8, "RebootNode: every GPU of the node"
    report(fleet, name, faulty=False, boot="boot-2")  # the node came back: its pod died with it
    validation = wait_job(k8s, jobs_namespace, name, "Validation")
    end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="uncordoned")
    assert ("RebootNode", "Succeeded") in results(fleet, name)
    assert ("ResetGPU", "NoEffect") in results(fleet, name)


def test_validation_failing_on_the_last_step_retires_the_node(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name, steps=[{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}])
    reset = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    end(k8s, jobs_namespace, reset, ok=True)
    validation = wait_job(k8s, jobs_namespace, name, "Validation", heartbeat(fleet, name, faulty=False))
    end(k8s, jobs_namespace, validation, ok=False)

    wait_action(fleet, name, "Retired")
    node = fleet.node(name)
    assert node["metadata"]["labels"].get(keys.NEEDS_REPAIR_LABEL) == "manual"
    assert keys.REPAIR_NODE_UID_LABEL not in node["metadata"]["labels"]
    assert node["spec"].get("unschedulable"), "a retired node stays cordoned"
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name)
    waiting.wait_until(
        lambda: fleet.events(name, "NodeRetired"), timeout_seconds=TIMEOUT, message="NodeRetired"
    )
    (event,) = fleet.events(name, "NodeRetired")
    assert event["type"] == "Warning"
    fleet.said(name, "ValidationFailed", timeout_seconds=TIMEOUT)
    waiting.wait_until(
        lambda: results(fleet, name)[-1:] == [("", "Retired")],
        timeout_seconds=TIMEOUT,
        message="Retired entry",
    )
    time.sleep(2)  # a retired node with the fault gone must not be uncordoned (a negative: sampled)
    assert cordoned(fleet, name)

    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})  # only a human returns it
    waiting.wait_until(
        lambda: keys.NEEDS_REPAIR_LABEL not in fleet.node(name)["metadata"]["labels"],
        timeout_seconds=TIMEOUT,
        message="needs-repair label removed after the human's uncordon",
    )


def test_max_concurrent_one_repairs_one_node_at_a_time(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    first, second = f"{fleet.label}-a", f"{fleet.label}-b"
    for name in (first, second):
        fleet.add_node(name, report=False)
        report(fleet, name, faulty=False)
    policy(fleet, fleet.label)
    report(fleet, first, faulty=True)
    wait_job(k8s, jobs_namespace, first, "ResetGPU")
    report(fleet, second, faulty=True)
    wait_action(fleet, second, "Drained")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:  # sampled: never a second repair while the first runs
        assert not jobs(k8s, jobs_namespace, second), "maxConcurrent 1: the second node waits, drained"
        time.sleep(0.2)
    assert status(fleet, second).get("action") == "Drained"
    waiting.wait_until(
        lambda: fleet.events(second, "DisruptionBudgetExceeded"),
        timeout_seconds=TIMEOUT,
        message="the wait for maxConcurrent said",
    )
    (said,) = fleet.events(second, "DisruptionBudgetExceeded")  # once per wait, not once per pass
    assert said["type"] == "Normal", said
    assert said.get("count", 1) == 1, said
    assert f"repair maxConcurrent 1 reached, held by node {first}" in said["message"], said["message"]

    reset = wait_job(k8s, jobs_namespace, first, "ResetGPU")
    end(k8s, jobs_namespace, reset, ok=True)
    validation = wait_job(k8s, jobs_namespace, first, "Validation", heartbeat(fleet, first, faulty=False))
    end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(lambda: not cordoned(fleet, first), timeout_seconds=TIMEOUT, message="first returned")
    wait_job(k8s, jobs_namespace, second, "ResetGPU")  # its turn now


def test_a_human_uncordon_cancels_the_repair(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    wait_job(k8s, jobs_namespace, name, "ResetGPU")
    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})  # kubectl uncordon
    waiting.wait_until(
        lambda: not jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="the Job deleted"
    )
    waiting.wait_until(
        lambda: fleet.events(name, "OverriddenByUser"), timeout_seconds=TIMEOUT, message="OverriddenByUser"
    )
    waiting.wait_until(
        lambda: any("cancelled" in m for m in fleet.messages(name, "RemediationPaused")),
        timeout_seconds=TIMEOUT,
        message="the cancel said",
    )
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name)
    waiting.wait_until(
        lambda: ("ResetGPU", "Cancelled") in results(fleet, name),
        timeout_seconds=TIMEOUT,
        message="Cancelled",
    )
    assert not cordoned(fleet, name)


def test_excluding_the_node_cancels_the_repair(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    wait_job(k8s, jobs_namespace, name, "ResetGPU")
    fleet.core.patch_node(name, {"metadata": {"labels": {keys.EXCLUDE_LABEL: "true"}}})
    waiting.wait_until(
        lambda: not jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="the Job deleted"
    )
    waiting.wait_until(
        lambda: any(
            keys.EXCLUDE_LABEL in m and "cancelled" in m for m in fleet.messages(name, "RemediationPaused")
        ),
        timeout_seconds=TIMEOUT,
        message="the cancel said, naming the exclusion",
    )
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name)
    assert cordoned(fleet, name), "the cordon stays: excluded means left alone"
    waiting.wait_until(  # issue 45: the history that outlives Events says so too
        lambda: ("ResetGPU", "Cancelled") in results(fleet, name),
        timeout_seconds=TIMEOUT,
        message=f"Cancelled in status.repairs[] (now {results(fleet, name)})",
    )


def test_a_job_that_cannot_be_created_fails_its_step_and_moves_on_never_loops(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    quota = f"no-jobs-{secrets.token_hex(2)}"
    core.create_namespaced_resource_quota(
        jobs_namespace, {"metadata": {"name": quota}, "spec": {"hard": {"count/jobs.batch": "0"}}}
    )
    try:
        waiting.wait_until(
            lambda: core.read_namespaced_resource_quota(quota, jobs_namespace).status.hard or {},
            timeout_seconds=TIMEOUT,
            message="quota counted",
        )
        name = f"{fleet.label}-a"
        faulty_and_drained(fleet, name)
        wait_action(fleet, name, "Retired")
        failed = fleet.messages(name, "RepairFailed")
        assert len(failed) == 2, failed  # reset, then reboot: each tried once
        assert all("could not be created" in m and "403" in m and "quota" in m for m in failed), failed
        assert any("next: step reboot" in m for m in failed), failed
        time.sleep(3)  # no loop: nothing more is tried on the retired node
        assert len(fleet.messages(name, "RepairFailed")) == 2
        assert not jobs(k8s, jobs_namespace, name)
    finally:
        core.delete_namespaced_resource_quota(quota, jobs_namespace)


def test_dry_run_says_what_it_would_reset_and_creates_no_job(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    policy(fleet, fleet.label, dry_run=True)
    report(fleet, name, faulty=True)
    uuid = gpunode_facts.healthy_gpu(0)["uuid"]
    waiting.wait_until(
        lambda: any(f"would then reset GPU 0 ({uuid})" in m for m in fleet.messages(name, "DryRun")),
        timeout_seconds=TIMEOUT,
        message=f"DryRun naming the reset (now {fleet.messages(name, 'DryRun')})",
    )
    time.sleep(2)
    assert not jobs(k8s, jobs_namespace, name)
    assert not cordoned(fleet, name)


def test_a_restarted_operator_adopts_the_running_job(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    jobs_namespace: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    job = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    operator.kill()  # mid-step, no cleanup
    operator.start()
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the operator leads again")
    time.sleep(2)
    (only,) = jobs(k8s, jobs_namespace, name)
    assert only["metadata"]["uid"] == job["metadata"]["uid"], "the same Job: adopted, never a second"
    end(k8s, jobs_namespace, job, ok=True)
    validation = wait_job(k8s, jobs_namespace, name, "Validation", heartbeat(fleet, name, faulty=False))
    end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="uncordoned")
    assert (
        len(
            [
                j
                for j in jobs(k8s, jobs_namespace, name)
                if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == "ResetGPU"
            ]
        )
        == 1
    )
    assert len(fleet.messages(name, "RepairStarted")) == 1


def test_no_step_while_an_evictable_pod_holds_the_node(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "work", "labels": {"app": "work"}},
            "spec": {
                "nodeName": name,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )
    waiting.wait_until(
        lambda: core.read_namespaced_pod("work", namespace).status.phase == "Running",
        timeout_seconds=TIMEOUT,
        message="the workload runs",
    )
    client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "work"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "work"}}},
        },
    )
    policy(fleet, fleet.label)
    report(fleet, name, faulty=True)
    wait_action(fleet, name, "Draining")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # sampled: the PDB holds the pod, so the drain never completes
        assert not jobs(k8s, jobs_namespace, name), "a repair step with an evictable pod on the node"
        time.sleep(0.2)
    client.PolicyV1Api(k8s).delete_namespaced_pod_disruption_budget("work", namespace)
    wait_job(k8s, jobs_namespace, name, "ResetGPU")  # drained now: the repair starts
    waiting.wait_until(
        lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name == name],
        timeout_seconds=TIMEOUT,
        message="the workload evicted before the step",
    )


def test_no_step_beside_a_pod_the_drain_keeps_until_it_goes(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, namespace: str
) -> None:
    """Issue 45 item 2: a training pod with emptyDir data under `deleteEmptyDirData: false` stays on the
    drained node; no reset Job starts beside it (the drain itself is Drained), until it is gone."""
    name = f"{fleet.label}-a"
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "train"},
            "spec": {
                "nodeName": name,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )
    waiting.wait_until(
        lambda: core.read_namespaced_pod("train", namespace).status.phase == "Running",
        timeout_seconds=TIMEOUT,
        message="the training pod runs",
    )
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            # Keep emptyDir data: the drain leaves the training pod where it is.
            "drain": {"timeoutSeconds": 30, "force": True, "deleteEmptyDirData": False},
            "repair": {"steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}]},
        },
    )
    report(fleet, name, faulty=True)
    wait_action(fleet, name, "Drained")
    said = fleet.said(name, "RemediationPaused", f"{namespace}/train", timeout_seconds=TIMEOUT)
    assert said[0].startswith(f"Repair of the drained node by policy {fleet.label} waits"), said
    assert not jobs(k8s, jobs_namespace, name), "a reset Job beside the training pod"
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name), "no maxConcurrent place held"
    assert core.read_namespaced_pod("train", namespace).status.phase == "Running"

    core.delete_namespaced_pod("train", namespace, grace_period_seconds=0)  # the training finished
    wait_job(k8s, jobs_namespace, name, "ResetGPU")


def test_a_pod_landing_after_the_reset_fails_validation_at_its_timeout_and_frees_the_place(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, namespace: str
) -> None:
    """Issue 45 item 3: a pod bound to the cordoned node by name after the reset worked gets no
    validation Job beside it, and does not keep the node Validating for ever: the validation's timeout
    fails it, the one step retires the node, and the node waiting for maxConcurrent is repaired."""
    first, second = f"{fleet.label}-a", f"{fleet.label}-b"
    for name in (first, second):
        fleet.add_node(name, report=False)
        report(fleet, name, faulty=False)
    policy(
        fleet,
        fleet.label,
        steps=[{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
        validation={"timeoutSeconds": 8},
        drain={"timeoutSeconds": 30, "force": False},  # a pod without a controller stays
    )
    report(fleet, first, faulty=True)
    reset = wait_job(k8s, jobs_namespace, first, "ResetGPU")
    report(fleet, second, faulty=True)
    wait_action(fleet, second, "Drained")  # waits for first's place
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(  # bound by name past the cordon; no controller: the drain leaves it
        namespace,
        {
            "metadata": {"name": "late"},
            "spec": {
                "nodeName": first,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )
    end(k8s, jobs_namespace, reset, ok=True)
    beat = heartbeat(fleet, first, faulty=False)  # the agent: the reset worked
    waiting.wait_until(
        lambda: (beat(), [m for m in fleet.messages(first, "RemediationPaused") if f"{namespace}/late" in m])[
            1
        ],
        timeout_seconds=TIMEOUT,
        message="the wait for the pod said",
    )
    failed = waiting.wait_until(
        lambda: (beat(), fleet.messages(first, "ValidationFailed"))[1],
        timeout_seconds=TIMEOUT,
        message="validation failed at its timeout",
    )
    assert f"{namespace}/late" in failed[0], failed
    assert not [
        j
        for j in jobs(k8s, jobs_namespace, first)
        if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == "Validation"
    ], "no validation Job beside the pod"
    wait_action(fleet, first, "Retired")
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, first), "its maxConcurrent place is free"
    wait_job(k8s, jobs_namespace, second, "ResetGPU")  # the node behind it gets its turn


def test_deleting_the_policy_cancels_the_repair(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    wait_job(k8s, jobs_namespace, name, "ResetGPU")
    fleet.custom.delete_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    waiting.wait_until(
        lambda: not jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="the Job deleted"
    )
    waiting.wait_until(
        lambda: any(
            "was deleted" in m and "cancelled" in m for m in fleet.messages(name, "RemediationPaused")
        ),
        timeout_seconds=TIMEOUT,
        message="the cancel said, naming the deletion",
    )
    assert keys.REPAIR_ANNOTATION not in annotations(fleet, name)


def test_an_open_breaker_starts_no_new_step_but_the_running_job_is_still_observed(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    first, second, third = (f"{fleet.label}-{c}" for c in "abc")
    for name in (first, second, third):
        fleet.add_node(name, report=False)
        report(fleet, name, faulty=False)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 3600},
            "breaker": {"maxNewUnhealthy": 1, "windowSeconds": 600},
            "repair": {
                "steps": [
                    {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120},
                    {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120},
                ],
                "validation": {"timeoutSeconds": 120},
                "maxConcurrent": 3,
            },
        },
    )
    report(fleet, first, faulty=True)
    reset = wait_job(k8s, jobs_namespace, first, "ResetGPU")
    for name in (second, third):  # a fault storm: more than maxNewUnhealthy 1 turn Unhealthy
        report(fleet, name, faulty=True)

    def paused() -> bool:
        body = fleet.custom.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
        )
        conditions = (body.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Paused" and c.get("status") == "True" for c in conditions)

    waiting.wait_until(paused, timeout_seconds=TIMEOUT, message="the breaker open (Paused)")
    end(k8s, jobs_namespace, reset, ok=True)
    # the running step is still observed: its NoEffect is judged and said ...
    beat = heartbeat(fleet, first, faulty=True)
    waiting.wait_until(
        lambda: beat() or fleet.messages(first, "RepairFailed"),
        timeout_seconds=TIMEOUT,
        message="the reset's NoEffect judged while the breaker is open",
    )
    # ... but no new step starts, here or on the other nodes
    waiting.holds(
        lambda: (
            not [
                j
                for j in jobs(k8s, jobs_namespace, first)
                if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] != "ResetGPU"
            ]
            and not jobs(k8s, jobs_namespace, second)
            and not jobs(k8s, jobs_namespace, third)
        ),
        seconds=3,
        message="no new step while the breaker is open",
    )
    assert status(fleet, first).get("action") == "Repairing"
    fleet.custom.patch_cluster_custom_object(  # a human resumes
        resources.GROUP,
        resources.VERSION,
        resources.POLICY_PLURAL,
        fleet.label,
        {"metadata": {"annotations": {keys.BREAKER_RESET_ANNOTATION: "oncall-ack"}}},
    )
    wait_job(k8s, jobs_namespace, first, "RebootNode")  # the next step, now


def test_of_two_policies_selecting_the_node_only_the_one_that_cordoned_it_repairs_it(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    policy(fleet, fleet.label, steps=[{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}])
    policy(
        fleet, f"{fleet.label}-other", steps=[{"name": "boot", "action": "RebootNode", "timeoutSeconds": 120}]
    )
    report(fleet, name, faulty=True)
    waiting.wait_until(
        lambda: jobs(k8s, jobs_namespace, name), timeout_seconds=TIMEOUT, message="a repair Job"
    )
    owner = annotations(fleet, name)[keys.CORDONED_BY_ANNOTATION]

    def only_the_owners() -> bool:
        listed = jobs(k8s, jobs_namespace, name)
        return len(listed) == 1 and listed[0]["metadata"]["labels"][keys.POLICY_LABEL] == owner

    waiting.holds(only_the_owners, seconds=3, message=f"one Job, of {owner} (the policy that cordoned it)")
    (job,) = jobs(k8s, jobs_namespace, name)
    wanted = "ResetGPU" if owner == fleet.label else "RebootNode"
    assert job["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == wanted


def test_a_job_forged_with_the_next_steps_name_and_stamp_is_not_adopted(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    """Issue 45: a tenant who can create Jobs in the repair namespace reads the cycle (number, start) on
    the Node, creates the validation Job's name with the cycle's stamp and lets it succeed. The operator
    deletes it and runs its own: the node is not returned on the forged pass."""
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    reset = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    state = json.loads(annotations(fleet, name)[keys.REPAIR_ANNOTATION])
    forged_name = repair.job_name(name, state["cycle"], state["step"], validation=True)
    forged = yaml.safe_load(repair_jobs.job_template("Validation"))
    forged["metadata"].update(
        name=forged_name,
        labels={keys.NODE_LABEL: name, keys.REPAIR_ACTION_LABEL: "Validation"},
        annotations={keys.REPAIR_CYCLE_STARTED_ANNOTATION: state["started"]},
    )
    forged["spec"]["template"]["spec"].update(restartPolicy="Never", nodeName=name)
    forged["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    made = client.BatchV1Api(k8s).create_namespaced_job(jobs_namespace, forged)
    end(k8s, jobs_namespace, {"metadata": {"name": forged_name}}, ok=True)  # it "passed"
    end(k8s, jobs_namespace, reset, ok=True)
    beat = heartbeat(fleet, name, faulty=False)

    def own() -> dict[str, Any] | None:
        beat()
        return next(
            (
                j
                for j in jobs(k8s, jobs_namespace, name)
                if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == "Validation"
                and j["metadata"]["uid"] != made.metadata.uid
            ),
            None,
        )

    waiting.wait_until(own, timeout_seconds=TIMEOUT, message="the operator's own validation Job")
    validation = own()
    assert validation is not None
    assert validation["metadata"]["annotations"].get(keys.REPAIR_TOKEN_ANNOTATION)
    assert cordoned(fleet, name), "the forged validation returned the node"
    assert status(fleet, name).get("action") == "Validating"
    assert not fleet.events(name, "ValidationPassed")
    end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="uncordoned")


def pods_of(k8s: client.ApiClient, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Job's pods not being deleted."""
    listed = client.CoreV1Api(k8s).list_namespaced_pod(
        namespace, label_selector=f"job-name={job['metadata']['name']}"
    )
    return [p.to_dict() for p in listed.items if p.metadata.deletion_timestamp is None]


def test_a_node_deleted_mid_repair_takes_its_job_and_the_new_node_starts_no_step(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    """Issue 45, item 6: the privileged, nodeName-pinned step Job must not outlive its Node, or it runs on
    whatever registers under the name next, a machine nobody cordoned or drained."""
    name = f"{fleet.label}-a"
    faulty_and_drained(fleet, name)
    job = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    old_uid = fleet.node(name)["metadata"]["uid"]
    assert {"apiVersion": "v1", "kind": "Node", "name": name, "uid": old_uid} in [
        {k: o[k] for k in ("apiVersion", "kind", "name", "uid")} for o in job["metadata"]["ownerReferences"]
    ]
    job_pod(k8s, jobs_namespace, job)  # the Job controller made its pod, bound to the node's name

    fleet.core.delete_node(name)
    waiting.wait_until(  # the garbage collector takes the GPUNode the Node owns
        lambda: (
            name
            not in [
                g["metadata"]["name"]
                for g in fleet.custom.list_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL
                )["items"]
            ]
        ),
        timeout_seconds=TIMEOUT,
        message="the old GPUNode collected",
    )
    fleet.add_node(name, report=False)  # a new machine registers under the name
    report(fleet, name, faulty=False)
    assert fleet.node(name)["metadata"]["uid"] != old_uid
    # Its kubelet would refuse the old pod even before it is gone: the Node lacks the label it selects.
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {keys.REPAIR_NODE_UID_LABEL: old_uid}
    assert keys.REPAIR_NODE_UID_LABEL not in fleet.node(name)["metadata"]["labels"]
    waiting.wait_until(
        lambda: not jobs(k8s, jobs_namespace, name) and not pods_of(k8s, jobs_namespace, job),
        timeout_seconds=TIMEOUT,
        message="the deleted Node's step Job and its pod gone",
    )
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:  # sampled: no step without a fault, cordon and drain of its own
        assert not jobs(k8s, jobs_namespace, name), "a step started on the re-created node"
        assert not cordoned(fleet, name)
        time.sleep(0.5)

    report(fleet, name, faulty=True)  # a fault of the new node's own: cordon, drain, then a new cycle
    fresh = wait_job(k8s, jobs_namespace, name, "ResetGPU")
    assert cordoned(fleet, name)
    assert fresh["metadata"]["ownerReferences"][0]["uid"] == fleet.node(name)["metadata"]["uid"]
