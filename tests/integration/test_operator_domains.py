"""Topology domains (`spec.topology.domains`) against a real API server.

An NVL72-like clique of 8 nodes (label nvidia.com/gpu.clique) with a
threshold of 5: 4 Unhealthy nodes mark nothing; the 5th marks every node of
the clique (label gpuhealth.io/domain-degraded=true) within seconds, with one
DomainDegraded Event on the policy, and never cordons a healthy node; after
recovery the marks go after the hold. Another clique is untouched, an
opted-out node is left alone, overlapping policies keep a mark until neither
wants it, and a dry-run policy writes nothing. One operator process serves
the module, as in test_operator_budget.py.
"""

import json
import time
from typing import Any

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
CLIQUE = "nvidia.com/gpu.clique"
DEGRADED = keys.DOMAIN_DEGRADED_LABEL
ECC = {"ecc": {"uncorrectedVolatile": 1}}
CORDON = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}
HOLD = 8
"""recovery.healthyForSeconds: long enough that the marks are seen held after a burst of reports."""


operator = operator_fixtures.operator_fixture("domains-it")
fleet = operator_fixtures.fleet_fixture("do")


def spec(unhealthy: int | str = 5, action: str = "Label", **fields: Any) -> dict[str, Any]:
    return {
        "rules": [CORDON],
        "maxUnavailable": "100%",
        "recovery": {"uncordon": True, "healthyForSeconds": HOLD},
        "topology": {"domains": [{"key": CLIQUE, "unhealthy": unhealthy, "action": action}]},
        **fields,
    }


def clique(fleet: operator_harness.Fleet, name: str, size: int) -> list[str]:
    names = [f"{fleet.label}-{name}{i}"[:63] for i in range(size)]
    for node in names:
        fleet.add_node(node, labels={CLIQUE: f"{fleet.label}-{name}"})
    return names


def labels(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("labels") or {}


def marked(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if labels(fleet, n).get(DEGRADED) == "true"]


def tainted(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if any(t["key"] == DEGRADED for t in fleet.node(n)["spec"].get("taints") or [])]


def unschedulable(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if fleet.node(n)["spec"].get("unschedulable")]


def policy_events(fleet: operator_harness.Fleet, policy: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={policy},involvedObject.kind={resources.POLICY_KIND},reason={reason}"
    response = fleet.core.list_event_for_all_namespaces(field_selector=selector, _preload_content=False)
    return list(json.loads(response.data)["items"])


def degraded_status(fleet: operator_harness.Fleet, policy: str) -> list[dict[str, Any]]:
    body = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, policy
    )
    assert isinstance(body, dict)
    return list(((body.get("status") or {}).get("topology") or {}).get("degraded") or [])


def judged(fleet: operator_harness.Fleet, names: list[str], health: str) -> None:
    for name in names:
        waiting.wait_until(
            lambda n=name: labels(fleet, n).get(keys.HEALTH_LABEL) == health,
            timeout_seconds=TIMEOUT,
            message=f"{name} judged {health}",
        )


def fault(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))


def heal(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        fleet.report(name, gpunode_facts.agent_status())


def test_five_of_eight_degrade_the_clique_and_it_recovers_after_the_hold(
    fleet: operator_harness.Fleet, crds: local.ControlPlane, operator: operator_harness.OperatorProcess
) -> None:
    a = clique(fleet, "a", 8)
    b = clique(fleet, "b", 3)
    excluded = f"{fleet.label}-ax"[:63]
    fleet.add_node(excluded, labels={CLIQUE: f"{fleet.label}-a", keys.EXCLUDE_LABEL: "true"})
    loose = f"{fleet.label}-loose"[:63]
    fleet.add_node(loose)  # no clique label: no domain
    fleet.policy(fleet.label, spec())
    judged(fleet, [*a, *b, loose], "healthy")

    fault(fleet, [*a[:4], b[0], loose])
    judged(fleet, [*a[:4], b[0], loose], "unhealthy")
    waiting.holds(lambda: not marked(fleet, [*a, *b, excluded, loose]), seconds=2, message="4 of 8: no mark")

    fault(fleet, [a[4]])
    waiting.wait_until(lambda: len(marked(fleet, a)) == 8, timeout_seconds=10, message="the clique marked")
    assert marked(fleet, [*b, excluded, loose]) == [], "another clique, an opted-out node, no clique"
    assert unschedulable(fleet, a[5:]) == [], "a healthy node of a degraded domain is never cordoned"
    assert tainted(fleet, a) == [], "action Label does not taint"
    events = waiting.wait_until(
        lambda: policy_events(fleet, fleet.label, "DomainDegraded"),
        timeout_seconds=TIMEOUT,
        message="the Event",
    )
    assert len(events) == 1 and events[0]["count"] == 1, events
    assert f"{CLIQUE}={fleet.label}-a: 5 of 8 selected nodes Unhealthy" in events[0]["message"]
    status = waiting.wait_until(
        lambda: degraded_status(fleet, fleet.label),
        timeout_seconds=TIMEOUT,
        message="status.topology.degraded",
    )
    assert [(s["key"], s["value"], s["unhealthy"], s["nodes"]) for s in status] == [
        (CLIQUE, f"{fleet.label}-a", 5, 8)
    ]
    series = f'key="{CLIQUE}",policy="{fleet.label}",value="{fleet.label}-a"'
    metric = f"gpuhealth_operator_topology_domain_degraded{{{series}}} 1.0"
    waiting.wait_until(lambda: metric in operator.metrics(), timeout_seconds=TIMEOUT, message="the gauge")
    table = crds.kubectl("get", "ghp", fleet.label).stdout.splitlines()
    assert table[0].split()[6] == "DEGRADED" and table[1].split()[6] == f"{fleet.label}-a", table

    healing = time.monotonic()  # the domain cannot be below its threshold before this
    heal(fleet, [*a, *b, loose])
    assert len(marked(fleet, a)) == 8, "marks held during the hold"
    waiting.wait_until(lambda: not marked(fleet, a), timeout_seconds=TIMEOUT, message="marks lifted")
    assert time.monotonic() - healing >= HOLD, "lifted only after healthyForSeconds below the threshold"
    waiting.wait_until(
        lambda: policy_events(fleet, fleet.label, "DomainRecovered"),
        timeout_seconds=TIMEOUT,
        message="recovered",
    )
    assert len(policy_events(fleet, fleet.label, "DomainDegraded")) == 1, "no flapping: one transition"
    waiting.wait_until(
        lambda: not degraded_status(fleet, fleet.label), timeout_seconds=TIMEOUT, message="status"
    )
    waiting.wait_until(
        lambda: metric not in operator.metrics(), timeout_seconds=TIMEOUT, message="series gone"
    )


def test_taint_overlapping_policies_keep_marks_until_neither_wants_them(
    fleet: operator_harness.Fleet,
) -> None:
    """P1 labels at 5 of 8, P2 taints (and labels) at 50%: 4 faults mark through P2 alone; deleting P2
    lifts its taint and leaves P1's label; the label goes only once P1's domain recovers too."""
    a = clique(fleet, "a", 8)
    first, second = fleet.label, f"{fleet.label}-b"
    fleet.policy(first, spec())
    fleet.policy(second, spec("50%", "Taint"))
    judged(fleet, a, "healthy")

    fault(fleet, a[:4])
    waiting.wait_until(lambda: len(tainted(fleet, a)) == 8, timeout_seconds=TIMEOUT, message="P2 taints")
    assert len(marked(fleet, a)) == 8
    assert unschedulable(fleet, a[4:]) == []
    assert policy_events(fleet, first, "DomainDegraded") == []

    fault(fleet, [a[4]])
    waiting.wait_until(
        lambda: policy_events(fleet, first, "DomainDegraded"), timeout_seconds=TIMEOUT, message="P1 too"
    )
    fleet.custom.delete_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, second
    )
    waiting.wait_until(lambda: not tainted(fleet, a), timeout_seconds=TIMEOUT, message="P2's taint lifted")
    waiting.holds(lambda: len(marked(fleet, a)) == 8, seconds=2, message="P1 still wants the label")

    heal(fleet, a)
    waiting.wait_until(lambda: not marked(fleet, a), timeout_seconds=TIMEOUT, message="marks lifted")
    waiting.wait_until(lambda: not unschedulable(fleet, a), timeout_seconds=TIMEOUT, message="uncordoned")


def test_status_lists_a_clique_at_its_budget(
    fleet: operator_harness.Fleet, crds: local.ControlPlane, operator: operator_harness.OperatorProcess
) -> None:
    """A clique budget of 1: two faults, one cordon; the clique is at its budget in the status, the
    `-o wide` column and the gauge, and no longer once the cordon is lifted."""
    a = clique(fleet, "a", 4)
    budgets = {"budgets": [{"key": CLIQUE, "maxUnavailable": 1}]}
    fleet.policy(fleet.label, {**spec(), "topology": budgets})
    judged(fleet, a, "healthy")
    fault(fleet, a[:2])
    waiting.wait_until(lambda: unschedulable(fleet, a), timeout_seconds=TIMEOUT, message="a cordon")

    def at_budget() -> list[dict[str, Any]]:
        body = fleet.custom.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
        )
        assert isinstance(body, dict)
        return list(((body.get("status") or {}).get("topology") or {}).get("atBudget") or [])

    full = waiting.wait_until(at_budget, timeout_seconds=TIMEOUT, message="status.topology.atBudget")
    assert full == [
        {"key": CLIQUE, "value": f"{fleet.label}-a", "unavailable": 1, "maxUnavailable": 1, "nodes": 4}
    ]
    wide = crds.kubectl("get", "ghp", fleet.label, "-o", "wide").stdout.splitlines()
    assert "ATBUDGET" in wide[0].split() and f"{fleet.label}-a" in wide[1].split(), wide
    series = f'key="{CLIQUE}",policy="{fleet.label}",value="{fleet.label}-a"'
    metric = f"gpuhealth_operator_topology_domain_at_budget{{{series}}} 1.0"
    waiting.wait_until(lambda: metric in operator.metrics(), timeout_seconds=TIMEOUT, message="the gauge")
    assert len(unschedulable(fleet, a)) == 1
    heal(fleet, a)
    waiting.wait_until(lambda: not at_budget(), timeout_seconds=3 * TIMEOUT, message="budget free again")
    waiting.wait_until(lambda: metric not in operator.metrics(), timeout_seconds=TIMEOUT, message="no series")


def test_a_node_relabelled_into_another_clique_loses_the_mark(fleet: operator_harness.Fleet) -> None:
    a = clique(fleet, "a", 6)
    b = clique(fleet, "b", 2)
    fleet.policy(fleet.label, spec(unhealthy=2))
    judged(fleet, [*a, *b], "healthy")
    fault(fleet, a[:3])
    waiting.wait_until(lambda: len(marked(fleet, a)) == 6, timeout_seconds=TIMEOUT, message="a marked")
    fleet.core.patch_node(a[5], {"metadata": {"labels": {CLIQUE: f"{fleet.label}-b"}}})
    waiting.wait_until(lambda: not marked(fleet, [a[5]]), timeout_seconds=TIMEOUT, message="moved: unmarked")
    waiting.holds(lambda: len(marked(fleet, a[:5])) == 5 and not marked(fleet, b), seconds=2, message="rest")


def test_a_human_removing_the_label_gets_it_back(fleet: operator_harness.Fleet) -> None:
    a = clique(fleet, "a", 3)
    fleet.policy(fleet.label, spec(unhealthy=1))
    judged(fleet, a, "healthy")
    fault(fleet, a[:1])
    waiting.wait_until(lambda: len(marked(fleet, a)) == 3, timeout_seconds=TIMEOUT, message="a marked")
    fleet.core.patch_node(a[2], {"metadata": {"labels": {DEGRADED: None}}})
    waiting.wait_until(lambda: len(marked(fleet, a)) == 3, timeout_seconds=TIMEOUT, message="marked again")


def test_dry_run_writes_nothing_and_says_so(fleet: operator_harness.Fleet) -> None:
    a = clique(fleet, "a", 8)
    fleet.policy(fleet.label, spec(dryRun=True))
    waiting.wait_until(
        lambda: fleet.gpunode(a[0]).get("status", {}).get("health"), timeout_seconds=TIMEOUT, message="judged"
    )
    fault(fleet, a[:5])
    said = waiting.wait_until(
        lambda: policy_events(fleet, fleet.label, "DryRun"), timeout_seconds=TIMEOUT, message="DryRun Event"
    )
    assert f"domain {CLIQUE}={fleet.label}-a" in said[0]["message"], said
    waiting.wait_until(
        lambda: [s["value"] for s in degraded_status(fleet, fleet.label)] == [f"{fleet.label}-a"],
        timeout_seconds=TIMEOUT,
        message="a dry-run policy's status lists the domain",
    )
    waiting.holds(lambda: not marked(fleet, a) and not unschedulable(fleet, a), seconds=2, message="no write")
    assert policy_events(fleet, fleet.label, "DomainDegraded") == []
