"""Issue 48, Deliver 2 and 6 against a real API server: the GPU Operator's operands step aside.

A DaemonSet of this module selects `nvidia.com/gpu.deploy.device-plugin=true` (as the GPU Operator's
device plugin does); kube-controller-manager places its pod on the kwok node and deletes it when the
label turns "false", kwok finishes the deletion. The operator runs with the repair templates of
`repair_jobs`; the test plays the agent (`canRelease`, answering the release ask). What a user sees:
the label off and recorded before any reset, no ResetGPU Job while the operand's pod is on the node,
the label back (and its pod) after the Job, the record gone; a human's edit mid-step wins; an operator
restarted mid-step restores what the earlier one paused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 40.0
DP = "nvidia.com/gpu.deploy.device-plugin"
EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
OPERANDS = "gpu-operator-it"
jobs_namespace = repair_jobs.jobs_namespace_fixture("operands-it")
operator = operator_fixtures.operator_fixture(
    "operands", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("opr")


@pytest.fixture(scope="module")
def device_plugin(k8s: client.ApiClient) -> Iterator[str]:
    """A DaemonSet like the GPU Operator's device plugin: one pod per node labelled DP=true."""
    operator_harness.ensure_namespace(k8s, OPERANDS)
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": OPERANDS},
        "spec": {
            "selector": {"matchLabels": {"app": "nvidia-device-plugin"}},
            "template": {
                "metadata": {"labels": {"app": "nvidia-device-plugin"}},
                "spec": {
                    "nodeSelector": {DP: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:fake"}],
                },
            },
        },
    }
    client.AppsV1Api(k8s).create_namespaced_daemon_set(OPERANDS, body)
    try:
        yield OPERANDS
    finally:
        client.AppsV1Api(k8s).delete_namespaced_daemon_set("nvidia-device-plugin-daemonset", OPERANDS)


def plugin_pods(k8s: client.ApiClient, node: str) -> list[str]:
    listed = client.CoreV1Api(k8s).list_namespaced_pod(
        OPERANDS, field_selector=f"spec.nodeName={node}", _preload_content=False
    )
    items: list[dict[str, Any]] = yaml.safe_load(listed.data)["items"]
    return [p["metadata"]["name"] for p in items]


def report(fleet: operator_harness.Fleet, name: str, *, faulty: bool) -> None:
    """The agent: canRelease, answering the operator's release ask at once."""
    overrides = {0: {"ecc": {"uncorrectedVolatile": 2}}} if faulty else {}
    facts: dict[str, Any] = gpunode_facts.agent_status(overrides=overrides)
    facts["agent"] |= {"bootId": "boot-1", "canRelease": True}
    asked = (fleet.gpunode(name)["metadata"].get("annotations") or {}).get(keys.RELEASE_GPUS_ANNOTATION)
    if asked:
        facts["agent"]["released"] = asked
    fleet.report(name, facts)


def labels(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("labels") or {}


def resets(k8s: client.ApiClient, namespace: str, node: str) -> list[dict[str, Any]]:
    return [
        j
        for j in repair_jobs.jobs(k8s, namespace, node)
        if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == "ResetGPU"
    ]


def start(fleet: operator_harness.Fleet, k8s: client.ApiClient, name: str) -> None:
    fleet.add_node(name, labels={DP: "true", EXPORTER: "true", GFD: "false"}, report=False)
    report(fleet, name, faulty=False)
    waiting.wait_until(lambda: plugin_pods(k8s, name), timeout_seconds=TIMEOUT, message="the plugin's pod")
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 3600},
            "repair": {
                "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
                "validation": {"timeoutSeconds": 120},
                "maxConcurrent": 1,
            },
        },
    )
    report(fleet, name, faulty=True)


def until_reset(fleet: operator_harness.Fleet, k8s: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """Report as the agent until the reset Job exists; no reset may exist while the plugin's pod does."""

    def found() -> list[dict[str, Any]]:
        pods = plugin_pods(k8s, name)
        report(fleet, name, faulty=True)
        jobs = resets(k8s, ns, name)
        assert not (jobs and pods and plugin_pods(k8s, name)), f"a reset Job beside operand pod(s) {pods}"
        time.sleep(0.3)
        return jobs

    waiting.wait_until(found, timeout_seconds=TIMEOUT, message="the reset Job")
    (job,) = resets(k8s, ns, name)
    return job


def test_operands_paused_for_the_reset_and_restored(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, device_plugin: str
) -> None:
    name = f"{fleet.label}-a"
    start(fleet, k8s, name)
    job = until_reset(fleet, k8s, jobs_namespace, name)
    now = labels(fleet, name)
    assert (now[DP], now[EXPORTER], now[GFD]) == ("false", "false", "false"), now
    assert fleet.node(name)["metadata"]["annotations"][keys.OPERANDS_PAUSED_ANNOTATION] == f"{DP},{EXPORTER}"
    assert plugin_pods(k8s, name) == []
    repair_jobs.end(k8s, jobs_namespace, job, ok=True)

    def restored() -> bool:
        report(fleet, name, faulty=False)
        now = labels(fleet, name)
        return (now[DP], now[EXPORTER], now[GFD]) == ("true", "true", "false")

    waiting.wait_until(restored, timeout_seconds=TIMEOUT, message="the operand labels restored")
    assert keys.OPERANDS_PAUSED_ANNOTATION not in (fleet.node(name)["metadata"].get("annotations") or {})
    waiting.wait_until(lambda: plugin_pods(k8s, name), timeout_seconds=TIMEOUT, message="the plugin back")


def test_a_human_editing_an_operand_label_mid_step_wins(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str, device_plugin: str
) -> None:
    name = f"{fleet.label}-h"
    start(fleet, k8s, name)
    job = until_reset(fleet, k8s, jobs_namespace, name)
    fleet.core.patch_node(
        name, {"metadata": {"labels": {EXPORTER: None}}}
    )  # the human: exporter off for good
    repair_jobs.end(k8s, jobs_namespace, job, ok=True)

    def restored() -> bool:
        report(fleet, name, faulty=False)
        return labels(fleet, name).get(DP) == "true"

    waiting.wait_until(restored, timeout_seconds=TIMEOUT, message="the device plugin's label restored")
    assert EXPORTER not in labels(fleet, name), "the human's removal was undone"
    assert labels(fleet, name)[GFD] == "false"


def test_an_operator_restarted_mid_step_restores_what_the_earlier_one_paused(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    jobs_namespace: str,
    device_plugin: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = f"{fleet.label}-r"
    start(fleet, k8s, name)
    job = until_reset(fleet, k8s, jobs_namespace, name)
    operator.kill()  # kill -9 mid-step: the next process knows only the cluster
    operator.start()
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the operator leads again")
    repair_jobs.end(k8s, jobs_namespace, job, ok=True)

    def restored() -> bool:
        report(fleet, name, faulty=False)
        now = labels(fleet, name)
        return (now[DP], now[EXPORTER]) == ("true", "true")

    waiting.wait_until(restored, timeout_seconds=TIMEOUT, message="restored by the restarted operator")
    assert len(resets(k8s, jobs_namespace, name)) == 1, "a second reset Job after the restart"


def test_a_leader_change_mid_step_restores_what_was_paused_and_a_human_edit_wins(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    jobs_namespace: str,
    device_plugin: str,
    operator: operator_harness.OperatorProcess,
    tmp_path: Path,
) -> None:
    """Two replicas on one Lease: the leader pauses the operands and starts the reset, then dies (kill -9,
    no Lease release); while no one leads, a human removes the exporter's label; the standby takes the
    Lease and, when the Job ends, restores the device plugin only (what the Node's record says was
    paused and is still ours): the exporter stays removed, GFD stays "false" (off before), one reset."""
    standby = operator_harness.OperatorProcess(
        kubeconfig=operator.kubeconfig,
        log_path=tmp_path / "standby.log",
        lease_name=operator.lease_name,
        identity=f"{operator.identity}-standby",
        extra_args=operator.extra_args,
    ).start()
    try:
        waiting.wait_until(standby.healthz, timeout_seconds=30, message="the standby serves /healthz")
        assert not standby.is_leading(), "two leaders"
        name = f"{fleet.label}-l"
        start(fleet, k8s, name)
        job = until_reset(fleet, k8s, jobs_namespace, name)
        paused = fleet.node(name)["metadata"]["annotations"][keys.OPERANDS_PAUSED_ANNOTATION]
        assert paused == f"{DP},{EXPORTER}", paused
        operator.kill()  # the leader dies mid-step
        fleet.core.patch_node(name, {"metadata": {"labels": {EXPORTER: None}}})  # the human: exporter off
        waiting.wait_until(standby.is_leading, timeout_seconds=30, message="the standby takes the Lease")
        assert labels(fleet, name)[DP] == "false", "restored while the reset Job still runs"
        repair_jobs.end(k8s, jobs_namespace, job, ok=True)

        def restored() -> bool:
            report(fleet, name, faulty=False)
            return labels(fleet, name).get(DP) == "true"

        waiting.wait_until(restored, timeout_seconds=TIMEOUT, message="restored by the new leader")
        now = labels(fleet, name)
        assert EXPORTER not in now, "the human's removal was undone"
        assert now[GFD] == "false", "a label the operator never paused was changed"
        annotations = fleet.node(name)["metadata"].get("annotations") or {}
        assert keys.OPERANDS_PAUSED_ANNOTATION not in annotations, annotations
        assert len(resets(k8s, jobs_namespace, name)) == 1, "a second reset Job after the leader change"
        waiting.wait_until(lambda: plugin_pods(k8s, name), timeout_seconds=TIMEOUT, message="the plugin back")
    finally:
        standby.stop()
        print(f"--- {standby.identity}\n{standby.log()[-10000:]}")
        operator.start()  # the module's operator, for the tests after this one
        waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the operator leads again")
