"""Verdicts: health, fired rules, wanted action/labels/taint, recovery and who may uncordon."""

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import hysteresis, model, policies, severity, times, verdicts

Condition = vocabulary.Condition
Action = vocabulary.Action
Health = vocabulary.Health
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(name="gpu-node-3", labels={"gpu": "yes"})


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def policy(*rules: dict[str, Any], healthy_for: int = 600, **spec: Any) -> model.Policy:
    return policies.parse_policy(
        "default",
        2,
        {
            "nodeSelector": {"matchLabels": {"gpu": "yes"}},
            "rules": list(rules),
            "recovery": {"healthyForSeconds": healthy_for, "uncordon": True},
            **spec,
        },
    )


DEFAULT = policy(
    {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
    {"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": [79]},
    {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
    {"name": "straggler", "condition": "Straggler", "action": "Label", "forSeconds": 300, "threshold": 3.5},
)


def facts(now: datetime.datetime, *, heartbeat: datetime.datetime | None = None, **gpu: Any) -> Any:
    return {
        "agent": {"lastHeartbeatTime": times.render(heartbeat or now), "heartbeatSeconds": 60},
        "gpus": [{"index": 0, "uuid": "GPU-a", "observedTime": times.render(now), **gpu}],
    }


def judge_run(
    pol: model.Policy,
    samples: Sequence[tuple[float, Mapping[str, Any]]],
    straggler: model.StragglerScore | None = None,
    node: model.NodeView = NODE,
) -> model.NodeVerdict:
    """Judge (time, gpu fields) samples in turn, keeping conditions in status between them.

    The operator's clock is emulated: a sample's report counts as seen at its time when its
    `heartbeat` differs from the previous one; `report_age` overrides the age outright.
    """
    stored: list[model.ConditionRecord] = []
    verdict = None
    last: tuple[str, datetime.datetime] | None = None
    for t, gpu in samples:
        fields = dict(gpu)
        heartbeat = fields.pop("heartbeat", None)
        age = fields.pop("report_age", None)
        reported = facts(at(t), heartbeat=heartbeat, **fields)
        stamp = reported["agent"]["lastHeartbeatTime"]
        if last is None or last[0] != stamp:
            last = (stamp, at(t))
        verdict = verdicts.judge(
            pol,
            node,
            reported,
            hysteresis.from_status(stored),
            straggler,
            at(t),
            report_age_seconds=(at(t) - last[1]).total_seconds() if age is None else age,
        )
        stored = hysteresis.to_status(verdict.conditions.values(), pol.generation)
    assert verdict is not None
    return verdict


ECC = {"ecc": {"uncorrectedVolatile": 1}}
HOT = {"clockEventReasons": ["HwThermalSlowdown"]}


def test_ecc_wants_drain_and_is_unhealthy() -> None:
    verdict = judge_run(DEFAULT, [(0, ECC)])
    assert verdict.health is Health.UNHEALTHY
    assert verdict.issues == (Condition.ECC_UNCORRECTABLE,)
    assert verdict.wanted_action is Action.DRAIN
    assert [r.name for r in verdict.fired_rules] == ["ecc"]
    assert verdict.wanted_labels == {
        keys.HEALTH_LABEL: "unhealthy",
        keys.STRAGGLER_LABEL: None,
        keys.THERMAL_LABEL: None,
    }
    assert verdict.wanted_taint is None
    assert verdict.detected_at == at(0)
    assert not verdict.recovered
    assert severity.budget_rank(verdict) == severity.rank(Condition.ECC_UNCORRECTABLE)


def test_healthy_node() -> None:
    verdict = judge_run(DEFAULT, [(0, {})])
    assert verdict.health is Health.HEALTHY
    assert verdict.issues == ()
    assert verdict.wanted_action is None
    assert verdict.detected_at is None
    assert verdict.wanted_labels[keys.HEALTH_LABEL] == "healthy"
    assert severity.budget_rank(verdict) == severity.LOWEST


def test_fatal_conditions_are_judged_without_rules() -> None:
    verdict = judge_run(policy(), [(0, {"lost": True})])
    assert set(verdict.conditions) == severity.FATAL | verdicts.BLIND
    assert verdict.health is Health.UNHEALTHY
    assert verdict.issues == (Condition.GPU_LOST,)
    assert verdict.wanted_action is None


def test_conditions_cover_fatal_plus_rule_conditions() -> None:
    verdict = judge_run(DEFAULT, [(0, {})])
    assert set(verdict.conditions) == severity.FATAL | {
        Condition.AGENT_STALE,
        Condition.AGENT_ERROR,
        Condition.GPU_OPERATOR_MAINTENANCE,
        Condition.THERMAL_THROTTLED,
        Condition.STRAGGLER,
    }


@pytest.mark.parametrize(
    ("gpu", "health", "issues"),
    [
        ({"clockEventReasons": ["HwPowerBrakeSlowdown"]}, Health.DEGRADED, (Condition.POWER_THROTTLED,)),
        (
            {"utilizationPercent": 90, "pcie": {"generation": 3, "maxGeneration": 5}},
            Health.DEGRADED,
            (Condition.PCIE_DEGRADED,),
        ),
        (
            {**ECC, "lost": True, "clockEventReasons": ["HwPowerBrakeSlowdown"]},
            Health.UNHEALTHY,
            (Condition.GPU_LOST, Condition.ECC_UNCORRECTABLE, Condition.POWER_THROTTLED),
        ),
        ({"recoveryAction": "NodeReboot"}, Health.UNHEALTHY, (Condition.RECOVERY_REQUIRED,)),
        ({"remappedRows": {"pending": True}}, Health.UNHEALTHY, (Condition.ROW_REMAP_FAILURE,)),
    ],
)
def test_health_and_issue_order(gpu: dict[str, Any], health: Health, issues: tuple[Condition, ...]) -> None:
    pol = policy(
        {"name": "power", "condition": "PowerThrottled", "action": "Event"},
        {"name": "pcie", "condition": "PcieDegraded", "action": "Event"},
    )
    verdict = judge_run(pol, [(0, gpu)])
    assert verdict.health is health
    assert verdict.issues == issues


def test_thermal_label_only_after_for_seconds() -> None:
    early = judge_run(DEFAULT, [(0, HOT), (59, HOT)])
    assert early.wanted_labels[keys.THERMAL_LABEL] is None
    assert early.health is Health.HEALTHY  # not a condition until it held for forSeconds
    late = judge_run(DEFAULT, [(0, HOT), (59, HOT), (60, HOT)])
    assert late.wanted_labels[keys.THERMAL_LABEL] == "true"
    assert late.health is Health.DEGRADED
    assert late.wanted_action is Action.LABEL
    assert late.wanted_labels[keys.HEALTH_LABEL] == "degraded"


def test_event_rule_does_not_label() -> None:
    pol = policy({"name": "t", "condition": "ThermalThrottled", "action": "Event"})
    verdict = judge_run(pol, [(0, HOT)])
    assert verdict.wanted_action is Action.EVENT
    assert verdict.wanted_labels[keys.THERMAL_LABEL] is None


def test_stronger_rule_for_same_condition_fires_later() -> None:
    pol = policy(
        {"name": "label", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60},
        {"name": "drain", "condition": "ThermalThrottled", "action": "Drain", "forSeconds": 600},
    )
    assert judge_run(pol, [(0, HOT), (60, HOT)]).wanted_action is Action.LABEL
    verdict = judge_run(pol, [(0, HOT), (60, HOT), (600, HOT)])
    assert verdict.wanted_action is Action.DRAIN
    assert [r.name for r in verdict.fired_rules] == ["drain", "label"]
    assert verdict.wanted_labels[keys.THERMAL_LABEL] == "true"
    assert verdict.detected_at == at(0)


@pytest.mark.parametrize(
    ("action", "taint"), [("Taint", "EccUncorrectable"), ("Cordon", None), ("Label", None)]
)
def test_taint_only_for_taint_rules(action: str, taint: str | None) -> None:
    pol = policy({"name": "ecc", "condition": "EccUncorrectable", "action": action})
    assert judge_run(pol, [(0, ECC)]).wanted_taint == taint


def test_stale_agent_is_unknown_and_wants_nothing_disruptive() -> None:
    # ECC seen, then the agent goes silent before the budget admitted the drain.
    verdict = judge_run(DEFAULT, [(0, ECC), (600, {**ECC, "heartbeat": at(0)})])
    assert verdict.health is Health.UNKNOWN
    assert Condition.AGENT_STALE in verdict.issues
    assert verdict.wanted_action is None
    assert all(r.action not in vocabulary.DISRUPTIVE_ACTIONS for r in verdict.fired_rules)
    assert keys.HEALTH_LABEL not in verdict.wanted_labels  # left as it is
    assert verdict.conditions[Condition.ECC_UNCORRECTABLE].status == "True"  # held, not cleared
    assert not verdict.recovered


def test_stale_agent_from_the_start_never_fires_a_drain() -> None:
    # (An hour since the operator saw its last report, whatever the report's own timestamp says.)
    verdict = judge_run(DEFAULT, [(0, {**ECC, "report_age": 3600})])
    assert verdict.health is Health.UNKNOWN
    assert verdict.wanted_action is None
    assert verdict.conditions[Condition.ECC_UNCORRECTABLE].status == "Unknown"


def test_stale_agent_keeps_labels_it_had() -> None:
    verdict = judge_run(DEFAULT, [(0, HOT), (60, HOT), (1000, {**HOT, "heartbeat": at(60)})])
    assert verdict.health is Health.UNKNOWN
    assert verdict.wanted_labels[keys.THERMAL_LABEL] == "true"
    assert verdict.wanted_action is Action.LABEL


def test_no_agent_at_all_is_unknown() -> None:
    verdict = verdicts.judge(DEFAULT, NODE, {}, {}, None, T0)
    assert verdict.health is Health.UNKNOWN
    assert verdict.wanted_action is None


FLAGGED = model.StragglerScore(score=0.7, z_score=-9.0, peers=7, flagged=True)
NORMAL = model.StragglerScore(score=1.0, z_score=0.0, peers=7, flagged=False)


def test_straggler_labelled_after_for_seconds() -> None:
    assert judge_run(DEFAULT, [(0, {}), (299, {})], FLAGGED).wanted_labels[keys.STRAGGLER_LABEL] is None
    verdict = judge_run(DEFAULT, [(0, {}), (300, {})], FLAGGED)
    assert verdict.wanted_labels[keys.STRAGGLER_LABEL] == "true"
    assert verdict.health is Health.DEGRADED
    assert "7 peers" in verdict.conditions[Condition.STRAGGLER].message


def test_idle_straggler_clears_after_healthy_for_seconds() -> None:
    samples: list[tuple[float, dict[str, Any]]] = [(0, {}), (300, {})]
    labelled = judge_run(DEFAULT, samples, FLAGGED)
    assert labelled.conditions[Condition.STRAGGLER].status == "True"
    stored = hysteresis.to_status(labelled.conditions.values(), 2)
    for t, expected in [(400, "true"), (999, "true"), (1000, None)]:
        idle = verdicts.judge(DEFAULT, NODE, facts(at(t)), hysteresis.from_status(stored), None, at(t))
        stored = hysteresis.to_status(idle.conditions.values(), 2)
        assert idle.wanted_labels[keys.STRAGGLER_LABEL] == expected, t
    assert judge_run(DEFAULT, [(0, {})], NORMAL).conditions[Condition.STRAGGLER].status == "False"


def test_recovered_only_after_healthy_for_seconds_and_survives_restart() -> None:
    base: list[tuple[float, dict[str, Any]]] = [
        (0, ECC),
        (100, {}),
    ]  # a GPU reset at 100 s clears the volatile count
    cleared = judge_run(DEFAULT, base)
    assert cleared.health is Health.HEALTHY
    assert cleared.conditions[Condition.ECC_UNCORRECTABLE].status == "False"
    assert not cleared.recovered
    assert not judge_run(DEFAULT, [*base, (699, {})]).recovered
    assert judge_run(DEFAULT, [*base, (700, {})]).recovered


def test_recovery_clock_restarts_on_a_brief_relapse() -> None:
    samples: list[tuple[float, dict[str, Any]]] = [(0, ECC), (100, {}), (400, HOT), (410, {}), (700, {})]
    assert not judge_run(DEFAULT, samples).recovered
    assert judge_run(DEFAULT, [*samples, (1010, {})]).recovered


def test_recovery_clock_restarts_when_the_agent_returns() -> None:
    samples: list[tuple[float, dict[str, Any]]] = [
        (0, ECC),
        (100, {}),
        (500, {"heartbeat": at(100)}),
        (501, {}),
    ]
    assert not judge_run(DEFAULT, [*samples, (1000, {})]).recovered
    assert judge_run(DEFAULT, [*samples, (1101, {})]).recovered


def test_sustained_condition_recovers_with_its_clear() -> None:
    samples = [(0, HOT), (60, HOT), (100, {}), (699, {})]
    assert judge_run(DEFAULT, samples).wanted_labels[keys.THERMAL_LABEL] == "true"
    verdict = judge_run(DEFAULT, [*samples, (700, {})])
    assert verdict.wanted_labels[keys.THERMAL_LABEL] is None
    assert verdict.recovered  # evidence gone since 100 s: healthy for 600 s already


OURS = model.NodeView(
    name="gpu-node-3",
    labels={"gpu": "yes"},
    annotations={keys.CORDONED_BY_ANNOTATION: "default"},
    unschedulable=True,
)


def test_may_uncordon_our_recovered_node() -> None:
    recovered = judge_run(DEFAULT, [(0, ECC), (100, {}), (700, {})], node=OURS)
    assert verdicts.may_uncordon(DEFAULT, OURS, recovered)
    assert not verdicts.may_uncordon(policy(recovery={"uncordon": False}), OURS, recovered)
    human = model.NodeView(name=OURS.name, labels=OURS.labels, unschedulable=True)
    assert not verdicts.may_uncordon(DEFAULT, human, recovered)
    other = model.NodeView(
        name=OURS.name,
        labels=OURS.labels,
        annotations={keys.CORDONED_BY_ANNOTATION: "other"},
        unschedulable=True,
    )
    assert not verdicts.may_uncordon(DEFAULT, other, recovered)
    excluded = model.NodeView(
        name=OURS.name, labels={**OURS.labels, keys.EXCLUDE_LABEL: "true"}, annotations=OURS.annotations
    )
    assert not verdicts.may_uncordon(DEFAULT, excluded, recovered)


# --- property: never uncordon what we did not cordon -------------------------------------------

GPU_FAULTS = st.fixed_dictionaries(
    {},
    optional={
        "ecc": st.fixed_dictionaries({"uncorrectedVolatile": st.integers(0, 2)}),
        "lost": st.booleans(),
        "clockEventReasons": st.lists(
            st.sampled_from(["HwThermalSlowdown", "HwSlowdown", "GpuIdle"]), max_size=2
        ),
        "xids": st.lists(
            st.fixed_dictionaries(
                {
                    "code": st.sampled_from([13, 79]),
                    "count": st.integers(0, 2),
                    "lastSeen": st.just("2026-11-22T01:00:00Z"),
                }
            ),
            max_size=2,
        ),
        "recoveryAction": st.sampled_from(["None", "GpuReset"]),
        "heartbeat": st.sampled_from([at(-10_000)]),
    },
)
NODES = st.builds(
    model.NodeView,
    name=st.just("gpu-node-3"),
    labels=st.sampled_from([{"gpu": "yes"}, {"gpu": "no"}, {"gpu": "yes", keys.EXCLUDE_LABEL: "true"}]),
    annotations=st.sampled_from(
        [{}, {keys.CORDONED_BY_ANNOTATION: "default"}, {keys.CORDONED_BY_ANNOTATION: "x"}]
    ),
    unschedulable=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    node=NODES,
    steps=st.lists(st.tuples(st.integers(1, 400), GPU_FAULTS), min_size=1, max_size=8),
    uncordon=st.booleans(),
)
def test_never_uncordon_what_we_did_not_cordon(
    node: model.NodeView, steps: list[tuple[int, dict[str, Any]]], uncordon: bool
) -> None:
    pol = policy(
        {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
        {"name": "thermal", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 30},
        recovery={"uncordon": uncordon, "healthyForSeconds": 300},
    )
    t = 0
    samples = []
    for delta, gpu in steps:
        t += delta
        samples.append((t, gpu))
    verdict = judge_run(pol, samples, node=node)
    if verdicts.may_uncordon(pol, node, verdict):
        assert node.cordoned_by == pol.name
        assert uncordon
        assert policies.selects(pol, node)
        assert verdict.recovered
        assert verdict.health is Health.HEALTHY
        assert verdict.issues == ()
        assert verdict.wanted_action is None


@settings(max_examples=300, deadline=None)
@given(
    node=NODES,
    recovered=st.booleans(),
    uncordon=st.booleans(),
    policy_name=st.sampled_from(["default", "x", "other"]),
)
def test_may_uncordon_requires_our_annotation(
    node: model.NodeView, recovered: bool, uncordon: bool, policy_name: str
) -> None:
    pol = dataclasses.replace(DEFAULT, name=policy_name, recovery_uncordon=uncordon)
    verdict = dataclasses.replace(judge_run(DEFAULT, [(0, {})]), recovered=recovered)
    allowed = verdicts.may_uncordon(pol, node, verdict)
    assert allowed == (
        node.cordoned_by == policy_name and recovered and uncordon and policies.selects(pol, node)
    )


# --- IsolateGPU: accepted, and acted on as its fallback (Drain) until GPUs are isolated ---------------


ISOLATING = policy(
    {"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"},
    {"name": "thermal", "condition": "ThermalThrottled", "action": "Cordon"},
)


def test_a_fired_isolate_gpu_rule_is_wanted_as_a_drain() -> None:
    verdict = judge_run(ISOLATING, [(0, ECC)])
    assert [r.action for r in verdict.fired_rules] == [Action.ISOLATE_GPU]
    assert verdict.wanted_action is Action.DRAIN
    assert verdict.detected_at == at(0)
    assert severity.budget_rank(verdict) == severity.rank(Condition.ECC_UNCORRECTABLE)


def test_isolate_gpu_outranks_cordon_as_the_drain_it_falls_back_to() -> None:
    verdict = judge_run(ISOLATING, [(0, {**ECC, **HOT})])
    assert [r.name for r in verdict.fired_rules] == ["ecc", "thermal"]
    assert verdict.wanted_action is Action.DRAIN


def test_a_stale_agent_never_falls_back_to_a_drain() -> None:
    verdict = judge_run(ISOLATING, [(0, ECC), (1000, {**ECC, "heartbeat": at(0)})])
    assert verdict.health is Health.UNKNOWN
    assert verdict.wanted_action is None


def test_an_edited_policy_judges_with_its_new_clocks_at_once() -> None:
    """What a policy judges (its conditions, forSeconds, recovery) is kept per policy object: the
    edited policy is another object, and its first judgement already runs on its own clocks."""
    before = policy({"name": "hot", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 600})
    after = policy({"name": "hot", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 30})
    assert not judge_run(before, [(0, HOT), (60, HOT)]).fired_rules
    assert [r.name for r in judge_run(after, [(0, HOT), (60, HOT)]).fired_rules] == ["hot"]
    assert not judge_run(before, [(0, HOT), (60, HOT)]).fired_rules, "the old policy's clocks are its own"
    without = policy()
    assert Condition.THERMAL_THROTTLED not in judge_run(without, [(0, HOT)]).conditions
