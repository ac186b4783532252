"""Verdicts: one node judged under one policy at one instant.

`judge` runs the whole pure pipeline for a node: raw signals from the facts,
hysteresis against the states kept in GPUNode status, health, the rules that
fire and what they want done to the Node. The I/O layer applies the verdict
(through the budget for Cordon and Drain) and stores `verdict.conditions`
back with `hysteresis.to_status`.

Health is judged on every fatal condition and AgentStale whatever the rules
say, plus every condition a rule uses. A stale agent makes the node Unknown:
conditions hold their last state, no Cordon or Drain is wanted, the health
label is left as it is, and the node does not count as recovered. So losing
an agent (or a DaemonSet rollout) neither disrupts nor releases a node.

Rules are ranked and acted on by their node action (`isolation.node_action`):
an IsolateGPU rule counts as its fallback, Drain, until `with_isolation`
applies the node's isolation decision: when every faulty GPU is isolated or
waits for the GPU budget, IsolateGPU rules leave the node ladder.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Final

from gpuhealth_api import conditions, keys, status, vocabulary
from gpuhealth_operator.decisions import (
    hysteresis,
    isolation,
    liveness,
    model,
    overrides,
    policies,
    severity,
    signals,
    trends,
)

Condition = vocabulary.Condition
Action = vocabulary.Action
Health = vocabulary.Health

BLIND: Final = conditions.BLIND
"""Conditions under which no fact is judged: health Unknown, conditions hold, no disruptive action."""

MAINTENANCE_LIMIT_SECONDS: Final = signals.MAINTENANCE_LIMIT_SECONDS
MAINTENANCE_GRACE_SECONDS: Final = 60.0
"""How long GPUOperatorMaintenance holds after the GPU Operator's label left its maintenance states: the
label and the agent's report of the GPUs back come through two watches, in either order."""

_CONDITION_LABELS: Final[Mapping[Condition, str]] = {
    Condition.STRAGGLER: keys.STRAGGLER_LABEL,
    Condition.THERMAL_THROTTLED: keys.THERMAL_LABEL,
}
"""Conditions with their own Node label, set by a fired Label-or-stronger rule."""


def judge(  # noqa: PLR0917 - the pipeline's inputs, in the order the handler has them
    policy: model.Policy,
    node: model.NodeView,
    facts: status.GPUNodeStatus,
    previous: Mapping[vocabulary.ConditionKey, model.ConditionState],
    straggler: model.StragglerScore | None,
    now: datetime.datetime,
    *,
    report_age_seconds: float = 0.0,
    drill: model.Signal | None = None,
    agent_pod: liveness.AgentPod | None = None,
    known_signals: signals.FactSignals | None = None,
    memory: trends.Trends | None = None,
    isolated: isolation.NodeIsolation | None = None,
) -> model.NodeVerdict:
    """`report_age_seconds`: how long ago, by the operator's clock, the agent's last new report was seen;
    `agent_pod`: the node's agent pod as last seen (None: not known; see `liveness`); `known_signals`:
    the fact signals kept with this version of `facts` (see `signals.raw_signals`); `memory`: what the
    operator remembers of the node's earlier reports (`trends`; None: nothing, as `check`); `isolated`:
    the isolation decided for the node's GPUs, folded in (`with_isolation`; None: none decided).

    `drill`: a fire drill's synthetic signal, which replaces the real one for its condition.
    """
    overdue = maintenance_overdue(previous.get(Condition.GPU_OPERATOR_MAINTENANCE), now)
    plan = _plan(policy, drill.condition if drill else None)
    raw = signals.raw_signals(
        facts,
        node,
        plan.xids,
        now,
        report_age_seconds,
        agent_pod=agent_pod,
        known=known_signals,
        thresholds=plan.thresholds,
        memory=memory,
        overdue=overdue,
    )
    if not overdue:
        _hold_after_maintenance(raw, previous.get(Condition.GPU_OPERATOR_MAINTENANCE), now)
    blinding = BLIND - {Condition.GPU_OPERATOR_MAINTENANCE} if overdue else BLIND
    stale = any(raw[c].present is True for c in blinding)
    raw[Condition.STRAGGLER] = straggler_signal(straggler, stale=stale)
    for rule in policy.rules:
        if isinstance(rule.condition, vocabulary.NodeCondition):
            raw[rule.condition] = signals.node_condition_signal(node, rule.condition)
    if drill is not None:
        raw[drill.condition] = drill
    states = hysteresis.advance_all(previous, raw, plan.clocks, now)
    # The states come in the order of `plan.clocks`, most severe first (`advance_all` keeps it): the true
    # ones, so taken, are `severity.most_severe_first` of them without sorting them again.
    issues = tuple(c for c, s in states.items() if s.status == hysteresis.TRUE)
    health = _health(issues, blinding)
    # The policy's rules come ranked (`_Plan.ranked`): the fired ones, filtered, keep that order.
    fired = [ranked for ranked in plan.ranked if _fires(ranked[0], states[ranked[0].condition], now)]
    if health is Health.UNKNOWN:
        fired = [ranked for ranked in fired if ranked[1] not in vocabulary.DISRUPTIVE_ACTIONS]
    wanted_action = fired[0][1] if fired else None
    rules = [rule for rule, _, _ in fired]
    verdict = model.NodeVerdict(
        node=node.name,
        conditions=states,
        health=health,
        issues=issues,
        fired_rules=tuple(rules),
        wanted_action=wanted_action,
        wanted_labels=_labels(health, rules),
        wanted_taint=_taint(fired),
        recovered=_recovered(health, states, policy.recovery_healthy_for_seconds, now),
        detected_at=min(
            (_held_since(states[rule.condition]) for rule, action, _ in fired if action is wanted_action),
            default=None,
        ),
    )
    return with_isolation(overrides.apply(policy, node, facts, verdict), isolated)


_Clocks = tuple[tuple[vocabulary.ConditionKey, float, float], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """What `judge` reads of one policy object, worked out once: a policy changes far less often than it
    judges, and each of these asked another module again per judgement (issue 46)."""

    clocks: _Clocks
    """The conditions it judges, with their clocks (`_clocks`)."""
    ranked: tuple[tuple[model.Rule, Action, int], ...]
    """Its rules in the order fired rules are acted on (the strongest node action, the most severe
    condition, the name), each with its node action (`isolation.node_action`) and its condition's
    severity rank: fired rules filtered from these are so ordered, as a stable sort of them would be."""
    xids: frozenset[int]
    """`policies.rule_xids`."""
    thresholds: trends.Thresholds
    """`trends.thresholds`."""


_PLANS: dict[tuple[int, vocabulary.ConditionKey | None], tuple[model.Policy, _Plan]] = {}
"""`_plan` per policy object (and drilled condition)."""


def _plan(policy: model.Policy, drilled: vocabulary.ConditionKey | None) -> _Plan:
    key = (id(policy), drilled)
    known = _PLANS.get(key)
    if known is not None and known[0] is policy:
        return known[1]
    acts = [isolation.node_action(r.action) for r in policy.rules]
    ranks = [severity.rank(r.condition) for r in policy.rules]
    ranked = sorted(
        zip(policy.rules, acts, ranks, strict=True),
        key=lambda entry: (-vocabulary.ACTION_ORDER[entry[1]], entry[2], entry[0].name),
    )
    plan = _Plan(
        _clocks(policy, drilled), tuple(ranked), policies.rule_xids(policy), trends.thresholds(policy)
    )
    if len(_PLANS) >= 256:
        _PLANS.clear()  # policies come and go: never more than a few at once
    _PLANS[key] = (policy, plan)
    return plan


def _clocks(policy: model.Policy, drilled: vocabulary.ConditionKey | None) -> _Clocks:
    """The conditions a policy judges, most severe first, each with its forSeconds and clear seconds:
    every fatal one, AgentStale, those its rules name, and a fire drill's. Another tool's Node condition
    clears as soon as the Node says so: that tool has its own hysteresis."""
    judged: set[vocabulary.ConditionKey] = {*severity.FATAL, *BLIND, *(r.condition for r in policy.rules)}
    if drilled is not None:
        judged |= {drilled}
    return tuple(
        (
            condition,
            min((r.for_seconds for r in policy.rules if r.condition == condition), default=0.0),
            policy.recovery_healthy_for_seconds
            if condition in severity.SUSTAINED
            else MAINTENANCE_GRACE_SECONDS
            if condition is Condition.GPU_OPERATOR_MAINTENANCE
            else 0.0,
        )
        for condition in severity.most_severe_first(judged)
    )


def maintenance_overdue(state: model.ConditionState | None, now: datetime.datetime) -> bool:
    """Whether the GPU Operator's maintenance has held for `signals.MAINTENANCE_LIMIT_SECONDS`: from then on
    its label hides no fault. Timed from the GPUOperatorMaintenance condition kept in GPUNode status, so a
    restarted or new leader goes on counting; the label gone for the grace after it (60 s) starts over."""
    if state is None or state.status != hysteresis.TRUE:
        return False
    since = _held_since(state)
    return (now - since).total_seconds() >= signals.MAINTENANCE_LIMIT_SECONDS


def _hold_after_maintenance(
    raw: dict[vocabulary.ConditionKey, model.Signal],
    previous: model.ConditionState | None,
    now: datetime.datetime,
) -> None:
    """In the grace after a maintenance (`MAINTENANCE_GRACE_SECONDS`), the facts stay unknown, in place:
    they may still be the ones the agent sent while the GPUs were away."""
    signal = raw[Condition.GPU_OPERATOR_MAINTENANCE]
    if signal.present is not False or previous is None or previous.status != hysteresis.TRUE:
        return
    state = hysteresis.advance(previous, signal, 0.0, MAINTENANCE_GRACE_SECONDS, now)
    if state.status != hysteresis.TRUE:
        return
    for condition in signals.FACT_CONDITIONS:
        raw[condition] = model.Signal(condition, None, f"unknown: {state.message}")


def with_isolation(verdict: model.NodeVerdict, decision: isolation.NodeIsolation | None) -> model.NodeVerdict:
    """The verdict once the node's GPUs are decided: no Cordon/Drain for IsolateGPU rules unless the ladder.

    No decision yet, or a decision for the node ladder: the verdict as judged (IsolateGPU as
    Drain). Otherwise the wanted action is the strongest of the other fired rules, never
    stronger than judged (an override that suppressed the node action still holds).
    """
    if decision is None or decision.node_ladder is not None:
        return verdict
    if not any(r.action is Action.ISOLATE_GPU for r in verdict.fired_rules) or verdict.wanted_action is None:
        return verdict
    others = [r for r in verdict.fired_rules if r.action is not Action.ISOLATE_GPU]
    wanted = isolation.node_action(others[0].action) if others else None
    if wanted is not None and (
        vocabulary.ACTION_ORDER[wanted] > vocabulary.ACTION_ORDER[verdict.wanted_action]
    ):
        wanted = verdict.wanted_action
    detected_at = min(
        (
            _held_since(verdict.conditions[r.condition])
            for r in others
            if isolation.node_action(r.action) is wanted and r.condition in verdict.conditions
        ),
        default=None,
    )
    return dataclasses.replace(verdict, wanted_action=wanted, detected_at=detected_at)


def may_uncordon(policy: model.Policy, node: model.NodeView, verdict: model.NodeVerdict) -> bool:
    """Whether `policy` may uncordon `node`: only a node it cordoned, still selects, and that recovered.

    A node cordoned by a human (no annotation) or by another policy is never ours to release.
    """
    return (
        policy.recovery_uncordon
        and node.cordoned_by == policy.name
        and verdict.node == node.name
        and verdict.recovered
        and policies.selects(policy, node)
    )


def may_return_validated(policy: model.Policy, node: model.NodeView, verdict: model.NodeVerdict) -> bool:
    """Whether `policy` may uncordon `node` whose repair validation just passed (`spec.repair`): as
    `may_uncordon`, but the verdict need not have been healthy for recovery.healthyForSeconds; it must
    want no Cordon/Drain and not be Unknown or Unhealthy (the agent's report after the repair shows
    the fault gone). The validation Job's pass stands in for the wait."""
    return (
        policy.recovery_uncordon
        and policy.repair is not None
        and node.cordoned_by == policy.name
        and verdict.node == node.name
        and verdict.wanted_action not in vocabulary.DISRUPTIVE_ACTIONS
        and verdict.health in (Health.HEALTHY, Health.DEGRADED)
        and policies.selects(policy, node)
    )


def unknown_reason(verdict: model.NodeVerdict) -> Condition:
    """Why an Unknown verdict judges nothing (the GPUHealthy Node condition's reason): the GPU Operator's
    maintenance first (it explains the rest), then a stale agent, then an agent in error."""
    for condition in (Condition.GPU_OPERATOR_MAINTENANCE, Condition.AGENT_STALE, Condition.AGENT_ERROR):
        if condition in verdict.issues:
            return condition
    return Condition.AGENT_STALE


def straggler_signal(score: model.StragglerScore | None, *, stale: bool = False) -> model.Signal:
    condition = Condition.STRAGGLER
    if stale:
        return model.Signal(condition, None, "unknown: the agent is stale")
    if score is None:
        # Idle (or unscored) is not slow: absence of evidence, so a drained straggler can recover.
        return model.Signal(condition, False, "no performance score: no busy GPU with clocks reported")
    if score.flagged:
        return model.Signal(
            condition,
            True,
            f"performance score {score.score:.3f} is {-score.z_score:.1f} robust z-scores below "
            f"the median of {score.peers} peers",
            observed_at=score.since,
        )
    return model.Signal(condition, False, "performance in line with peers of the same GPU model")


def _health(issues: tuple[vocabulary.ConditionKey, ...], blinding: frozenset[Condition] = BLIND) -> Health:
    """Unknown when blind, Unhealthy on a fatal condition, Degraded on a sustained one or another tool's
    Node condition (not a GPU fault: the GPUHealthy Node condition stays True for other tools)."""
    if blinding.intersection(issues):
        return Health.UNKNOWN
    if any(c in severity.FATAL for c in issues):
        return Health.UNHEALTHY
    if any(c in severity.SUSTAINED or isinstance(c, vocabulary.NodeCondition) for c in issues):
        return Health.DEGRADED
    return Health.HEALTHY


def _held_since(state: model.ConditionState) -> datetime.datetime:
    return state.observed_since or state.last_transition_time


def _fires(rule: model.Rule, state: model.ConditionState, now: datetime.datetime) -> bool:
    """Whether the rule's condition has held for its forSeconds. A state recorded at a later instant than
    `now` (another replica's clock, a clock stepped back, a pass acting on an earlier instant) is held as
    of that instant: a condition that fired then does not stop firing because it is judged from before."""
    if state.status != hysteresis.TRUE:
        return False
    as_of = max(now, state.last_transition_time)
    return (as_of - _held_since(state)).total_seconds() >= rule.for_seconds


def _labels(health: Health, fired: list[model.Rule]) -> dict[str, str | None]:
    labels: dict[str, str | None] = {}
    if health is not Health.UNKNOWN:  # unknown: leave the label; missing data must not move workloads
        labels[keys.HEALTH_LABEL] = health.value.lower()
    for condition, label in _CONDITION_LABELS.items():
        labelled = any(
            r.condition == condition
            and vocabulary.ACTION_ORDER[r.action] >= vocabulary.ACTION_ORDER[Action.LABEL]
            for r in fired
        )
        labels[label] = "true" if labelled else None
    return labels


def _taint(fired: list[tuple[model.Rule, Action, int]]) -> str | None:
    """The most severe condition of a fired Taint rule (Cordon and Drain do not taint): the first by
    severity rank, then name, as `severity.most_severe_first` orders them."""
    tainting = [
        (rank, str(rule.condition), rule.condition) for rule, _, rank in fired if rule.action is Action.TAINT
    ]
    if not tainting:
        return None
    worst = min(tainting, key=lambda entry: entry[:2])[2]
    return worst.label_value if isinstance(worst, vocabulary.NodeCondition) else worst.value


def _recovered(
    health: Health,
    states: Mapping[vocabulary.ConditionKey, model.ConditionState],
    healthy_for_seconds: float,
    now: datetime.datetime,
) -> bool:
    """No condition True or pending, and free of evidence for healthy_for_seconds (from stored timestamps).

    An Unknown condition (no data ever seen for it) does not hold recovery back;
    a stale agent does, through health Unknown and AgentStale's own clock.
    """
    if health is not Health.HEALTHY or any(s.status == hysteresis.TRUE for s in states.values()):
        return False
    since = hysteresis.healthy_since_each(states.values())
    if any(s is None for s in since):
        return False
    latest = max((s for s in since if s is not None), default=None)
    return latest is None or (now - latest).total_seconds() >= healthy_for_seconds
