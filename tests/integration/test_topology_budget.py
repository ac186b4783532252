"""Topology budgets against a real API server: at most maxUnavailable unschedulable nodes per domain.

Issue 28: `spec.topology.budgets` bounds the unschedulable selected GPU nodes of
each value of a label (a rack here), on top of the policy's own
`maxUnavailable`, whoever cordoned them, under the one admission lock over
every policy. Nodes a domain budget holds wait (`Pending`, Event
`DisruptionBudgetExceeded` naming the key and the domain). One operator
process serves the module; each test makes its own kwok Nodes with a label
unique to the test, so the rack values repeat harmlessly across tests.
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

TIMEOUT = 30.0
RACK = "gpuhealth.io/test-rack"
POOL = "gpuhealth.io/test-pool"
ECC = {"ecc": {"uncorrectedVolatile": 1}}
CORDON = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}
DRAIN = {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}
PAUSE = [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]


operator = operator_fixtures.operator_fixture("topology-it")
fleet = operator_fixtures.fleet_fixture("tb")


def spec(rack_budget: int | str = 1, **fields: Any) -> dict[str, Any]:
    return {
        "rules": [CORDON],
        "maxUnavailable": 10,
        "recovery": {"uncordon": True, "healthyForSeconds": 1},
        "topology": {"budgets": [{"key": RACK, "maxUnavailable": rack_budget}]},
        **fields,
    }


def racked(fleet: operator_harness.Fleet, layout: dict[str, int], **labels: str) -> dict[str, list[str]]:
    """Nodes per rack: `{"r1": 3}` adds 3 nodes labelled rack=r1; the names per rack."""
    result: dict[str, list[str]] = {}
    for rack, count in layout.items():
        for i in range(count):
            name = f"{fleet.label}-{rack}-{i}"[:63]
            fleet.add_node(name, labels={RACK: rack, **labels})
            result.setdefault(rack, []).append(name)
    return result


def unschedulable(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if fleet.node(n)["spec"].get("unschedulable")]


def action(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name).get("status") or {}).get("action")


def waits_naming(fleet: operator_harness.Fleet, name: str, *words: str) -> None:
    """The node waits (Pending) and a DisruptionBudgetExceeded Event about it names all `words`."""

    def told() -> bool:
        messages = fleet.messages(name, "DisruptionBudgetExceeded")
        return action(fleet, name) == "Pending" and any(all(w in m for w in words) for m in messages)

    waiting.wait_until(told, timeout_seconds=TIMEOUT, message=f"{name} Pending, Event naming {words}")


def judged(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        waiting.wait_until(
            lambda n=name: (fleet.node(n)["metadata"].get("labels") or {}).get(keys.HEALTH_LABEL),
            timeout_seconds=TIMEOUT,
            message=f"{name} judged",
        )


def fault(fleet: operator_harness.Fleet, names: list[str]) -> None:
    for name in names:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))


def heal(fleet: operator_harness.Fleet, name: str) -> None:
    fleet.report(name, gpunode_facts.agent_status())


def at_most_per_rack(fleet: operator_harness.Fleet, racks: dict[str, list[str]], limit: int) -> bool:
    return all(len(unschedulable(fleet, names)) <= limit for names in racks.values())


def test_a_rack_budget_cordons_one_node_per_rack_and_the_next_as_one_recovers(
    fleet: operator_harness.Fleet,
) -> None:
    """Rack budget 1, maxUnavailable 10: 3 faulty nodes in r1 and 1 in r2 → one cordon per rack; the
    other two of r1 wait naming the rack; as r1's cordoned node recovers and is uncordoned, the next
    one of r1 is cordoned, and never two of a rack at once."""
    racks = racked(fleet, {"r1": 4, "r2": 2})
    fleet.policy(fleet.label, spec())
    judged(fleet, [n for names in racks.values() for n in names])
    r1_faulty, r2_faulty = racks["r1"][:3], racks["r2"][:1]
    fault(fleet, [*r1_faulty, *r2_faulty])
    waiting.wait_until(
        lambda: unschedulable(fleet, r2_faulty) == r2_faulty, timeout_seconds=TIMEOUT, message="r2 cordon"
    )
    waiting.wait_until(
        lambda: len(unschedulable(fleet, r1_faulty)) == 1, timeout_seconds=TIMEOUT, message="one r1 cordon"
    )
    (first,) = unschedulable(fleet, r1_faulty)
    waiting_ = [n for n in r1_faulty if n != first]
    for name in waiting_:
        waits_naming(fleet, name, f"{RACK}=r1", "topology budget", first)
    waiting.holds(lambda: at_most_per_rack(fleet, racks, 1), seconds=2, message="one node per rack")

    heal(fleet, first)
    waiting.wait_until(
        lambda: not unschedulable(fleet, [first]), timeout_seconds=TIMEOUT, message=f"{first} uncordoned"
    )
    waiting.wait_until(
        lambda: len(unschedulable(fleet, waiting_)) == 1, timeout_seconds=TIMEOUT, message="next r1 cordon"
    )
    waiting.holds(lambda: at_most_per_rack(fleet, racks, 1), seconds=2, message="one node per rack")
    assert sorted(action(fleet, n) for n in waiting_) == ["Cordoned", "Pending"]


def test_overlapping_policies_with_budgets_on_the_same_key_each_hold(fleet: operator_harness.Fleet) -> None:
    """Policy A (every node, rack budget 2) and policy B (pool b only, rack budget 1) over one rack of
    4 faulty nodes, 2 of pool b: 2 cordons, never both pool-b nodes; the pool-b node B holds back
    keeps no place in A's queue, so A's second place goes to a node of the other pool."""
    pool_b = racked(fleet, {"r1": 2}, **{POOL: "b"})["r1"]
    rest = [f"{fleet.label}-r1-a{i}"[:63] for i in range(2)]
    for name in rest:
        fleet.add_node(name, labels={RACK: "r1", POOL: "a"})
    everyone = [*pool_b, *rest]
    fleet.policy(fleet.label, spec(rack_budget=2))
    selector = {"matchLabels": {fleet.LABEL_KEY: fleet.label, POOL: "b"}}
    fleet.policy(f"{fleet.label}-b", spec(rack_budget=1, nodeSelector=selector))
    judged(fleet, everyone)
    fault(fleet, everyone)
    waiting.wait_until(
        lambda: len(unschedulable(fleet, everyone)) == 2, timeout_seconds=TIMEOUT, message="two cordons"
    )
    waiting.holds(
        lambda: len(unschedulable(fleet, everyone)) <= 2 and len(unschedulable(fleet, pool_b)) <= 1,
        seconds=3,
        message="rack budget 2 of A, rack budget 1 of B over pool b",
    )
    assert len(unschedulable(fleet, pool_b)) == 1
    assert len(unschedulable(fleet, rest)) == 1
    (held_b,) = [n for n in pool_b if n not in unschedulable(fleet, pool_b)]
    waits_naming(fleet, held_b, f"topology budget {RACK}=r1")


def test_a_human_cordon_in_the_rack_uses_its_budget(fleet: operator_harness.Fleet) -> None:
    """A node a human cordoned in r1 holds r1's budget: r1's faulty node waits naming it, r2's is
    cordoned; when the human uncordons, r1's faulty node is cordoned."""
    racks = racked(fleet, {"r1": 2, "r2": 2})
    human, faulty = racks["r1"]
    fleet.core.patch_node(human, {"spec": {"unschedulable": True}})
    fleet.policy(fleet.label, spec())
    judged(fleet, [*racks["r1"], *racks["r2"]])
    fault(fleet, [faulty, racks["r2"][0]])
    waiting.wait_until(
        lambda: unschedulable(fleet, [racks["r2"][0]]), timeout_seconds=TIMEOUT, message="r2 cordon"
    )
    waits_naming(fleet, faulty, f"{RACK}=r1", f"{human} (cordoned outside gpu-health)")
    waiting.holds(lambda: not unschedulable(fleet, [faulty]), seconds=2, message="r1 held by the human")
    fleet.core.patch_node(human, {"spec": {"unschedulable": False}})
    waiting.wait_until(
        lambda: unschedulable(fleet, [faulty]), timeout_seconds=TIMEOUT, message=f"{faulty} cordoned"
    )


def test_a_node_relabelled_into_another_rack_mid_drain(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    """n0 of r1 drains (a PodDisruptionBudget holds its pod), n1 of r1 waits. n0 is relabelled into r2
    mid-drain: r1 has room, so n1 is cordoned; n0 keeps its cordon and drain, now in r2's budget, so
    r2's faulty node waits naming n0."""
    racks = racked(fleet, {"r1": 2, "r2": 2})
    n0, n1 = racks["r1"]
    n2 = racks["r2"][0]
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "guarded", "namespace": namespace, "labels": {"guard": "yes"}},
            "spec": {"nodeName": n0, "containers": PAUSE, "terminationGracePeriodSeconds": 0},
        },
    )
    client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "guard", "namespace": namespace},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"guard": "yes"}}},
        },
    )
    fleet.policy(fleet.label, spec(rules=[DRAIN], drain={"timeoutSeconds": 600, "force": True}))
    judged(fleet, [*racks["r1"], *racks["r2"]])
    fault(fleet, [n0])
    waiting.wait_until(lambda: action(fleet, n0) == "Draining", timeout_seconds=TIMEOUT, message="n0 drains")
    fault(fleet, [n1])
    waits_naming(fleet, n1, f"{RACK}=r1", n0)

    fleet.core.patch_node(n0, {"metadata": {"labels": {RACK: "r2"}}})
    waiting.wait_until(lambda: unschedulable(fleet, [n1]), timeout_seconds=TIMEOUT, message="n1 cordoned")
    assert action(fleet, n0) == "Draining"
    assert unschedulable(fleet, [n0]) == [n0]
    fault(fleet, [n2])
    waits_naming(fleet, n2, f"{RACK}=r2", n0)
    waiting.holds(
        lambda: not unschedulable(fleet, [n2]) and unschedulable(fleet, [n0]) == [n0],
        seconds=2,
        message="r2 held by the relabelled node, whose drain goes on",
    )
