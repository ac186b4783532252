"""Fire drills, the pure part: reading the annotations, the synthetic signal, the budget check, the words."""

import dataclasses
import datetime

import pytest

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import (
    budget,
    device_taints,
    drill,
    hysteresis,
    isolation,
    model,
    policies,
    verdicts,
)
from gpunode_facts import agent_status, rfc3339

Condition = vocabulary.Condition
Action = vocabulary.Action
Health = vocabulary.Health
NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
NODE = model.NodeView(name="gpu-node-3", labels={"gpu": "yes"})


def policy(*rules: dict[str, object], name: str = "default", **spec: object) -> model.Policy:
    return policies.parse_policy(
        name, 1, {"nodeSelector": {"matchLabels": {"gpu": "yes"}}, "rules": list(rules), **spec}
    )


DRAIN = policy({"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}, maxUnavailable=1)


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600.0), ("600s", 600.0), ("10m", 600.0), ("1h30m", 5400.0), (" 45s ", 45.0), ("24h", 86400.0)],
)
def test_a_ttl_reads_as_seconds_or_a_go_style_duration(text: str, seconds: float) -> None:
    assert drill.parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "-5", "10 minutes", "1.5m", "25h", "m", "10d"])
def test_a_bad_ttl_is_an_error_that_shows_the_forms_that_work(text: str) -> None:
    with pytest.raises(drill.DrillError, match=r'"10m"'):
        drill.parse_ttl(text)


def test_no_drill_annotation_is_no_drill() -> None:
    assert drill.requested({keys.CORDONED_BY_ANNOTATION: "x"}) is None


def test_a_drill_defaults_to_ten_minutes_and_starts_when_the_operator_says() -> None:
    wanted = drill.requested({keys.DRILL_ANNOTATION: "EccUncorrectable"})
    assert wanted == drill.Drill(Condition.ECC_UNCORRECTABLE, 600.0, None)
    started = drill.requested(
        {
            keys.DRILL_ANNOTATION: "XidCritical",
            keys.DRILL_TTL_ANNOTATION: "90s",
            keys.DRILL_STARTED_ANNOTATION: rfc3339(NOW),
        }
    )
    assert started == drill.Drill(Condition.XID_CRITICAL, 90.0, NOW)
    assert started.expires(at(1000)) == at(90)
    assert not started.expired(at(89))
    assert started.expired(at(90))


def test_an_unknown_condition_names_every_valid_one() -> None:
    with pytest.raises(drill.DrillError) as error:
        drill.requested({keys.DRILL_ANNOTATION: "EccUncorectable"})
    message = str(error.value)
    assert "'EccUncorectable' is not a condition" in message
    assert all(c.value in message for c in Condition)


def test_an_unreadable_start_is_written_again() -> None:
    wanted = drill.requested({keys.DRILL_ANNOTATION: "GPULost", keys.DRILL_STARTED_ANNOTATION: "yesterday"})
    assert wanted is not None and wanted.started is None


def drill_verdict(pol: model.Policy, wanted: drill.Drill, now: datetime.datetime) -> model.NodeVerdict:
    facts = agent_status(heartbeat=rfc3339(now), observed=rfc3339(NOW))
    return verdicts.judge(pol, NODE, facts, {}, None, now, drill=drill.signal(wanted, now))  # type: ignore[arg-type]


def test_the_synthetic_signal_runs_the_real_rules_on_a_healthy_node() -> None:
    wanted = drill.Drill(Condition.ECC_UNCORRECTABLE, 600.0, NOW)
    verdict = drill_verdict(DRAIN, wanted, at(1))
    assert verdict.health is Health.UNHEALTHY
    assert verdict.issues == (Condition.ECC_UNCORRECTABLE,)
    assert verdict.wanted_action is Action.DRAIN
    real = verdicts.judge(DRAIN, NODE, agent_status(), {}, None, at(1))  # type: ignore[arg-type]
    assert real.health is Health.HEALTHY and real.wanted_action is None


def test_for_seconds_counts_from_the_drills_start() -> None:
    slow = policy({"name": "hot", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 120})
    wanted = drill.Drill(Condition.THERMAL_THROTTLED, 600.0, NOW)
    early = drill_verdict(slow, wanted, at(60))
    assert early.wanted_action is None
    assert early.conditions[Condition.THERMAL_THROTTLED].reason == hysteresis.PENDING
    assert "is pending under policy default" in drill.describe(slow, wanted, early, [], None)
    assert drill_verdict(slow, wanted, at(121)).wanted_action is Action.CORDON


def test_a_condition_no_rule_uses_is_still_judged_for_health() -> None:
    wanted = drill.Drill(Condition.PCIE_DEGRADED, 600.0, NOW)
    verdict = drill_verdict(DRAIN, wanted, at(1))
    assert verdict.health is Health.DEGRADED and verdict.wanted_action is None


def test_the_event_names_what_would_be_done_and_the_budget() -> None:
    wanted = drill.Drill(Condition.ECC_UNCORRECTABLE, 600.0, NOW)
    verdict = drill_verdict(DRAIN, wanted, at(1))
    changes = ["label gpuhealth.io/health=unhealthy", "cordon and drain"]
    assert drill.describe(DRAIN, wanted, verdict, changes, None) == (
        "Drill: policy default would label gpuhealth.io/health=unhealthy, cordon and drain "
        "(EccUncorrectable)."
    )
    waiting = drill.describe(DRAIN, wanted, verdict, changes, "policy default's budget has no free place")
    assert waiting.endswith(
        "but policy default's budget has no free place: the node would wait for the budget (action Pending)."
    )
    dry = dataclasses.replace(DRAIN, dry_run=True)
    assert drill.describe(dry, wanted, verdict, changes, None).startswith(
        "Drill: dry-run policy default would only record that it would label"
    )


def test_the_budget_check_takes_nothing_and_names_a_full_budget() -> None:
    free = budget.Budget(DRAIN, {"a", "b", "gpu-node-3"}, set())
    assert drill.budget_wait("gpu-node-3", [free]) is None
    full = budget.Budget(DRAIN, {"a", "b", "gpu-node-3"}, {"a"})
    assert drill.budget_wait("gpu-node-3", [full]) == (
        "policy default's budget has no free place (1 of its 3 selected GPU nodes are unschedulable, "
        "maxUnavailable=1)"
    )
    other = budget.Budget(policy(name="pool", maxUnavailable=1), {"a", "b"}, {"a"})
    assert drill.budget_wait("gpu-node-3", [free, other]) is None  # the full pool does not select the node
    itself = budget.Budget(DRAIN, {"a", "gpu-node-3"}, {"gpu-node-3"})
    assert drill.budget_wait("gpu-node-3", [itself]) is None


def test_a_drill_of_an_isolating_rule_stands_in_one_gpu_the_cluster_decides_on() -> None:
    """IsolateGPU needs a GPU to isolate and a drill names none: the first listed GPU stands in, so the
    drill meets the same device, budget and node-ladder checks a real fault would."""
    wanted = drill.Drill(Condition.ECC_UNCORRECTABLE, 600.0, NOW)
    facts = agent_status(gpus=8)
    found = drill.attribution(wanted, facts)
    first = facts["gpus"][0]
    assert found.unattributed is None
    assert [(g.index, g.uuid, g.conditions) for g in found.gpus] == [
        (0, first["uuid"], (Condition.ECC_UNCORRECTABLE,))
    ]
    device = device_taints.Device("gpu.nvidia.com", "node-a", "gpu-0")
    decided = isolation.decide(
        found, devices={first["uuid"]: device}, api_version="v1beta2", max_gpus_per_node=2, budget_left=1
    )
    assert isolation.dry_run_changes(decided, drill.STAND_IN) == ["isolate the faulty GPU"]
    spent = isolation.decide(
        found, devices={first["uuid"]: device}, api_version="v1beta2", max_gpus_per_node=2, budget_left=0
    )
    assert isolation.dry_run_changes(spent, drill.STAND_IN) == [
        "isolate the faulty GPU once maxUnavailableGPUs allows"
    ]
    plugin = isolation.decide(found, devices={}, api_version="v1beta2", max_gpus_per_node=2, budget_left=1)
    assert plugin.node_ladder is not None and "no DRA device" in plugin.node_ladder


def test_a_drill_on_a_node_listing_no_gpu_takes_the_node_ladder() -> None:
    wanted = drill.Drill(Condition.ECC_UNCORRECTABLE, 600.0, NOW)
    found = drill.attribution(wanted, {"agent": {}, "gpus": []})
    decided = isolation.decide(found, devices={}, api_version="v1beta2", max_gpus_per_node=2, budget_left=1)
    assert decided.node_ladder is not None and "lists no GPU" in decided.node_ladder
