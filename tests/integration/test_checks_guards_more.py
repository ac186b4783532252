"""Issue 51 item 2, the guards test_checks_guards.py leaves out, against a real API server, kube-scheduler,
kube-controller-manager and kwok: a node in a repair step and a node a human overrode get no check Job,
and `kubectl gpuhealth check NODE` on them (and on every other guarded node, and where no policy has
activeChecks) exits 1 with the operator's reason; a Node deleted during its check takes its Job with it,
and a new Node of the same name is checked afresh.

An idle control node beside each guarded one is checked: the sweep ran, and left the guarded node alone.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest
from kubernetes import client

import check_jobs
import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
PLUGIN = str(pathlib.Path(sys.executable).parent / "kubectl-gpuhealth")
jobs_namespace = check_jobs.jobs_namespace_fixture("checks-guards-more")
operator = operator_fixtures.operator_fixture(
    "checks-guards-more", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("grm")
EVENT_RULE = {"name": "ecc", "condition": "EccUncorrectable", "action": "Event"}


def ecc(count: int) -> dict[str, Any]:
    return gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": count}}})


def plugin_check(crds: local.ControlPlane, node: str, *more: str) -> subprocess.Popen[str]:
    """`kubectl-gpuhealth check NODE` with $KUBECONFIG, as a user runs it (started, not waited for)."""
    env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig)}
    return subprocess.Popen(
        [PLUGIN, "check", node, "--timeout", "20", *more],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def refused(process: subprocess.Popen[str]) -> str:
    """The plugin's output, once it exited 1 saying the request was refused."""
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1, (out, err)
    assert "refused" in out, (out, err)
    return out


def never(k8s: client.ApiClient, namespace: str, node: str, seconds: float = 3) -> None:
    """No check Job on `node` for several timer passes (0.5 s each)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not check_jobs.jobs(k8s, namespace, node), f"a check Job on guarded node {node}"
        time.sleep(0.5)


def refusal_names_the_token(fleet: operator_harness.Fleet, node: str, why: str) -> None:
    """One CheckRefused Event about the node says why, and names the request's token (the plugin found
    it by its token: the Event's words are checked here)."""
    (message,) = fleet.said(node, "CheckRefused", why)
    assert message.startswith("Check request ") and f" on node {node} refused: " in message


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def test_a_node_in_a_repair_step_is_not_checked_and_a_request_is_refused(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, crds: local.ControlPlane
) -> None:
    name, control = f"{fleet.label}-rep", f"{fleet.label}-ctl"
    fleet.add_node(name)
    fleet.report(name, ecc(1))
    spec: dict[str, Any] = {
        "maxUnavailable": "100%",
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        "drain": {"timeoutSeconds": 30, "force": True},
        "repair": {
            "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
            "validation": {"timeoutSeconds": 120},
            "maxConcurrent": 1,
        },
    }
    fleet.policy(fleet.label, spec)
    waiting.wait_until(
        lambda: any(
            j["metadata"]["labels"].get(keys.REPAIR_ACTION_LABEL) == "ResetGPU"
            for j in repair_jobs.jobs(k8s, jobs_namespace, name)
        ),
        timeout_seconds=TIMEOUT,
        message="the node's ResetGPU Job (a repair step runs)",
    )
    assert keys.REPAIR_ANNOTATION in fleet.node(name)["metadata"]["annotations"]
    fleet.add_node(control)
    fleet.policy(fleet.label, {**spec, "activeChecks": [check_jobs.active_check()]})
    check_jobs.wait_job(k8s, jobs_namespace, control)
    never(k8s, jobs_namespace, name)

    out = refused(plugin_check(crds, name))
    assert "the node is in repair" in out
    refusal_names_the_token(fleet, name, "the node is in repair")
    assert keys.CHECK_NOW_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {})
    never(k8s, jobs_namespace, name, seconds=1)


def tainted(fleet: operator_harness.Fleet, name: str) -> bool:
    return any(t.get("key") == keys.UNVALIDATED_TAINT for t in fleet.node(name)["spec"].get("taints") or [])


def test_a_new_node_under_validation_is_not_checked_until_it_passes(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, crds: local.ControlPlane
) -> None:
    old = f"{fleet.label}-old"
    fleet.add_node(old)
    check_jobs.check_policy(
        fleet,
        repair={
            "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
            "validation": {"timeoutSeconds": 120, "newNodes": True},
            "maxConcurrent": 2,
        },
    )
    created = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )["metadata"]["creationTimestamp"]
    since = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    # creationTimestamp has whole seconds: a node "created after the policy" must be in a later second.
    waiting.wait_until(
        lambda: datetime.datetime.now(datetime.UTC) >= since + datetime.timedelta(seconds=1.2),
        timeout_seconds=5,
        message="a second after the policy",
    )
    name = f"{fleet.label}-new"
    fleet.add_node(name)
    waiting.wait_until(lambda: tainted(fleet, name), timeout_seconds=TIMEOUT, message="tainted unvalidated")
    validation = waiting.wait_until(
        lambda: next(
            (
                j
                for j in repair_jobs.jobs(k8s, jobs_namespace, name)
                if j["metadata"]["labels"].get(keys.REPAIR_ACTION_LABEL) == "Validation"
            ),
            None,
        ),
        timeout_seconds=TIMEOUT,
        message="the new node's validation Job",
    )
    check_jobs.wait_job(k8s, jobs_namespace, old)  # the node there before the policy: checked
    never(k8s, jobs_namespace, name)
    assert not cordoned(fleet, name), "schedulable: only the validation holds it"

    out = refused(plugin_check(crds, name))
    assert "the node is in repair" in out
    refusal_names_the_token(fleet, name, "the node is in repair")

    repair_jobs.end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(lambda: not tainted(fleet, name), timeout_seconds=TIMEOUT, message="validated")
    check_jobs.wait_job(k8s, jobs_namespace, name)


def test_an_overridden_node_is_not_checked_until_its_fault_clears(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, crds: local.ControlPlane
) -> None:
    name, control = f"{fleet.label}-ovr", f"{fleet.label}-ctl"
    fleet.add_node(name)
    fleet.report(name, ecc(1))
    spec: dict[str, Any] = {
        "maxUnavailable": "100%",
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
    }
    fleet.policy(fleet.label, spec)
    waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="cordoned")
    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})  # what `kubectl uncordon` sends
    fleet.said(name, "OverriddenByUser")
    waiting.wait_until(
        lambda: (fleet.gpunode(name).get("status") or {}).get("action") == "Overridden",
        timeout_seconds=TIMEOUT,
        message="action Overridden",
    )
    fleet.add_node(control)
    fleet.policy(fleet.label, {**spec, "activeChecks": [check_jobs.active_check()]})
    check_jobs.wait_job(k8s, jobs_namespace, control)
    never(k8s, jobs_namespace, name)
    assert not cordoned(fleet, name), "the override stands: never cordoned again on the same evidence"

    out = refused(plugin_check(crds, name))
    assert "a human overrode gpu-health on the node" in out
    refusal_names_the_token(fleet, name, "overrode")

    # The override ends with the evidence it stood on: once the fault is gone the node is checked.
    fleet.report(name, ecc(0))
    check_jobs.wait_job(k8s, jobs_namespace, name)


def test_a_request_on_a_guarded_or_busy_node_is_refused_with_the_reason(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str, crds: local.ControlPlane
) -> None:
    guarded = {
        "cordoned": ({}, "the node is unschedulable"),
        "excluded": ({keys.EXCLUDE_LABEL: "true"}, f"the node is excluded ({keys.EXCLUDE_LABEL})"),
        "maint": (
            {"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"},
            "the GPU Operator maintains the node",
        ),
        "busy": ({}, "a pod using GPUs runs on the node"),
    }
    names = {kind: f"{fleet.label}-{kind}" for kind in guarded}
    for kind, (labels, _) in guarded.items():
        fleet.add_node(names[kind], labels=labels)
    fleet.core.patch_node(names["cordoned"], {"spec": {"unschedulable": True}})  # a human's cordon
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeName": names["busy"],
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, pod)
    waiting.wait_until(
        lambda: client.CoreV1Api(k8s).read_namespaced_pod("train", namespace).status.phase == "Running",
        timeout_seconds=TIMEOUT,
        message="the GPU pod runs",
    )
    # Checks due only in an hour: nothing starts by itself, a request is the only way to one.
    check_jobs.check_policy(fleet, check_jobs.active_check(everySeconds=3600, idleForSeconds=3600))
    processes = {kind: plugin_check(crds, names[kind]) for kind in guarded}
    for kind, process in processes.items():
        why = guarded[kind][1]
        assert why in refused(process), kind
        refusal_names_the_token(fleet, names[kind], why)


def test_a_request_where_no_policy_has_active_checks_is_refused(
    fleet: operator_harness.Fleet, crds: local.ControlPlane
) -> None:
    name = f"{fleet.label}-0"
    fleet.add_node(name)
    fleet.policy(fleet.label, {"rules": [EVENT_RULE]})
    out = refused(plugin_check(crds, name))
    assert "no policy selecting the node has activeChecks" in out
    refusal_names_the_token(fleet, name, "activeChecks")
    assert keys.CHECK_NOW_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {})


def _gone(fleet: operator_harness.Fleet, name: str) -> bool:
    try:
        fleet.custom.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def test_a_node_deleted_during_its_check_takes_the_job_and_a_new_one_is_checked_afresh(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-gone"
    fleet.add_node(name)
    check_jobs.check_policy(fleet)
    first = check_jobs.wait_job(k8s, jobs_namespace, name)
    check_jobs.bound_pod(k8s, jobs_namespace, first)
    fleet.core.delete_node(name)
    # The Job and the GPUNode are owned by the Node: kube-controller-manager's garbage collector.
    waiting.wait_until(
        lambda: not check_jobs.jobs(k8s, jobs_namespace, name) and _gone(fleet, name),
        timeout_seconds=TIMEOUT,
        message="the check Job and the GPUNode collected with their Node",
    )
    fleet.add_node(name)
    again = check_jobs.wait_job(k8s, jobs_namespace, name)
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again["metadata"]["ownerReferences"][0]["uid"] == fleet.node(name)["metadata"]["uid"]
    check_jobs.end(k8s, jobs_namespace, again, ok=True)
    check_jobs.wait_run(fleet, name, "Passed")
    assert [r["result"] for r in check_jobs.runs(fleet, name)] == ["Passed"], "nothing of the old node's run"
