"""The disruption budget against a real API server: one budget across policies, counted in GPU nodes.

Safety rule 2 (DESIGN.md): a policy never holds more than `maxUnavailable` of
its selected GPU nodes (Nodes with a GPUNode) unschedulable, and a node that
several policies select needs every one's budget. One operator process
serves the module, as in test_operator.py; each test makes its own kwok Nodes
with a label unique to the test.
"""

from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import nodes

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ECC = {"ecc": {"uncorrectedVolatile": 1}}
CORDON = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}


operator = operator_fixtures.operator_fixture("budget-it")
fleet = operator_fixtures.fleet_fixture("bu")


def spec(**fields: Any) -> dict[str, Any]:
    return {"rules": [CORDON], "recovery": {"uncordon": True, "healthyForSeconds": 1}, **fields}


def cordoned(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if fleet.node(n)["spec"].get("unschedulable")]


def action(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name).get("status") or {}).get("action")


def told_to_wait(fleet: operator_harness.Fleet, name: str) -> bool:
    """The node was told it waits for the budget (by whichever policy wants it cordoned)."""
    return bool(fleet.events(name, "DisruptionBudgetExceeded"))


def judged(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        waiting.wait_until(
            lambda n=name: (fleet.node(n)["metadata"].get("labels") or {}).get(keys.HEALTH_LABEL),
            timeout_seconds=TIMEOUT,
            message=f"{name} judged",
        )


def exactly_one_cordoned(fleet: operator_harness.Fleet, names: list[str]) -> None:
    waiting.wait_until(lambda: cordoned(fleet, names), timeout_seconds=TIMEOUT, message="a cordon")
    waiting.holds(lambda: len(cordoned(fleet, names)) <= 1, seconds=2, message="at most one node cordoned")
    for name in names:
        if name not in cordoned(fleet, names):
            waiting.wait_until(
                lambda n=name: told_to_wait(fleet, n), timeout_seconds=TIMEOUT, message=f"{name} waits"
            )
    waiting.holds(lambda: len(cordoned(fleet, names)) <= 1, seconds=3, message="at most one node cordoned")


def test_two_policies_over_the_same_nodes_share_one_budget(fleet: operator_harness.Fleet) -> None:
    """maxUnavailable=1 in each of two policies over the same 4 nodes: 3 faults at once, 1 cordon.

    The policies cordon for different conditions, so each ranks a different node first. A human
    cordon holds both budgets while the faults arrive; uncordoning it frees both at once, and the
    next timer pass acts on every waiting node concurrently.
    """
    names = [f"{fleet.label}-s{i}"[:63] for i in range(4)]
    faulty, held = names[:3], names[3]
    for name in names:
        fleet.add_node(name)
    fleet.core.patch_node(held, {"spec": {"unschedulable": True}})
    lost = {"name": "lost", "condition": "GPULost", "action": "Cordon"}
    fleet.policy(fleet.label, spec(maxUnavailable=1))
    fleet.policy(f"{fleet.label}-b", spec(maxUnavailable=1, rules=[lost]))
    judged(fleet, names)
    fleet.report(faulty[0], gpunode_facts.agent_status(overrides={0: ECC}))
    fleet.report(faulty[1], gpunode_facts.agent_status(overrides={1: {"lost": True}}))
    fleet.report(faulty[2], gpunode_facts.agent_status(overrides={0: ECC, 1: {"lost": True}}))
    for name in faulty:
        waiting.wait_until(
            lambda n=name: told_to_wait(fleet, n), timeout_seconds=TIMEOUT, message=f"{name} waits"
        )
    fleet.core.patch_node(held, {"spec": {"unschedulable": False}})
    exactly_one_cordoned(fleet, faulty)


def test_a_percentage_is_of_the_gpu_nodes_not_of_every_node_selected(
    fleet: operator_harness.Fleet, crds: local.ControlPlane
) -> None:
    """5 GPU nodes among 50 CPU nodes, 10%: one GPU node at a time, and `kubectl get ghp` says 5 selected."""
    for i in range(50):  # CPU nodes: the selector matches them, but no agent runs there
        name = f"{fleet.label}-cpu{i}"[:63]
        body = {
            "metadata": {
                "name": name,
                "labels": {"type": "kwok", fleet.LABEL_KEY: fleet.label},
                "annotations": {nodes.KWOK_ANNOTATION: nodes.KWOK_MANAGED},
            }
        }
        fleet.core.create_node(body=client.V1Node.from_dict(body))
        fleet.names.append(name)
    gpus = [f"{fleet.label}-gpu{i}"[:63] for i in range(5)]
    for name in gpus:
        fleet.add_node(name)
    fleet.policy(fleet.label, spec(maxUnavailable="10%"))
    judged(fleet, gpus)
    for name in gpus:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
    exactly_one_cordoned(fleet, gpus)
    assert sorted(action(fleet, n) for n in gpus) == ["Cordoned", *["Pending"] * 4]

    def selected() -> int | None:
        policy = fleet.custom.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
        )
        assert isinstance(policy, dict)
        return (policy.get("status") or {}).get("selectedNodes")

    waiting.wait_until(lambda: selected() == 5, timeout_seconds=TIMEOUT, message="5 GPU nodes selected")
    table = crds.kubectl("get", "ghp", fleet.label).stdout.split()
    header = ["NAME", "SELECTED", "UNHEALTHY", "CORDONED", "PENDING", "PAUSED", "DEGRADED", "DRYRUN", "AGE"]
    assert table[:10] == [*header, fleet.label]
    assert table[10] == "5", table
