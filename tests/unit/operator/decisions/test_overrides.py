"""After a human override only new evidence acts again: a counter past the baseline, a new XID or episode."""

import dataclasses
import datetime
from typing import Any

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, overrides, policies, times, verdicts

Condition = vocabulary.Condition
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(name="gpu-node-3", labels={"gpu": "yes"})
XIDS = frozenset({79})
SEEN = "2026-11-22T00:59:00Z"
POLICY = policies.parse_policy(
    "default",
    1,
    {
        "nodeSelector": {"matchLabels": {"gpu": "yes"}},
        "rules": [
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            {"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": [79]},
        ],
        "recovery": {"healthyForSeconds": 0, "uncordon": True},
    },
)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def gpu(index: int, *, ecc: int = 0, xids: dict[int, int] | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "ecc": {"uncorrectedVolatile": ecc},
        "xids": [{"code": c, "count": n, "lastSeen": SEEN} for c, n in sorted((xids or {}).items())],
        "observedTime": "2026-11-22T01:00:00Z",
    }


def facts(*gpus: dict[str, Any], now: datetime.datetime = T0) -> Any:
    return {"agent": {"lastHeartbeatTime": times.render(now), "heartbeatSeconds": 60}, "gpus": list(gpus)}


class Run:
    """Judges facts in turn, keeping the condition states between samples as the status would."""

    def __init__(self) -> None:
        self.states: dict[Condition, model.ConditionState] = {}

    def judge(self, seconds: float, *gpus: dict[str, Any]) -> tuple[model.NodeVerdict, overrides.Evidence]:
        status = facts(*gpus, now=at(seconds))
        verdict = verdicts.judge(POLICY, NODE, status, self.states, None, at(seconds))
        self.states = dict(verdict.conditions)
        return verdict, overrides.gather(verdict, status, XIDS)


def test_the_same_evidence_is_not_new() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2))
    later, current = run.judge(30, gpu(0, ecc=2))
    assert overrides.driving(later) == (Condition.ECC_UNCORRECTABLE,)
    assert overrides.new_evidence(baseline, current, overrides.driving(later)) == []


def test_an_ecc_count_past_the_baseline_is_new() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2))
    later, current = run.judge(30, gpu(0, ecc=3))
    found = overrides.new_evidence(baseline, current, overrides.driving(later))
    assert found == ["GPU GPU-0: uncorrectable ECC count 3, was 2 at the override"]


def test_ecc_on_another_gpu_is_new() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2), gpu(1))
    later, current = run.judge(30, gpu(0, ecc=2), gpu(1, ecc=1))
    assert overrides.new_evidence(baseline, current, overrides.driving(later))


def test_a_new_xid_or_a_growing_xid_count_is_new_but_a_non_critical_one_is_not() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, xids={79: 1}))
    same, current = run.judge(10, gpu(0, xids={79: 1, 13: 5}))
    assert overrides.new_evidence(baseline, current, overrides.driving(same)) == []
    grown, current = run.judge(20, gpu(0, xids={79: 2}))
    assert overrides.new_evidence(baseline, current, overrides.driving(grown))
    other, current = run.judge(30, gpu(0, xids={79: 1}), gpu(1, xids={79: 1}))
    assert overrides.new_evidence(baseline, current, overrides.driving(other))


def test_a_condition_that_clears_and_returns_is_a_new_episode() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2))
    cleared, current = run.judge(10, gpu(0, ecc=0))
    assert Condition.ECC_UNCORRECTABLE not in cleared.issues
    assert not overrides.still_stands(baseline, cleared)
    back, current = run.judge(20, gpu(0, ecc=1))  # a lower count than at the override, but a new episode
    found = overrides.new_evidence(baseline, current, overrides.driving(back))
    assert found and "new episode" in found[0]


def test_a_condition_not_true_at_the_override_is_new() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2))
    both, current = run.judge(10, gpu(0, ecc=2, xids={79: 1}))
    found = overrides.new_evidence(baseline, current, overrides.driving(both))
    assert found == [f"XidCritical is a new episode (true since {current.episodes['XidCritical']})"]
    assert overrides.still_stands(baseline, both)


def test_baseline_survives_the_annotation_round_trip_and_garbage_reads_as_none() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2, xids={79: 3}))
    text = overrides.render(baseline, T0, "default")
    assert overrides.parse(text) == baseline
    assert overrides.render(overrides.parse(text) or overrides.Evidence(), T0, "default") == text
    for garbage in (None, "", "not json", "[]", '{"episodes": 3}'):
        assert overrides.parse(garbage) is None


def test_an_override_withdraws_cordon_and_drain_until_new_evidence() -> None:
    run = Run()
    _, baseline = run.judge(0, gpu(0, ecc=2))
    node = dataclasses.replace(
        NODE, annotations={keys.OVERRIDDEN_EVIDENCE_ANNOTATION: overrides.render(baseline, T0, "default")}
    )
    status = facts(gpu(0, ecc=2), now=at(10))
    same = verdicts.judge(POLICY, node, status, run.states, None, at(10))
    assert same.overridden and same.wanted_action is None
    assert Condition.ECC_UNCORRECTABLE in same.issues, "the evidence is still listed"
    grown = verdicts.judge(POLICY, node, facts(gpu(0, ecc=3), now=at(20)), run.states, None, at(20))
    assert not grown.overridden and grown.wanted_action is vocabulary.Action.DRAIN
    garbage = dataclasses.replace(NODE, annotations={keys.OVERRIDDEN_EVIDENCE_ANNOTATION: "{"})
    held = verdicts.judge(POLICY, garbage, facts(gpu(0, ecc=9), now=at(30)), run.states, None, at(30))
    assert held.overridden, "a baseline that does not parse never disrupts"
    ours = dataclasses.replace(node, annotations={**node.annotations, keys.CORDONED_BY_ANNOTATION: "default"})
    assert (
        verdicts.judge(POLICY, ours, status, run.states, None, at(10)).wanted_action
        is vocabulary.Action.DRAIN
    )
