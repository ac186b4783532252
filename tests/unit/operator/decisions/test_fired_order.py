"""A verdict's fired rules, wanted action, taint, detection time and budget rank are what ranking each fired
rule on its own gives: the strongest node action first (IsolateGPU as its fallback, Drain), then the most
severe condition, then the name; the taint the most severe Taint rule's condition. `verdicts.judge` ranks a
policy's rules once per policy object (`_Plan`), so this holds it to the rule-by-rule ranking, on random
policies and faults."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import hysteresis, isolation, model, policies, severity, times, verdicts

Action = vocabulary.Action
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(
    name="n", labels={}, conditions={"KernelDeadlock": "True", "FrequentDockerRestart": "True"}
)
CONDITIONS = ("EccUncorrectable", "RowRemapFailure", "ThermalThrottled", "PowerThrottled", "GPULost")
NODE_CONDITIONS = ("KernelDeadlock", "FrequentDockerRestart", "ReadonlyFilesystem")
"""Other tools' Node conditions a rule may name: the first two the Node holds."""
FAULTS: dict[str, dict[str, Any]] = {
    "ecc": {"ecc": {"uncorrectedVolatile": 1}},
    "rows": {"remappedRows": {"failure": True}},
    "hot": {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]},
}
ONE_GPU = ("EccUncorrectable", "RowRemapFailure", "GPULost")
"""The conditions of these an IsolateGPU rule may name (a fault of one GPU)."""
RULES = st.lists(
    st.tuples(
        st.sampled_from(CONDITIONS + NODE_CONDITIONS), st.sampled_from([a.value for a in Action])
    ).filter(lambda rule: rule[1] != Action.ISOLATE_GPU.value or rule[0] in ONE_GPU),
    min_size=1,
    max_size=6,
)


def facts(gpu: dict[str, Any]) -> Any:
    return {
        "agent": {"lastHeartbeatTime": times.render(T0), "heartbeatSeconds": 60},
        "gpus": [{"index": 0, "uuid": "GPU-a", "observedTime": times.render(T0), **gpu}],
    }


def ranked_one_by_one(fired: list[model.Rule]) -> list[model.Rule]:
    """The ranking `judge` made before `_Plan`: a sort of the fired rules, a call per rule."""
    return sorted(
        fired,
        key=lambda r: (
            -vocabulary.ACTION_ORDER[isolation.node_action(r.action)],
            severity.rank(r.condition),
            r.name,
        ),
    )


@settings(max_examples=300, deadline=None)
@given(RULES, st.sets(st.sampled_from(sorted(FAULTS))), st.booleans())
def test_fired_rules_rank_as_one_by_one(rules: list[tuple[str, str]], faults: set[str], stale: bool) -> None:
    spec = [
        {"name": f"r{i}", "action": a}
        | ({"nodeCondition": {"type": c}} if c in NODE_CONDITIONS else {"condition": c})
        for i, (c, a) in enumerate(rules)
    ]
    policy = policies.parse_policy("p", 1, {"rules": spec})
    gpu: dict[str, Any] = {}
    for fault in sorted(faults):
        gpu |= FAULTS[fault]
    verdict = verdicts.judge(
        policy, NODE, facts(gpu), {}, None, T0, report_age_seconds=3600.0 if stale else 0.0
    )
    states = verdict.conditions
    assert verdict.issues == severity.most_severe_first([c for c, s in states.items() if s.status == "True"])
    fired = [r for r in policy.rules if states[r.condition].status == hysteresis.TRUE]
    if verdict.health is vocabulary.Health.UNKNOWN:
        fired = [r for r in fired if isolation.node_action(r.action) not in vocabulary.DISRUPTIVE_ACTIONS]
    fired = ranked_one_by_one(fired)
    assert list(verdict.fired_rules) == fired
    wanted = isolation.node_action(fired[0].action) if fired else None
    assert verdict.wanted_action is wanted
    tainting = severity.most_severe_first([r.condition for r in fired if r.action is Action.TAINT])
    worst = tainting[0] if tainting else None
    label = worst.label_value if isinstance(worst, vocabulary.NodeCondition) else worst
    assert verdict.wanted_taint == (str(label) if label is not None else None)
    held = [
        states[r.condition].observed_since or states[r.condition].last_transition_time
        for r in fired
        if isolation.node_action(r.action) is wanted
    ]
    assert verdict.detected_at == min(held, default=None)
    assert severity.budget_rank(verdict) == severity.worst_rank(
        [r.condition for r in fired if isolation.node_action(r.action) in vocabulary.DISRUPTIVE_ACTIONS]
    )


def test_isolate_gpu_ranks_as_drain_and_disrupts() -> None:
    assert {
        a for a in Action if isolation.node_action(a) in vocabulary.DISRUPTIVE_ACTIONS
    } == isolation.DISRUPTING
    assert Action.ISOLATE_GPU in isolation.DISRUPTING
