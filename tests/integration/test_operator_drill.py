"""Fire drills against a real API server: the whole path said, nothing done, over at the TTL.

`kubectl annotate gpunode NODE gpuhealth.io/drill=EccUncorrectable` on a
healthy node under a Drain policy: `Drill` Events say the node would be
cordoned and drained, the GPUNode shows action `Drill`, the drill metrics
count it, and the Node, its pod and the budget are untouched (a real fault
elsewhere under maxUnavailable=1 is still cordoned). At the TTL the operator
ends the drill itself. One operator process serves the module.
"""

import re
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
ECC = {"ecc": {"uncorrectedVolatile": 1}}
DRAIN = {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}


operator = operator_fixtures.operator_fixture("drill-it")
fleet = operator_fixtures.fleet_fixture("dr")


def action(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name).get("status") or {}).get("action")


def node_as_users_see_it(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    """Everything gpu-health could change on a Node (kwok's heartbeats aside)."""
    node = fleet.node(name)
    conditions = node.get("status", {}).get("conditions") or []
    ours = [
        {k: c.get(k) for k in ("status", "reason", "message", "lastTransitionTime")}
        for c in conditions
        if c["type"] == keys.NODE_CONDITION_TYPE
    ]
    return {
        "labels": node["metadata"].get("labels") or {},
        "annotations": node["metadata"].get("annotations") or {},
        "taints": node["spec"].get("taints") or [],
        "unschedulable": bool(node["spec"].get("unschedulable")),
        "condition": ours,
    }


def drill_gauge(operator: operator_harness.OperatorProcess, policy: str, health: str) -> float | None:
    pattern = rf'^gpuhealth_operator_drill_nodes\{{health="{health}",policy="{policy}"\}} (\S+)$'
    match = re.search(pattern, operator.metrics(), flags=re.M)
    return float(match[1]) if match else None


def test_a_drill_says_cordon_and_drain_and_touches_nothing_until_its_ttl(
    fleet: operator_harness.Fleet,
    operator: operator_harness.OperatorProcess,
    k8s: client.ApiClient,
    namespace: str,
) -> None:
    drilled, faulty = (f"{fleet.label}-{s}"[:63] for s in ("drill", "real"))
    fleet.add_node(drilled)
    fleet.add_node(faulty)
    policy = fleet.label
    fleet.policy(
        policy,
        {"rules": [DRAIN], "maxUnavailable": 1, "drain": {"timeoutSeconds": 30, "force": True}},
    )
    pod = client.V1Pod.from_dict(
        {
            "metadata": {"name": "workload", "namespace": namespace},
            "spec": {
                "nodeName": drilled,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert pod is not None
    fleet.core.create_namespaced_pod(namespace, pod)

    def pod_phase() -> str | None:
        read = fleet.core.read_namespaced_pod("workload", namespace)
        return None if read.metadata.deletion_timestamp else read.status.phase

    waiting.wait_until(lambda: pod_phase() == "Running", timeout_seconds=TIMEOUT, message="workload runs")
    waiting.wait_until(
        lambda: (
            node_as_users_see_it(fleet, drilled)["condition"]
            and node_as_users_see_it(fleet, drilled)["labels"].get(keys.HEALTH_LABEL) == "healthy"
        ),
        timeout_seconds=TIMEOUT,
        message="the node judged healthy",
    )
    before = node_as_users_see_it(fleet, drilled)

    fleet.annotate_gpunode(
        drilled, {keys.DRILL_ANNOTATION: "EccUncorrectable", keys.DRILL_TTL_ANNOTATION: "12s"}
    )
    waiting.wait_until(
        lambda: any(
            m == f"Drill: policy {policy} would label gpuhealth.io/health=unhealthy, cordon and drain "
            "(EccUncorrectable)."
            for m in fleet.messages(drilled, "Drill")
        ),
        timeout_seconds=TIMEOUT,
        message="a Drill Event naming cordon and drain",
    )
    fleet.said(drilled, "Drill", "Drill started: EccUncorrectable", timeout_seconds=TIMEOUT)
    waiting.wait_until(lambda: action(fleet, drilled) == "Drill", timeout_seconds=TIMEOUT, message="Drill")
    status = fleet.gpunode(drilled)["status"]
    assert (status["health"], status["issues"]) == ("Healthy", ""), "the real verdict stays real"
    assert keys.DRILL_STARTED_ANNOTATION in fleet.gpunode(drilled)["metadata"]["annotations"]
    assert drill_gauge(operator, policy, "Unhealthy") == 1.0
    assert not fleet.events(drilled, "EccUncorrectable"), "no condition Event for a drill"

    # The budget is checked, not taken: a real fault under maxUnavailable=1 is still cordoned.
    fleet.report(faulty, gpunode_facts.agent_status(overrides={0: ECC}))
    waiting.wait_until(
        lambda: fleet.node(faulty)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="the real fault cordoned",
    )
    waiting.wait_until(
        lambda: any("budget has no free place" in m for m in fleet.messages(drilled, "Drill")),
        timeout_seconds=TIMEOUT,
        message="the drill now says it would wait for the budget",
    )
    waiting.holds(
        lambda: node_as_users_see_it(fleet, drilled) == before and pod_phase() == "Running",
        seconds=2,
        message="the drilled Node and its pod untouched",
    )

    # At the TTL the drill ends by itself.
    waiting.wait_until(
        lambda: any(m.startswith("Drill ended: its TTL of 12s") for m in fleet.messages(drilled, "Drill")),
        timeout_seconds=TIMEOUT,
        message="the drill ends at its TTL",
    )
    waiting.wait_until(lambda: action(fleet, drilled) == "None", timeout_seconds=TIMEOUT, message="None")
    annotations = fleet.gpunode(drilled)["metadata"].get("annotations") or {}
    assert not {keys.DRILL_ANNOTATION, keys.DRILL_TTL_ANNOTATION, keys.DRILL_STARTED_ANNOTATION} & set(
        annotations
    )
    assert drill_gauge(operator, policy, "Unhealthy") == 0.0
    said = len(fleet.events(drilled, "Drill"))
    waiting.holds(
        lambda: (
            len(fleet.events(drilled, "Drill")) == said
            and action(fleet, drilled) == "None"
            and node_as_users_see_it(fleet, drilled) == before
            and pod_phase() == "Running"
        ),
        seconds=3,
        message="no more Drill Events, nothing touched",
    )


def test_an_unknown_condition_is_refused_and_a_removed_annotation_ends_the_drill(
    fleet: operator_harness.Fleet,
) -> None:
    name = f"{fleet.label}-n"[:63]
    fleet.add_node(name)
    fleet.policy(fleet.label, {"rules": [DRAIN], "maxUnavailable": 1})
    waiting.wait_until(lambda: action(fleet, name) == "None", timeout_seconds=TIMEOUT, message="judged")

    fleet.annotate_gpunode(name, {keys.DRILL_ANNOTATION: "EccUncorectable"})
    waiting.wait_until(
        lambda: [e for e in fleet.events(name, "Drill") if e["type"] == "Warning"],
        timeout_seconds=TIMEOUT,
        message="a Warning Drill Event",
    )
    refusal = fleet.messages(name, "Drill")[0]
    assert "'EccUncorectable' is not a condition" in refusal and "EccUncorrectable, " in refusal
    waiting.holds(lambda: action(fleet, name) == "None", seconds=2, message="no drill runs")

    fleet.annotate_gpunode(name, {keys.DRILL_ANNOTATION: "GPULost"})
    waiting.wait_until(lambda: action(fleet, name) == "Drill", timeout_seconds=TIMEOUT, message="Drill")
    fleet.annotate_gpunode(name, {keys.DRILL_ANNOTATION: None})
    waiting.wait_until(lambda: action(fleet, name) == "None", timeout_seconds=TIMEOUT, message="ended")
    fleet.said(name, "Drill", "annotation was removed", timeout_seconds=TIMEOUT)
    waiting.wait_until(
        lambda: (
            keys.DRILL_STARTED_ANNOTATION not in (fleet.gpunode(name)["metadata"].get("annotations") or {})
        ),
        timeout_seconds=TIMEOUT,
        message="drill-started cleaned up",
    )
