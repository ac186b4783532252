"""The fleet circuit breaker against a real API server: a fault storm pauses new disruptions.

Safety rule 2's last sentence (DESIGN.md): when more selected GPU nodes turn
Unhealthy within `spec.breaker.windowSeconds` than `maxNewUnhealthy` allows,
the policy starts no new cordon or drain, says so (condition Paused, Event
RemediationPaused on the policy, metric gpuhealth_operator_breaker_open), and
resumes by itself after the window (half-open: one node, then all) or at once
when a human annotates the policy with gpuhealth.io/breaker-reset (a new value).
It half-opens only once the storm has ended: while `maxNewUnhealthy` of its
nodes are still Unhealthy and held back, only a human resumes it.

Every policy here sets maxUnavailable 100%, so only the breaker limits cordons.
"""

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

TIMEOUT = 30.0
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
CORDON = {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}


operator = operator_fixtures.operator_fixture("breaker-it")
fleet = operator_fixtures.fleet_fixture("br")


def make(fleet: operator_harness.Fleet, count: int, **breaker: Any) -> list[str]:
    """`count` healthy GPU nodes, judged, under a policy with this breaker and no budget limit."""
    names = [f"{fleet.label}-{i:02d}"[:63] for i in range(count)]
    for name in names:
        fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [CORDON],
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
            "breaker": breaker,
        },
    )
    for name in names:
        waiting.wait_until(
            lambda n=name: (fleet.node(n)["metadata"].get("labels") or {}).get(keys.HEALTH_LABEL),
            timeout_seconds=TIMEOUT,
            message=f"{name} judged",
        )
    return names


def cordoned(fleet: operator_harness.Fleet, names: list[str]) -> list[str]:
    return [n for n in names if fleet.node(n)["spec"].get("unschedulable")]


def status(fleet: operator_harness.Fleet) -> dict[str, Any]:
    policy = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    assert isinstance(policy, dict)
    return policy.get("status") or {}


def paused(fleet: operator_harness.Fleet) -> dict[str, Any]:
    """The policy's Paused condition ({} until written)."""
    conditions = status(fleet).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Paused"), {})


def policy_events(fleet: operator_harness.Fleet, reason: str) -> list[dict[str, Any]]:
    selector = (
        f"involvedObject.name={fleet.label},involvedObject.kind={resources.POLICY_KIND},reason={reason}"
    )
    response = fleet.core.list_event_for_all_namespaces(field_selector=selector)
    return [e.to_dict() for e in response.items]


def breaker_open(operator: operator_harness.OperatorProcess, policy: str) -> float | None:
    prefix = f'gpuhealth_operator_breaker_open{{policy="{policy}"}} '
    for line in operator.metrics().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_a_storm_of_30_percent_in_20_seconds_trips_it_and_disrupts_no_more_than_it_allows(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    """50 GPU nodes, the default 5% (2 nodes) in 10 minutes; 15 nodes turn Unhealthy over 20 s."""
    names = make(fleet, 50)
    storm = names[:15]
    waiting.wait_until(
        lambda: paused(fleet).get("status") == "False", timeout_seconds=TIMEOUT, message="Paused False"
    )
    assert breaker_open(operator, fleet.label) == 0
    started = time.monotonic()
    for i, name in enumerate(storm):
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
        time.sleep(max(0.0, started + 20 * (i + 1) / len(storm) - time.monotonic()))  # pacing, not sync
        assert len(cordoned(fleet, names)) <= 2
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="Paused"
    )
    condition = paused(fleet)
    assert condition["status"] == "True"
    assert "turned Unhealthy in the last 10 min, more than maxNewUnhealthy=2" in condition["message"]
    waiting.wait_until(
        lambda: policy_events(fleet, "RemediationPaused"), timeout_seconds=TIMEOUT, message="the Event"
    )
    (event,) = policy_events(fleet, "RemediationPaused")
    assert event["type"] == "Warning"
    assert keys.BREAKER_RESET_ANNOTATION in event["message"]
    waiting.wait_until(
        lambda: breaker_open(operator, fleet.label) == 1, timeout_seconds=TIMEOUT, message="metric"
    )
    # Every storm node has been judged and asks for a cordon; the breaker holds them back.
    for name in storm:
        waiting.wait_until(
            lambda n=name: fleet.gpunode(n).get("status", {}).get("action") in ("Pending", "Cordoned"),
            timeout_seconds=TIMEOUT,
            message=f"{name} acted on or waiting",
        )
    waiting.holds(lambda: len(cordoned(fleet, names)) <= 2, seconds=3, message="no more than 2 cordoned")
    assert set(cordoned(fleet, names)) <= set(storm)
    waiting_names = [n for n in storm if n not in cordoned(fleet, names)]
    assert len(waiting_names) >= 13
    told = fleet.events(waiting_names[-1], "DisruptionBudgetExceeded")
    assert told and "fleet circuit breaker is Open" in told[0]["message"]


def test_a_single_fault_in_a_calm_period_is_acted_on_at_full_speed(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    names = make(fleet, 10)
    fleet.report(names[0], gpunode_facts.agent_status(overrides=ECC))
    started = time.monotonic()
    waiting.wait_until(lambda: cordoned(fleet, names), timeout_seconds=TIMEOUT, message="cordoned")
    took = time.monotonic() - started
    assert took < 3.0, f"a calm fault took {took:.1f} s to cordon"
    assert cordoned(fleet, names) == [names[0]]
    # The policy's status is written on the operator's next tick, which may land after the cordon.
    waiting.wait_until(
        lambda: paused(fleet).get("status") == "False",
        timeout_seconds=TIMEOUT,
        message="PolicyPaused=False reported",
    )
    assert not policy_events(fleet, "RemediationPaused")


def test_after_the_window_it_half_opens_admits_one_node_then_resumes(
    fleet: operator_harness.Fleet,
) -> None:
    """A 6 s window over 10 nodes (limit 3): 7 faults at once trip it; the storm ends (2 of the 4 nodes
    it holds back recover, fewer than the limit are left); it lets one through, then the other."""
    names = make(fleet, 10, maxNewUnhealthy=3, windowSeconds=6)
    storm = names[:7]
    for name in storm:
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="trip"
    )
    # A cordon admitted just before the trip may still be landing: settle before counting.
    waiting.holds(
        lambda: len(cordoned(fleet, names)) <= 3, seconds=1.5, message="at most three before the trip"
    )
    tripped_with = len(cordoned(fleet, names))
    held = [n for n in storm if n not in cordoned(fleet, names)]
    for name in held[: len(held) - 2]:
        fleet.report(name, gpunode_facts.agent_status())  # recovered: the storm has ended
    seen: list[tuple[float, str, int]] = []

    def resumed() -> bool:
        seen.append((time.monotonic(), paused(fleet).get("reason", ""), len(cordoned(fleet, names))))
        return seen[-1][1:] == ("BreakerClosed", tripped_with + 2)

    waiting.wait_until(resumed, timeout_seconds=TIMEOUT + 12, interval_seconds=0.2, message="resumed")
    assert any(reason == "HalfOpen" for _, reason, _ in seen), f"never seen half-open: {seen}"
    # The status is written a timer pass after each transition, so judge by the cordons themselves:
    # exactly one more node, alone for the probe (6 s), then the last one.
    counts = [count for _, _, count in seen]
    assert sorted(set(counts)) == sorted({tripped_with, tripped_with + 1, tripped_with + 2}), seen
    trial = [at for at, _, count in seen if count == tripped_with + 1]
    assert trial[-1] - trial[0] >= 3.0, f"the trial node was not alone for the probe: {seen}"
    assert "resumed" in paused(fleet)["message"]


def test_a_storm_that_has_not_ended_stays_open_across_windows_and_a_restart_until_a_human_resumes(
    fleet: operator_harness.Fleet,
    operator: operator_harness.OperatorProcess,
    crds: local.ControlPlane,
) -> None:
    """Issue 24: the storm's nodes stay Unhealthy (a bad rollout), so a window later none of them is new;
    the breaker must not half-open and let them all through. It holds through a restart too."""
    names = make(fleet, 8, windowSeconds=6)
    storm = names[:4]
    for name in storm:
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="trip"
    )
    waiting.holds(lambda: len(cordoned(fleet, names)) <= 1, seconds=1.5, message="at most one")
    before = cordoned(fleet, names)
    waiting.holds(  # two windows and more
        lambda: cordoned(fleet, names) == before and paused(fleet).get("reason") == "FaultStorm",
        seconds=14,
        message="held open while the storm goes on",
    )
    assert "has not ended" in paused(fleet)["message"]
    operator.stop()
    operator.start()
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the new process leads")
    waiting.wait_until(
        lambda: breaker_open(operator, fleet.label) == 1, timeout_seconds=TIMEOUT, message="open again"
    )
    waiting.holds(lambda: cordoned(fleet, names) == before, seconds=8, message="nothing new after a restart")
    assert paused(fleet)["reason"] == "FaultStorm"
    crds.kubectl(
        "annotate", resources.POLICY_SHORT, fleet.label, f"{keys.BREAKER_RESET_ANNOTATION}=oncall-ack"
    )
    waiting.wait_until(
        lambda: len(cordoned(fleet, names)) == len(storm), timeout_seconds=TIMEOUT, message="all cordoned"
    )
    assert paused(fleet)["status"] == "False"


def test_a_manual_reset_resumes_at_once_and_is_recorded(
    fleet: operator_harness.Fleet, crds: local.ControlPlane
) -> None:
    """`kubectl annotate` closes it; the value acted on is recorded in status, so it acts once per value."""
    names = make(fleet, 8)
    storm = names[:3]
    for name in storm:
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="trip"
    )
    waiting.holds(lambda: len(cordoned(fleet, names)) <= 1, seconds=2, message="paused")
    crds.kubectl(
        "annotate", resources.POLICY_SHORT, fleet.label, f"{keys.BREAKER_RESET_ANNOTATION}=oncall-ack"
    )
    waiting.wait_until(
        lambda: len(cordoned(fleet, names)) == len(storm), timeout_seconds=TIMEOUT, message="all cordoned"
    )
    waiting.wait_until(
        lambda: paused(fleet).get("status") == "False", timeout_seconds=TIMEOUT, message="Paused False"
    )
    assert f"{keys.BREAKER_RESET_ANNOTATION}=oncall-ack" in paused(fleet)["message"]
    waiting.wait_until(
        lambda: status(fleet).get("breakerReset", {}).get("value") == "oncall-ack",
        timeout_seconds=TIMEOUT,
        message="the reset recorded",
    )
    # A new storm trips it again although the annotation is still there: one reset per value.
    for name in names[3:6]:
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="trips again"
    )
    waiting.holds(lambda: len(cordoned(fleet, names)) <= len(storm) + 1, seconds=2, message="paused again")


def test_a_storm_that_began_before_a_restart_still_counts(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    """The breaker's memory is lost with the process; the new one rebuilds it from GPUNode conditions."""
    names = make(fleet, 6)
    storm = names[:3]
    for name in storm:
        fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
    waiting.wait_until(
        lambda: paused(fleet).get("reason") == "FaultStorm", timeout_seconds=TIMEOUT, message="trip"
    )
    before = cordoned(fleet, names)
    assert len(before) <= 1
    operator.stop()
    operator.start()
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the new process leads")
    waiting.wait_until(
        lambda: breaker_open(operator, fleet.label) == 1, timeout_seconds=TIMEOUT, message="open again"
    )
    waiting.holds(lambda: cordoned(fleet, names) == before, seconds=3, message="nothing new cordoned")
    assert paused(fleet)["reason"] == "FaultStorm"
