"""A human's uncordon overrides the operator, and every cordon drains: against a real API server.

A human uncordons a node gpu-health cordoned (as `kubectl uncordon` does: a
patch of `spec.unschedulable` to false). The operator must drop its claim
(annotation, drain bookkeeping, budget slot) within a tick, say so once
(`OverriddenByUser`), show `Overridden` in `kubectl get gpunodes`, and not
cordon again on the same evidence, only on new evidence. A human's later
cordon is theirs: never undone. A node cordoned again after an override is
drained again, and `Drained` means no evictable pod is left on it.
"""

from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
OVERRIDDEN_ANNOTATION = "gpuhealth.io/overridden-evidence"
DRAIN_STARTED = "gpuhealth.io/drain-started"


def ecc(count: int) -> dict[str, Any]:
    return gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": count}}})


operator = operator_fixtures.operator_fixture("overrides")
fleet = operator_fixtures.fleet_fixture("ovr")


def drain_policy(fleet: operator_harness.Fleet, max_unavailable: int = 1) -> None:
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": max_unavailable,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 30, "force": True},  # make_pod has no controller
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
        },
    )


def annotations(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("annotations") or {}


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def wait_action(fleet: operator_harness.Fleet, name: str, action: str, timeout: float = TIMEOUT) -> None:
    waiting.wait_until(
        lambda: status(fleet, name).get("action") == action,
        timeout_seconds=timeout,
        message=f"action {action}",
    )


def human_uncordon(fleet: operator_harness.Fleet, name: str) -> None:
    """What `kubectl uncordon` sends."""
    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})


def human_cordon(fleet: operator_harness.Fleet, name: str) -> None:
    fleet.core.patch_node(name, {"spec": {"unschedulable": True}})


def make_pod(k8s: client.ApiClient, namespace: str, name: str, node: str) -> None:
    body = client.V1Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert body is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)


def pod_exists(k8s: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def pod_running(k8s: client.ApiClient, namespace: str, name: str) -> bool:
    pod = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    return bool(pod.status and pod.status.phase == "Running")


def wait_overridden(fleet: operator_harness.Fleet, name: str) -> None:
    """The claim is dropped, the override said once, the node shown Overridden with its issue still listed."""
    waiting.wait_until(
        lambda: keys.CORDONED_BY_ANNOTATION not in annotations(fleet, name),
        timeout_seconds=TIMEOUT,
        message="claim annotation dropped",
    )
    waiting.wait_until(
        lambda: fleet.events(name, "OverriddenByUser"), timeout_seconds=TIMEOUT, message="OverriddenByUser"
    )
    wait_action(fleet, name, "Overridden")
    assert "EccUncorrectable" in status(fleet, name).get("issues", "")
    meta = annotations(fleet, name)
    assert DRAIN_STARTED not in meta, "drain bookkeeping belongs to the cordon the human lifted"
    assert OVERRIDDEN_ANNOTATION in meta, "the evidence baseline is kept in the cluster"
    (event,) = fleet.events(name, "OverriddenByUser")
    assert "EccUncorrectable" in event["message"], event["message"]


def test_human_uncordon_drops_the_claim_frees_the_budget_and_only_new_evidence_acts_again(
    fleet: operator_harness.Fleet,
) -> None:
    first, second = f"{fleet.label}-a", f"{fleet.label}-b"
    fleet.add_node(first)
    fleet.add_node(second)
    drain_policy(fleet, max_unavailable=1)
    fleet.report(first, ecc(1))
    wait_action(fleet, first, "Drained")
    fleet.report(second, ecc(1))
    wait_action(fleet, second, "Pending")

    human_uncordon(fleet, first)
    wait_overridden(fleet, first)
    # The budget slot went with the claim: the other faulty node is cordoned under maxUnavailable=1.
    waiting.wait_until(lambda: cordoned(fleet, second), timeout_seconds=TIMEOUT, message="second cordoned")
    wait_action(fleet, second, "Drained")
    waiting.holds(
        lambda: not cordoned(fleet, first) and status(fleet, first).get("action") == "Overridden",
        seconds=3,
        interval_seconds=0.2,
        message="not cordoned again on the same evidence",
    )

    # The second node recovers and gives the budget back; then the first one's counter grows: new evidence.
    fleet.report(second, ecc(0))
    waiting.wait_until(
        lambda: not cordoned(fleet, second), timeout_seconds=TIMEOUT, message="second released"
    )
    fleet.report(first, ecc(2))
    waiting.wait_until(lambda: cordoned(fleet, first), timeout_seconds=TIMEOUT, message="cordoned again")
    meta = annotations(fleet, first)
    assert meta.get(keys.CORDONED_BY_ANNOTATION) == fleet.label
    assert OVERRIDDEN_ANNOTATION not in meta
    wait_action(fleet, first, "Drained")
    (event,) = fleet.events(first, "OverriddenByUser")
    assert event["count"] == 1


def test_a_human_cordon_after_the_override_is_never_undone(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-h"
    fleet.add_node(name)
    drain_policy(fleet)
    fleet.report(name, ecc(1))
    wait_action(fleet, name, "Drained")
    human_uncordon(fleet, name)
    wait_overridden(fleet, name)

    human_cordon(fleet, name)  # maintenance
    waiting.holds(
        lambda: cordoned(fleet, name), seconds=3, interval_seconds=0.2, message="the human's cordon stays"
    )
    fleet.report(name, ecc(0))  # the GPU was reset: healthy, well past healthyForSeconds (1 s)
    waiting.wait_until(
        lambda: status(fleet, name).get("health") == "Healthy", timeout_seconds=TIMEOUT, message="healthy"
    )
    waiting.holds(
        lambda: cordoned(fleet, name),
        seconds=3,
        interval_seconds=0.2,
        message="a human's cordon is never lifted",
    )
    meta = annotations(fleet, name)
    assert keys.CORDONED_BY_ANNOTATION not in meta
    assert DRAIN_STARTED not in meta
    # Only a human uncordoned this node (and cordoned it again): the operator said no uncordon at all.
    assert fleet.events(name, "NodeUncordoned") == []


def test_recordon_after_an_override_drains_again_and_drained_means_empty(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    name = f"{fleet.label}-d"
    fleet.add_node(name)
    make_pod(k8s, namespace, "before", name)
    waiting.wait_until(
        lambda: pod_running(k8s, namespace, "before"), timeout_seconds=TIMEOUT, message="pod runs"
    )
    drain_policy(fleet)
    fleet.report(name, ecc(1))
    waiting.wait_until(
        lambda: not pod_exists(k8s, namespace, "before"),
        timeout_seconds=TIMEOUT,
        message="first drain evicts",
    )
    wait_action(fleet, name, "Drained")

    human_uncordon(fleet, name)
    wait_overridden(fleet, name)
    make_pod(k8s, namespace, "after", name)
    waiting.wait_until(
        lambda: pod_running(k8s, namespace, "after"), timeout_seconds=TIMEOUT, message="a pod lands"
    )

    fleet.report(name, ecc(3))  # the same node faults again: new evidence
    waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="cordoned again")
    waiting.wait_until(
        lambda: not pod_exists(k8s, namespace, "after"),
        timeout_seconds=TIMEOUT,
        message="the new pod evicted",
    )
    wait_action(fleet, name, "Drained")

    # A pod bound to the node after the drain (nodeName bypasses the cordon) is evicted too.
    make_pod(k8s, namespace, "late", name)
    waiting.wait_until(
        lambda: not pod_exists(k8s, namespace, "late"), timeout_seconds=40, message="the late pod evicted"
    )
    wait_action(fleet, name, "Drained")


def test_a_node_someone_else_cordoned_is_neither_drained_nor_stamped(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    name = f"{fleet.label}-m"
    fleet.add_node(name)
    make_pod(k8s, namespace, "work", name)
    waiting.wait_until(
        lambda: pod_running(k8s, namespace, "work"), timeout_seconds=TIMEOUT, message="pod runs"
    )
    human_cordon(fleet, name)  # maintenance, before any fault
    drain_policy(fleet)
    fleet.report(name, ecc(1))
    wait_action(fleet, name, "Cordoned")
    waiting.holds(
        lambda: pod_exists(k8s, namespace, "work") and DRAIN_STARTED not in annotations(fleet, name),
        seconds=3,
        interval_seconds=0.2,
        message="not our cordon: no drain, no drain-started",
    )
    assert keys.CORDONED_BY_ANNOTATION not in annotations(fleet, name)
