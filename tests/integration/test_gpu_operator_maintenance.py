"""A GPU Operator driver upgrade across the fleet against a real API server: maintenance, not a fault storm.

Issue 30, item 3. The GPU Operator's upgrade controller labels each node it works on with
`nvidia.com/gpu-driver-upgrade-state`; while the driver reloads, the agent sees its GPUs lost. Six nodes
upgraded at once under a breaker that trips at two must stay schedulable, Unknown (GPUHealthy Unknown,
reason GPUOperatorMaintenance), and trip nothing; a node outside the upgrade losing its GPUs is still
drained, which shows the operator was acting all along.
"""

from typing import Any

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_operator.decisions import verdicts
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
LOST = {index: {"lost": True} for index in range(8)}


operator = operator_fixtures.operator_fixture("gpu-operator-it")
fleet = operator_fixtures.fleet_fixture("gpuop")


def label(fleet: operator_harness.Fleet, name: str, value: str) -> None:
    """What the GPU Operator's upgrade controller does to the node."""
    fleet.core.patch_node(name, {"metadata": {"labels": {keys.GPU_DRIVER_UPGRADE_STATE_LABEL: value}}})


def gpuhealthy(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    conditions = fleet.node(name).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == keys.NODE_CONDITION_TYPE), {})


def policy_status(fleet: operator_harness.Fleet) -> dict[str, Any]:
    policy = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    assert isinstance(policy, dict)
    return policy.get("status") or {}


def paused(fleet: operator_harness.Fleet) -> dict[str, Any]:
    return next((c for c in policy_status(fleet).get("conditions") or [] if c.get("type") == "Paused"), {})


def breaker_events(fleet: operator_harness.Fleet) -> list[Any]:
    selector = (
        f"involvedObject.name={fleet.label},involvedObject.kind={resources.POLICY_KIND},"
        "reason=RemediationPaused"
    )
    return list(fleet.core.list_event_for_all_namespaces(field_selector=selector).items)


def test_six_nodes_in_a_driver_upgrade_at_once_are_unknown_and_trip_nothing(
    fleet: operator_harness.Fleet,
) -> None:
    upgrading = [f"{fleet.label}-up{i}" for i in range(6)]
    control = f"{fleet.label}-control"
    for name in [*upgrading, control]:
        fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "lost", "condition": "GPULost", "action": "Drain"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
            "breaker": {"maxNewUnhealthy": 2, "windowSeconds": 600},
        },
    )
    for name in [*upgrading, control]:
        waiting.wait_until(
            lambda n=name: gpuhealthy(fleet, n).get("status") == "True",
            timeout_seconds=TIMEOUT,
            message=f"{name} judged healthy",
        )

    # The upgrade controller takes all six at once (maxParallelUpgrades 0): it labels them (cordon-required
    # comes minutes before the driver unloads), then the driver unloads and the agents see their GPUs lost.
    for name in upgrading:
        label(fleet, name, "pod-restart-required")
    for name in upgrading:
        waiting.wait_until(
            lambda n=name: (
                (gpuhealthy(fleet, n).get("status"), gpuhealthy(fleet, n).get("reason"))
                == ("Unknown", "GPUOperatorMaintenance")
            ),
            timeout_seconds=TIMEOUT,
            message=f"{name}: GPUHealthy Unknown, reason GPUOperatorMaintenance",
        )
    for name in upgrading:
        fleet.report(name, gpunode_facts.agent_status(overrides=LOST))
    for name in upgrading:
        waiting.wait_until(
            lambda n=name: "lost" in str(fleet.gpunode(n)["status"].get("gpus")),
            timeout_seconds=TIMEOUT,
            message=f"{name}: the lost GPUs stored",
        )
        assert fleet.gpunode(name)["status"]["health"] == "Unknown"

    # A node outside the upgrade loses its GPUs: it is drained, so the operator acts on this fleet.
    fleet.report(control, gpunode_facts.agent_status(overrides=LOST))
    waiting.wait_until(
        lambda: fleet.node(control)["spec"].get("unschedulable") is True,
        timeout_seconds=TIMEOUT,
        message="the control node is cordoned",
    )
    assert [n for n in upgrading if fleet.node(n)["spec"].get("unschedulable")] == []
    assert paused(fleet).get("status") != "True", paused(fleet)
    assert breaker_events(fleet) == []

    # The upgrade is done, the GPUs are back: healthy, nothing happened to them.
    for name in upgrading:
        fleet.report(name, gpunode_facts.agent_status())
        label(fleet, name, "upgrade-done")
    for name in upgrading:
        waiting.wait_until(
            lambda n=name: gpuhealthy(fleet, n).get("status") == "True",
            timeout_seconds=verdicts.MAINTENANCE_GRACE_SECONDS + 2 * TIMEOUT,  # held for the grace
            message=f"{name} healthy after the upgrade",
        )
    assert [n for n in upgrading if fleet.node(n)["spec"].get("unschedulable")] == []
    assert paused(fleet).get("status") != "True", paused(fleet)
    assert breaker_events(fleet) == []


def test_a_label_set_before_the_driver_unloads_hides_no_fault(fleet: operator_harness.Fleet) -> None:
    """Issue 45, item 4: `wait-for-jobs-required` (set by the upgrade controller, or by anyone who may
    label Nodes) leaves jobs on the GPUs, for as long as the longest one: an uncorrectable ECC error then
    is judged and drained as on any node."""
    name = f"{fleet.label}-ecc"
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 600},
        },
    )
    waiting.wait_until(
        lambda: gpuhealthy(fleet, name).get("status") == "True", timeout_seconds=TIMEOUT, message="healthy"
    )
    label(fleet, name, "wait-for-jobs-required")  # a human's kubectl label, or the controller's
    fleet.report(name, gpunode_facts.agent_status(overrides={3: {"ecc": {"uncorrectedVolatile": 1}}}))
    waiting.wait_until(
        lambda: fleet.gpunode(name).get("status", {}).get("action") == "Drained",
        timeout_seconds=TIMEOUT,
        message=f"{name} drained (now {fleet.gpunode(name).get('status', {}).get('action')})",
    )
    node = fleet.node(name)
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
    assert fleet.gpunode(name)["status"]["health"] == "Unhealthy"
    assert fleet.said(name, "EccUncorrectable", "GPU 3")
