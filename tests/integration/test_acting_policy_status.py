"""What a GPUNode's status and its Node's GPUHealthy condition report under several policies (issue 24,
item 7), against a real API server.

They follow the acting policies' strongest verdict (the most severe health,
then the strongest action); a dry-run policy shows only where no acting policy
selects the node; `status.policies` lists each selecting policy's own verdict.
Before, the first selecting policy *by name* was reported: the documented
dry-run preview, named first, hid a drained node (`action: DryRun`, no
GPUHealthy for MachineHealthCheck / NHC), and a policy with milder rules hid a
node waiting for the shared budget (`action: None` instead of `Pending`).
"""

from typing import Any

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
CORDON = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}
LABEL = {"name": "ecc", "condition": "EccUncorrectable", "action": "Label"}


operator = operator_fixtures.operator_fixture("reported-it")
fleet = operator_fixtures.fleet_fixture("rp")


def spec(rule: dict[str, str], **fields: Any) -> dict[str, Any]:
    return {"rules": [rule], "maxUnavailable": 1, **fields}


def status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def gpu_healthy(fleet: operator_harness.Fleet, name: str) -> dict[str, Any] | None:
    conditions = fleet.node(name).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == keys.NODE_CONDITION_TYPE), None)


def by_policy(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    """Policy → its action on the node, from `status.policies`."""
    return {e["policy"]: e["action"] for e in status(fleet, name).get("policies") or []}


def judged(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        waiting.wait_until(
            lambda n=name: status(fleet, n).get("health") == "Healthy",
            timeout_seconds=TIMEOUT,
            message=f"{name} judged",
        )


def test_a_dry_run_preview_named_first_does_not_hide_a_cordon(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-n"[:63]
    fleet.add_node(name)
    preview, acting = f"{fleet.label}-a-preview", f"{fleet.label}-z-acting"  # the preview sorts first
    fleet.policy(preview, spec(CORDON, dryRun=True))
    fleet.policy(acting, spec(CORDON))
    judged(fleet, [name])
    fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordoned"
    )
    waiting.wait_until(
        lambda: by_policy(fleet, name) == {preview: "DryRun", acting: "Cordoned"},
        timeout_seconds=TIMEOUT,
        message="each policy's verdict listed",
    )
    assert (status(fleet, name)["health"], status(fleet, name)["action"]) == ("Unhealthy", "Cordoned")
    condition = gpu_healthy(fleet, name)
    assert condition is not None, "GPUHealthy never written: MachineHealthCheck / NHC are blind"
    assert (condition["status"], condition["reason"]) == ("False", "EccUncorrectable")


def test_a_node_waiting_for_the_shared_budget_shows_pending(fleet: operator_harness.Fleet) -> None:
    """`-a` only labels ECC faults, `-b` cordons them; both select both nodes, one place each."""
    names = [f"{fleet.label}-{i}"[:63] for i in range(2)]
    for name in names:
        fleet.add_node(name)
    labelling, cordoning = f"{fleet.label}-a", f"{fleet.label}-b"
    fleet.policy(labelling, spec(LABEL))
    fleet.policy(cordoning, spec(CORDON))
    judged(fleet, names)
    fleet.report(names[0], gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: fleet.node(names[0])["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordon"
    )
    fleet.report(names[1], gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: fleet.events(names[1], "DisruptionBudgetExceeded"), timeout_seconds=TIMEOUT, message="waits"
    )
    waiting.wait_until(
        lambda: status(fleet, names[1]).get("action") == "Pending",
        timeout_seconds=TIMEOUT,
        message="action Pending, not the labelling policy's",
    )
    assert by_policy(fleet, names[1]) == {labelling: "Labeled", cordoning: "Pending"}
    assert status(fleet, names[0])["action"] == "Cordoned"
    assert not fleet.node(names[1])["spec"].get("unschedulable")
