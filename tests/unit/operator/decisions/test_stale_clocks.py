"""A `forSeconds` clock never comes due on a report older than its window (issue 47 item 2).

A fabric registration after a reboot (`InProgress`), then the agent's pod NotReady for ten minutes: on
its return the operator judged the ten-minute-old report, FabricUnhealthy's 600 s had run out, and the
node was Unhealthy (a drain, on a schedulable node) on stale evidence. The evidence must hold, seen, for
the whole window: a time the facts could not be judged (stale agent, unreadable fact) ends the episode.
"""

import datetime
from typing import Any

import gpunode_facts
from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import hysteresis, liveness, model, policies, verdicts

Condition = vocabulary.Condition
Health = vocabulary.Health
T0 = datetime.datetime(2026, 12, 1, 3, 0, tzinfo=datetime.UTC)
NODE = model.NodeView(name="n", labels={"nvidia.com/gpu.count": "2"}, gpu_capacity=2)
POLICY = policies.parse_policy(
    "p",
    1,
    {"rules": [{"name": "fabric", "condition": "FabricUnhealthy", "action": "Drain", "forSeconds": 600}]},
)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def registering(received: float) -> Any:
    facts = gpunode_facts.agent_status(
        gpus=2, overrides={0: {"fabric": {"state": "InProgress"}}}, heartbeat_seconds=300
    )  # the default heartbeat: the pod's readiness says sooner when the agent is gone
    facts["agent"]["lastHeartbeatTime"] = gpunode_facts.rfc3339(at(received))
    return facts


class Operator:
    """Judges one node's last report as the operator does, with what it knows of the agent's pod."""

    def __init__(self) -> None:
        self.previous: dict[Any, model.ConditionState] = {}

    def judge(
        self, facts: Any, now: float, received: float, pod: liveness.AgentPod | None = None
    ) -> model.NodeVerdict:
        verdict = verdicts.judge(
            POLICY,
            NODE,
            facts,
            self.previous,
            None,
            at(now),
            report_age_seconds=now - received,
            agent_pod=pod,
        )
        self.previous = dict(verdict.conditions)
        return verdict


def test_a_stale_agents_old_report_does_not_bring_a_for_seconds_rule_due_on_its_return() -> None:
    operator = Operator()
    report = registering(0)
    assert operator.judge(report, 0, 0).health is Health.HEALTHY  # pending: 600 s to go
    not_ready = liveness.AgentPod("gpu-health/agent-x", ready=False, since=at(30))
    assert operator.judge(report, 120, 0, not_ready).health is Health.UNKNOWN  # stale
    assert operator.judge(report, 400, 0, not_ready).health is Health.UNKNOWN
    ready = liveness.AgentPod("gpu-health/agent-x", ready=True, since=at(630))
    back = operator.judge(report, 630.5, 0, ready)  # its ten-minute-old report, before the fresh one
    assert back.health is not Health.UNHEALTHY
    assert Condition.FABRIC_UNHEALTHY not in back.issues
    assert not back.fired_rules
    # The fresh report still says InProgress: the window starts again from its receipt.
    fresh = registering(631)
    assert operator.judge(fresh, 631, 631, ready).health is Health.HEALTHY
    assert Condition.FABRIC_UNHEALTHY not in operator.judge(fresh, 1230, 631, ready).issues
    due = operator.judge(fresh, 1231, 631, ready)
    assert Condition.FABRIC_UNHEALTHY in due.issues and due.health is Health.UNHEALTHY


def test_a_fault_the_agent_keeps_reporting_still_comes_due_after_its_window() -> None:
    operator = Operator()
    assert operator.judge(registering(0), 0, 0).health is Health.HEALTHY
    assert operator.judge(registering(300), 300, 300).health is Health.HEALTHY
    assert operator.judge(registering(300), 600, 300).health is Health.UNHEALTHY


def test_an_unknown_signal_ends_a_pending_episode_but_never_a_true_condition() -> None:
    def sig(present: bool | None) -> model.Signal:
        return model.Signal(Condition.THERMAL_THROTTLED, present, f"present={present}")

    state = hysteresis.advance(None, sig(True), 60, 600, at(0))
    state = hysteresis.advance(state, sig(None), 60, 600, at(30))
    assert state.observed_since is None and state.status == "False"
    state = hysteresis.advance(state, sig(True), 60, 600, at(70))
    assert state.status == "False"  # counted again from 70 s, not from 0 s
    assert hysteresis.advance(state, sig(True), 60, 600, at(130)).status == "True"
    held = hysteresis.advance(hysteresis.advance(None, sig(True), 0, 600, at(0)), sig(None), 0, 600, at(5))
    assert held.status == "True"
