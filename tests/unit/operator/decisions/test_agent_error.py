"""An agent that reports its own error (status.agent.error) makes its node Unknown, never faulty.

The error of issue 24, item 16: a container runtime that hides the GPUs from the agent, on every
node at once. Before, the empty GPU list on a node labelled with 8 GPUs was GPULost, and the
whole fleet was drained for a configuration error.
"""

import datetime
from typing import Any

from gpuhealth_api import conditions, keys, vocabulary
from gpuhealth_operator.decisions import model, overrides, policies, signals, times, verdicts

Condition = vocabulary.Condition
Health = vocabulary.Health
Action = vocabulary.Action
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(name="gpu-node-3", labels={"gpu": "yes", keys.GPU_COUNT_LABEL: "8"})
POLICY = policies.parse_policy(
    "default",
    1,
    {
        "nodeSelector": {"matchLabels": {"gpu": "yes"}},
        "rules": [
            {"name": "lost", "condition": "GPULost", "action": "Drain"},
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
        ],
        "recovery": {"healthyForSeconds": 0, "uncordon": True},
    },
)
ERROR = {
    "reason": "NoGPUsVisible",
    "message": "NVML lists no GPU since the agent started, but the node has 8",
    "since": "2026-11-22T00:59:00Z",
}


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def facts(now: datetime.datetime, gpus: list[dict[str, Any]], **agent: Any) -> Any:
    info = {"lastHeartbeatTime": times.render(now), "heartbeatSeconds": 60, "maxGpuCountSeen": 8, **agent}
    return {"agent": info, "gpus": gpus}


def healthy(count: int = 8, **fields: Any) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": f"GPU-{i}", **fields} for i in range(count)]


def test_an_agent_that_sees_no_gpu_makes_its_node_unknown_and_drains_nothing() -> None:
    verdict = verdicts.judge(POLICY, NODE, facts(at(0), [], error=ERROR), {}, None, at(0))
    assert verdict.health is Health.UNKNOWN
    assert verdict.conditions[Condition.AGENT_ERROR].status == "True"
    assert "NVML lists no GPU" in verdict.conditions[Condition.AGENT_ERROR].message
    assert verdict.conditions[Condition.GPU_LOST].status != "True"
    assert verdict.wanted_action is None
    assert keys.HEALTH_LABEL not in verdict.wanted_labels  # Unknown leaves the health label as it is
    assert Condition.AGENT_ERROR in verdict.issues


def test_a_faulty_node_whose_agent_turns_blind_stays_as_it_was() -> None:
    faulty = facts(at(0), healthy())
    faulty["gpus"][2]["ecc"] = {"uncorrectedVolatile": 3}
    first = verdicts.judge(POLICY, NODE, faulty, {}, None, at(0))
    assert first.health is Health.UNHEALTHY
    blind = verdicts.judge(POLICY, NODE, facts(at(30), [], error=ERROR), first.conditions, None, at(30))
    assert blind.health is Health.UNKNOWN
    assert blind.conditions[Condition.ECC_UNCORRECTABLE].status == "True"  # held, neither cleared nor new
    assert not blind.recovered
    assert blind.wanted_action is None


def test_the_error_cleared_the_node_is_judged_again() -> None:
    first = verdicts.judge(POLICY, NODE, facts(at(0), [], error=ERROR), {}, None, at(0))
    again = verdicts.judge(POLICY, NODE, facts(at(30), healthy()), first.conditions, None, at(30))
    assert again.health is Health.HEALTHY
    assert again.conditions[Condition.AGENT_ERROR].status == "False"


def test_a_stale_agents_old_error_is_unknown_not_news() -> None:
    found = signals.raw_signals(
        facts(at(0), [], error=ERROR), NODE, frozenset(), at(0), report_age_seconds=1000
    )
    assert found[Condition.AGENT_STALE].present is True
    assert found[Condition.AGENT_ERROR].present is None


def test_an_agent_error_is_no_new_evidence_after_a_human_override() -> None:
    verdict = verdicts.judge(POLICY, NODE, facts(at(0), [], error=ERROR), {}, None, at(0))
    evidence = overrides.gather(verdict, facts(at(0), [], error=ERROR), frozenset())
    assert Condition.AGENT_ERROR.value not in evidence.episodes


def test_no_policy_rule_names_agent_error() -> None:
    assert Condition.AGENT_ERROR not in conditions.RULE_CONDITIONS
