"""Restart safety: kill -9 of the operator mid-drain, start it again, and the drain completes once."""

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ARGS = [
    "--lease-duration-seconds=2",
    "--lease-renew-seconds=0.5",
    "--lease-retry-seconds=0.5",
    "--tick-seconds=0.5",
]


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"restart-{secrets.token_hex(3)}") as nodes:
        yield nodes


def operator(crds: local.ControlPlane, log: Path, lease: str) -> operator_harness.OperatorProcess:
    return operator_harness.OperatorProcess(
        kubeconfig=Path(crds.kubeconfig), log_path=log, lease_name=lease, identity="restart", extra_args=ARGS
    ).start()


def pod_exists(k8s: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def test_kill_during_blocked_drain_then_restart_completes_the_drain_once(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    namespace: str,
    tmp_path: Path,
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-restart-{secrets.token_hex(2)}"
    name = f"{fleet.label}-n"
    fleet.add_node(name)
    pod = client.V1Pod.from_dict(
        {
            "metadata": {"name": "guarded", "namespace": namespace, "labels": {"app": "guarded"}},
            "spec": {
                "nodeName": name,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert pod is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, pod)
    pdb = client.V1PodDisruptionBudget.from_dict(
        {
            "metadata": {"name": "guarded", "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        }
    )
    assert pdb is not None
    policy_api = client.PolicyV1Api(k8s)
    policy_api.create_namespaced_pod_disruption_budget(namespace, pdb)
    waiting.wait_until(
        lambda: (
            (s := policy_api.read_namespaced_pod_disruption_budget("guarded", namespace).status)
            and s.current_healthy == 1
        ),
        timeout_seconds=TIMEOUT,
        message="PDB guards the running pod",
    )
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 300, "force": True},  # the pod has no controller
        },
    )

    first = operator(crds, tmp_path / "first.log", lease)
    try:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
        waiting.wait_until(
            lambda: status(fleet, name).get("action") == "Draining",
            timeout_seconds=TIMEOUT,
            message="draining",
        )
        node = fleet.node(name)
        assert node["spec"]["unschedulable"]
        started = node["metadata"]["annotations"]["gpuhealth.io/drain-started"]
        assert pod_exists(k8s, namespace, "guarded"), "the PDB blocks the eviction"
    finally:
        first.kill()
        print(f"--- first\n{first.log()[-10000:]}")

    policy_api.delete_namespaced_pod_disruption_budget("guarded", namespace)
    second = operator(crds, tmp_path / "second.log", lease)
    try:
        waiting.wait_until(
            lambda: not pod_exists(k8s, namespace, "guarded"),
            timeout_seconds=30,
            message="evicted after the restart",
        )
        waiting.wait_until(
            lambda: status(fleet, name).get("action") == "Drained",
            timeout_seconds=TIMEOUT,
            message="action Drained",
        )
        node = fleet.node(name)
        assert node["spec"]["unschedulable"]
        assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
        assert node["metadata"]["annotations"]["gpuhealth.io/drain-started"] == started, "same drain, resumed"
        waiting.wait_until(
            lambda: fleet.events(name, "NodeDrained"), timeout_seconds=TIMEOUT, message="NodeDrained"
        )
        for reason in ("NodeCordoned", "NodeDrained", "EccUncorrectable"):
            events = fleet.events(name, reason)
            assert len(events) == 1, reason
            assert events[0]["count"] == 1, reason
    finally:
        second.stop()
        print(f"--- second\n{second.log()[-10000:]}")


def make_pod(k8s: client.ApiClient, namespace: str, name: str, node: str) -> None:
    body = client.V1Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert body is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)
    waiting.wait_until(
        lambda: (
            (p := client.CoreV1Api(k8s).read_namespaced_pod(name, namespace).status) and p.phase == "Running"
        ),
        timeout_seconds=TIMEOUT,
        message=f"pod {name} runs",
    )


def test_human_uncordon_and_a_new_fault_across_restarts_drain_the_node_again(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Each step with a fresh operator process: the override and the drain state live in the cluster."""
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-restart-{secrets.token_hex(2)}"
    name = f"{fleet.label}-o"
    fleet.add_node(name)
    make_pod(k8s, namespace, "before", name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 300, "force": True},  # make_pod has no controller
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
        },
    )

    def annotations() -> dict[str, str]:
        return fleet.node(name)["metadata"].get("annotations") or {}

    def step(log: str) -> operator_harness.OperatorProcess:
        return operator(crds, tmp_path / log, lease)

    first = step("first.log")
    try:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
        waiting.wait_until(
            lambda: not pod_exists(k8s, namespace, "before"), timeout_seconds=TIMEOUT, message="drained"
        )
        waiting.wait_until(
            lambda: status(fleet, name).get("action") == "Drained", timeout_seconds=TIMEOUT, message="Drained"
        )
    finally:
        first.stop()
        print(f"--- first\n{first.log()[-10000:]}")

    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})  # kubectl uncordon, the operator down
    second = step("second.log")
    try:
        waiting.wait_until(
            lambda: status(fleet, name).get("action") == "Overridden",
            timeout_seconds=TIMEOUT,
            message="Overridden",
        )
        meta = annotations()
        assert keys.CORDONED_BY_ANNOTATION not in meta
        assert "gpuhealth.io/drain-started" not in meta
        assert "gpuhealth.io/overridden-evidence" in meta
        waiting.wait_until(
            lambda: fleet.events(name, "OverriddenByUser"),
            timeout_seconds=TIMEOUT,
            message="OverriddenByUser",
        )
    finally:
        second.stop()
        print(f"--- second\n{second.log()[-10000:]}")

    make_pod(k8s, namespace, "after", name)
    third = step("third.log")
    try:
        waiting.wait_until(third.is_leading, timeout_seconds=TIMEOUT, message="third operator leads")
        waiting.holds(
            lambda: not fleet.node(name)["spec"].get("unschedulable") and pod_exists(k8s, namespace, "after"),
            seconds=3,
            interval_seconds=0.2,
            message="a restart remembers the override: not cordoned again on the same evidence",
        )
    finally:
        third.stop()
        print(f"--- third\n{third.log()[-10000:]}")

    fleet.report(name, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 2}}}))
    fourth = step("fourth.log")
    try:
        waiting.wait_until(
            lambda: not pod_exists(k8s, namespace, "after"),
            timeout_seconds=TIMEOUT,
            message="the new fault drains the pod that landed after the override",
        )
        waiting.wait_until(
            lambda: status(fleet, name).get("action") == "Drained", timeout_seconds=TIMEOUT, message="Drained"
        )
        meta = annotations()
        assert fleet.node(name)["spec"]["unschedulable"]
        assert meta[keys.CORDONED_BY_ANNOTATION] == fleet.label
        assert "gpuhealth.io/overridden-evidence" not in meta
        assert not fleet.events(name, "DrainFailed")
        (event,) = fleet.events(name, "OverriddenByUser")
        assert event["count"] == 1
    finally:
        fourth.stop()
        print(f"--- fourth\n{fourth.log()[-10000:]}")


def test_a_cordon_whose_term_died_before_its_events_is_announced_once_and_drained_once(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A term cordons and dies before saying so; the next says NodeCordoned and NodeDrained, once each.

    The dead term is played by hand: the Node is cordoned with our annotations, no Event. Then
    a term that said NodeDrained dies before writing `action: Drained`; its successor drains the
    (empty) node again and finds both Events already said.
    """
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-restart-{secrets.token_hex(2)}"
    name = f"{fleet.label}-c"
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 300},
        },
    )
    fleet.report(name, gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": 1}}}))
    cordoned_at = "2026-11-23T19:00:00.123456Z"
    annotations = {
        keys.CORDONED_BY_ANNOTATION: fleet.label,
        "gpuhealth.io/cordoned-at": cordoned_at,
        "gpuhealth.io/drain-started": cordoned_at,
    }
    fleet.core.patch_node(name, {"metadata": {"annotations": annotations}, "spec": {"unschedulable": True}})

    def said(reason: str) -> list[dict[str, Any]]:
        return fleet.events(name, reason)

    for log in ("first.log", "second.log"):
        term = operator(crds, tmp_path / log, lease)
        try:
            waiting.wait_until(
                lambda: status(fleet, name).get("action") == "Drained" and said("NodeDrained"),
                timeout_seconds=TIMEOUT,
                message="drained and said so",
            )
        finally:
            term.kill()
            print(f"--- {log}\n{term.log()[-10000:]}")
        for reason in ("NodeCordoned", "NodeDrained"):
            events = said(reason)
            assert [e["count"] for e in events] == [1], reason
            assert f"cordoned at {cordoned_at}" in events[0]["message"], reason
        # As if the term died between NodeDrained and `action: Drained`: the next one drains again.
        fleet.custom.patch_cluster_custom_object_status(
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            name,
            {"status": {"action": "Draining"}},
        )
