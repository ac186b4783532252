"""Rules on other tools' Node conditions (`nodeCondition: {type, status}`, issue 27 item 6)."""

import datetime
import re
from typing import Any

import pytest

import gpunode_facts
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import breaker, hysteresis, model, policies, severity, verdicts
from gpuhealth_operator.state import cache

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
DEADLOCK = vocabulary.node_condition("KernelDeadlock")


def policy(*rules: dict[str, Any]) -> model.Policy:
    return policies.parse_policy("p", 1, {"rules": list(rules)})


def node(**conditions: str) -> model.NodeView:
    return model.NodeView(name="n", labels={keys.GPU_COUNT_LABEL: "8"}, gpu_capacity=8, conditions=conditions)


def judge(p: model.Policy, view: model.NodeView, previous: Any = None, at: datetime.datetime = NOW) -> Any:
    return verdicts.judge(
        p, view, gpunode_facts.agent_status(heartbeat=gpunode_facts.rfc3339(at)), previous or {}, None, at
    )


def test_a_rule_names_a_node_condition_by_type_and_status() -> None:
    p = policy({"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Drain"})
    assert p.rules[0].condition == "Node:KernelDeadlock" == DEADLOCK
    ready = {"type": "Ready", "status": "False", "allowKubeletCondition": True}  # kubelet's: opted in
    p = policy({"name": "nr", "nodeCondition": ready, "action": "Taint"})
    assert p.rules[0].condition == "Node:Ready=False"
    assert p.rules[0].condition.node_type == "Ready"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"condition": "EccUncorrectable", "nodeCondition": {"type": "KernelDeadlock"}}, "exactly one of"),
        ({}, "spec.rules[0].condition"),
        ({"nodeCondition": {"type": "bad type!"}}, "spec.rules[0].nodeCondition.type"),
        ({"nodeCondition": {"type": "GPUHealthy"}}, "gpu-health's own"),
        ({"nodeCondition": {"type": "KernelDeadlock", "status": "Yes"}}, "nodeCondition.status"),
    ],
)
def test_a_bad_node_condition_rule_names_the_field(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        policy({"name": "r", "action": "Label", **rule})


def test_isolate_gpu_needs_a_gpu_fault() -> None:
    with pytest.raises(ValueError, match="IsolateGPU"):
        policy({"name": "r", "nodeCondition": {"type": "KernelDeadlock"}, "action": "IsolateGPU"})


def test_the_node_condition_fires_its_rule_and_is_reported_like_ours() -> None:
    p = policy({"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Taint"})
    verdict = judge(p, node(KernelDeadlock="True", Ready="True"))
    assert verdict.issues == (DEADLOCK,)
    assert [r.name for r in verdict.fired_rules] == ["kd"]
    assert verdict.health is vocabulary.Health.DEGRADED
    assert verdict.wanted_taint == "Node.KernelDeadlock"  # a taint value holds no ':'
    state = verdict.conditions[DEADLOCK]
    assert state.message == "the Node's KernelDeadlock condition is True"
    # Kept in GPUNode status.conditions and read back, hysteresis and all.
    assert hysteresis.from_status(hysteresis.to_status(verdict.conditions.values(), 1))[DEADLOCK] == state


@pytest.mark.parametrize("conditions", [{}, {"KernelDeadlock": "False"}, {"KernelDeadlock": "Unknown"}])
def test_a_missing_or_other_status_is_no_fault(conditions: dict[str, str]) -> None:
    p = policy({"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Drain"})
    verdict = judge(p, node(**conditions))
    assert verdict.issues == () and verdict.fired_rules == () and verdict.health is vocabulary.Health.HEALTHY


def test_for_seconds_and_clearing() -> None:
    p = policy(
        {"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Cordon", "forSeconds": 60}
    )
    first = judge(p, node(KernelDeadlock="True"))
    assert first.fired_rules == ()
    later = judge(p, node(KernelDeadlock="True"), first.conditions, NOW + datetime.timedelta(seconds=61))
    assert [r.name for r in later.fired_rules] == ["kd"]
    gone = judge(p, node(KernelDeadlock="False"), later.conditions, NOW + datetime.timedelta(seconds=62))
    assert gone.issues == ()  # the other tool has its own hysteresis: clears at once


def test_a_gpu_fault_outranks_a_node_condition() -> None:
    assert severity.rank(DEADLOCK) > severity.rank(vocabulary.Condition.STRAGGLER)
    assert (
        severity.most_severe_first([DEADLOCK, vocabulary.Condition.THERMAL_THROTTLED])[0]
        == "ThermalThrottled"
    )


def test_the_cache_keeps_the_nodes_conditions_but_ours() -> None:
    body = {
        "metadata": {"name": "n", "uid": "u", "resourceVersion": "1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"},
                {"type": keys.NODE_CONDITION_TYPE, "status": "True"},
            ]
        },
    }
    record = cache.node_record(body)
    assert dict(record.view.conditions) == {"Ready": "True", "KernelDeadlock": "True"}


@pytest.mark.parametrize(("action", "counted"), [("Drain", True), ("Cordon", True), ("Taint", False)])
def test_a_disruptive_node_condition_rule_counts_for_the_breaker(action: str, counted: bool) -> None:
    """A bad rollout of another tool that marks every node must trip the breaker as a storm of ours does."""
    p = policy({"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": action})
    verdict = judge(p, node(KernelDeadlock="True"))
    assert (breaker.turned_unhealthy(verdict) == NOW) is counted
    assert breaker.turned_unhealthy(judge(p, node(KernelDeadlock="False"))) is None
