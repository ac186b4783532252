"""Reconciling: judge a node under every policy that selects it, act, and report.

One pass over one node reads only the cache (no requests), asks the decision
core for a verdict per selecting policy, lets `remediation` make the Node
match each verdict, then writes what changed: condition Events on
transitions, the GPUNode status (server-side apply, only when it differs)
and the Node's GPUHealthy condition. Watch events run a pass for the node at
once; the timer (`tick`) runs one for every node for the time-based
transitions.

Overlapping policies: each selecting policy judges and acts on the node
independently, with its own dry-run flag, except for the budget (a cordon
needs every acting selecting policy's, see `admission`) and the Node's labels
and taint: acting policies patch one combined wish (`decisions.overlap`), so
they never undo each other. The GPUNode status
and the GPUHealthy condition report the acting policies' strongest verdict
(`overlap.reported`: the most severe health, then the strongest action; a
dry-run policy only where no acting one selects the node), so a dry-run
preview or a policy with milder rules never hides a cordon made or waiting;
with several selecting policies `status.policies` lists each one's verdict.
`cordoned-by` names the policy that cordoned first; only that policy ever
uncordons the node.

A node whose Node or GPUNode is deleted during a pass leaves nothing to do:
the pass stops at the next look-up that finds it gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth_api import heartbeats, vocabulary
from gpuhealth_operator.client import events, kube, nodes, status
from gpuhealth_operator.decisions import (
    hysteresis,
    model,
    overlap,
    signals,
    stragglers,
    times,
    verdicts,
)
from gpuhealth_operator.ladder import remediation, stopping
from gpuhealth_operator.ladder.check import check_results
from gpuhealth_operator.ladder.drill import drills
from gpuhealth_operator.ladder.isolate import isolating
from gpuhealth_operator.ladder.repair import reading
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache, cohorts, kept_conditions
from gpuhealth_operator.verdict import judging, resting

logger = logging.getLogger(__name__)

Health = vocabulary.Health
Condition = vocabulary.Condition

TRANSIENT_ERRORS = kube.TRANSIENT_ERRORS

NODE_CONDITION: dict[Health, str] = {
    Health.HEALTHY: "True",
    Health.DEGRADED: "True",
    Health.UNHEALTHY: "False",
    Health.UNKNOWN: "Unknown",
}
"""GPUHealthy status per health: Degraded GPUs still work, so other tools should not remediate them."""


def awaiting_first_report(gpunode: cache.GPUNodeRecord, now: datetime.datetime) -> bool:
    """A GPUNode with no agent report yet, younger than `heartbeats.FIRST_REPORT_SECONDS`."""
    if gpunode.status.get("agent"):
        return False
    created = times.parse(gpunode.created)
    limit = datetime.timedelta(seconds=heartbeats.FIRST_REPORT_SECONDS)
    return created is not None and now - created < limit


async def policy_deleted(ctx: context.Context, name: str) -> None:
    """A policy is gone (its DELETED event, or a resync that found it missing): stop its drains, say
    how to release its cordons, forget it, and let another selecting policy adopt those cordons."""
    ctx.cache.remove_policy(name)
    await stopping.policy_deleted(ctx, name)
    ctx.forget_policy(name)
    for node in [n for n, r in ctx.cache.nodes.items() if r.view.cordoned_by == name]:
        await reconcile_node(ctx, node, "policy")


async def reconcile_node(
    ctx: context.Context, name: str, handler: str = "event", now: datetime.datetime | None = None
) -> None:
    """One pass for one node; errors are counted and logged, the next event or tick retries.

    The timer passes the `now` it judged the node at, so the pass reuses those verdicts.

    The answer to our own GPUNode status write is stored in the cache, and it may already carry
    an agent report that landed after the pass judged the node: that report's watch event then
    finds the cache as new as itself and reconciles nothing. So a pass whose node now holds another
    report than the one it judged runs again at once (`MAX_PASSES` in all), for the new report.

    A pass that uncordoned the node freed a budget place: the waiting nodes ask again at once
    (`wake_waiting`), after the node's lock is let go.
    """
    before = ctx.cache.nodes.get(name)
    await _passes(ctx, name, handler, now)
    if before is not None and before.view.unschedulable and ctx.admission.notified:
        after = ctx.cache.nodes.get(name)
        if after is None or not after.view.unschedulable:
            await wake_waiting(ctx, name)


async def wake_waiting(ctx: context.Context, freed: str) -> None:
    """A budget place may be free (`freed` turned schedulable, left a domain or is gone): the nodes told to
    wait for one ask again now, not at the next timer pass.

    Only the first of a budget's queue is admitted, whichever asks first (`budget.refusing`), so their
    order does not matter; the rest stay Pending and are not told again. The freed node is judged
    first: one a human uncordoned (an override) wants no place any more.
    """
    names = sorted({node for _, node in ctx.admission.notified} - {freed})
    if not names:
        return
    record = ctx.cache.nodes.get(freed)
    if record is not None:
        now = ctx.clock()
        for policy in judging.selecting_policies(ctx, record):
            judging.judge(ctx, policy, freed, now)
    results = await asyncio.gather(
        *(reconcile_node(ctx, name, "node") for name in names), return_exceptions=True
    )
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Exception):
            ctx.meters.reconcile_errors.labels("node").inc()
            logger.error("reconcile of node %s failed", name, exc_info=result)
        elif isinstance(result, BaseException):
            raise result  # cancelled: the operator is stopping


async def _passes(ctx: context.Context, name: str, handler: str, now: datetime.datetime | None) -> None:
    async with ctx.node_locks[name]:
        if now is not None and not judging.judged_at(ctx, name, now):
            # It moved since the timer judged it (a report, a write's answer): judged by the clock.
            now = None
        for _ in range(MAX_PASSES):
            judged = ctx.cache.gpunodes.get(name)
            try:
                await _reconcile(ctx, name, now or ctx.clock())
            except TRANSIENT_ERRORS as error:
                if ctx.cache.nodes.get(name) is None or ctx.cache.gpunodes.get(name) is None:
                    logger.debug("node %s was deleted during its reconcile: %s", name, error)
                    return  # gone (a write met 404): nothing left to do, nothing to retry
                ctx.meters.reconcile_errors.labels(handler).inc()
                # A client timeout's text is empty: name it by its type.
                logger.warning(
                    "reconcile of node %s failed (will retry): %s", name, str(error) or repr(error)
                )
                return
            current = ctx.cache.gpunodes.get(name)
            if judged is None or current is None or not new_report(judged, current):
                return
            now = None  # judge the new report by the clock, not at the timer's instant


MAX_PASSES = 3
"""Passes of one reconcile while reports keep landing under it; a later one's own event follows."""


def new_report(judged: cache.GPUNodeRecord, current: cache.GPUNodeRecord) -> bool:
    """Whether `current` holds another agent report (or fire-drill annotation) than `judged`."""
    if current is judged:
        return False
    if current.annotations != judged.annotations:
        return True
    return not current.same_report(judged)


async def _reconcile(ctx: context.Context, name: str, now: datetime.datetime) -> None:
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    if record is None or gpunode is None:
        return
    selecting = judging.selecting_policies(ctx, record)
    if not selecting:
        ctx.forget_verdicts(name)
        return
    if awaiting_first_report(gpunode, now):
        return  # the agent created its GPUNode and is about to report: nothing to judge, nothing stale
    if resting.unchanged(ctx, name, selecting, now):
        gpunode.rest()
        return  # at rest, and its report changes nothing a verdict reads: the last pass stands
    ctx.judging.resting.pop(name, None)
    previous = gpunode.conditions
    judged = judging.node_verdicts(ctx, name, now)
    if judged is None:
        return
    results: list[PolicyVerdict] = []
    for policy, verdict in judged:
        action = await remediation.remediate(ctx, policy, name, verdict, now)
        if ctx.cache.nodes.get(name) is None or ctx.cache.gpunodes.get(name) is None:
            return  # deleted meanwhile: nothing left to do
        results.append((policy, verdict, action))
    policy, verdict, action = results[0]  # one selecting policy (the common case): its verdict is reported
    if len(results) > 1:  # the others' conditions too: each policy's clocks are kept in the status
        chosen = overlap.reported([(p.dry_run, v.health, a) for p, v, a in results])
        policy, verdict, action = results[chosen]
        others = [v for i, (_, v, _) in enumerate(results) if i != chosen]
        verdict = dataclasses.replace(verdict, conditions=overlap.shown_conditions(verdict, others))
    action = await drills.run(ctx, name, selecting, action, now)  # a fire drill, if the GPUNode asks for one
    await _condition_events(ctx, name, previous, verdict)
    await _write_status(ctx, policy, name, verdict, action, results=results if len(results) > 1 else ())
    if not policy.dry_run:
        await _node_condition(ctx, name, verdict, now)
    resting.remember(ctx, name, record, gpunode, results)


async def _condition_events(
    ctx: context.Context,
    name: str,
    previous: Mapping[vocabulary.ConditionKey, model.ConditionState],
    verdict: model.NodeVerdict,
) -> None:
    """One Event per condition that turned True in this pass (Warning; GPUOperatorMaintenance Normal), and
    one (Normal) per condition that cleared."""
    gpunode = ctx.cache.gpunodes.get(name)
    if gpunode is None:
        return
    reported = bool(gpunode.status.get("agent"))
    for condition, state in verdict.conditions.items():
        before = previous.get(condition)
        if condition is Condition.AGENT_STALE and not reported:
            continue  # a GPUNode whose agent has not reported yet is new, not stale: no Event
        if state.status == "True" and (before is None or before.status != "True"):
            await ctx.recorder.emit_on(
                ctx.cache,
                name,
                condition.value,
                state.message or condition.value,
                events.NORMAL if condition is Condition.GPU_OPERATOR_MAINTENANCE else events.WARNING,
            )
        elif state.status != "True" and before is not None and before.status == "True":
            # Said both ways (issue 45): the decision that undoes what its Warning started.
            await ctx.recorder.emit_on(
                ctx.cache,
                name,
                condition.value,
                f"{condition.value} cleared: {state.message or 'no evidence any more'}",
                events.NORMAL,
            )
        elif condition is Condition.GPU_OPERATOR_MAINTENANCE and _newly_overdue(state, before):
            # The maintenance outlasted its limit: its label hides no fault any more (issue 45, item 4).
            await ctx.recorder.emit_on(ctx.cache, name, condition.value, state.message, events.WARNING)


def _newly_overdue(state: model.ConditionState, before: model.ConditionState | None) -> bool:
    def overdue(s: model.ConditionState | None) -> bool:
        return s is not None and s.status == "True" and signals.OVERDUE_WORDS in s.message

    return overdue(state) and not overdue(before)


PolicyVerdict = tuple[model.Policy, model.NodeVerdict, vocabulary.NodeAction]
"""One selecting policy's verdict on a node and the status action it led to."""

POLICIES_FIELD = "policies"
"""GPUNode status: each selecting policy's verdict, written when more than one policy selects the node."""


def policy_verdicts(results: Sequence[PolicyVerdict]) -> list[dict[str, Any]]:
    """`status.policies`: each selecting policy's own verdict, in policy-name order."""
    return [
        {
            "policy": policy.name,
            "dryRun": policy.dry_run,
            "health": verdict.health.value,
            "issues": ",".join(verdict.issues),
            "action": action.value,
        }
        for policy, verdict, action in results
    ]


def desired_status(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    action: vocabulary.NodeAction,
    *,
    results: Sequence[PolicyVerdict] = (),
) -> dict[str, Any]:
    """The operator's part of the GPUNode status: the reported verdict (`overlap.reported`), and with
    several selecting policies (`results`) each one's own."""
    desired: dict[str, Any] = {
        "health": verdict.health.value,
        "issues": ",".join(verdict.issues),
        "action": action.value,
        "conditions": [dict(c) for c in hysteresis.to_status(verdict.conditions.values(), policy.generation)],
    }
    if results:
        desired[POLICIES_FIELD] = policy_verdicts(results)
    straggler = stragglers.status_of(ctx.judging.stragglers.get((policy.name, name)))
    if straggler is not None:
        desired["straggler"] = straggler
    desired.update(isolating.status_fields(ctx, name))  # every policy's isolated GPUs
    desired.update(reading.status_fields(ctx, name))  # the repair history (ours: kept in every write)
    desired.update(check_results.status_fields(ctx, name))  # the active checks' runs (ours too)
    return desired


def _differs(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    if any(current.get(k) != v for k, v in desired.items() if k not in ("conditions", "straggler")):
        return True
    if stragglers.status_moved(current.get("straggler"), desired.get("straggler")):
        return True
    owned = (*isolating.STATUS_FIELDS, POLICIES_FIELD, reading.STATUS_FIELD, check_results.STATUS_FIELD)
    if any(k not in desired and current.get(k) for k in owned):
        return True
    held = current.get("conditions") or []
    if isinstance(held, list | tuple) and kept_conditions.same(held, desired["conditions"]):
        return False  # equal as lists, so as maps by type too: one call, not one per condition (issue 46)
    have = {c.get("type"): c for c in held}
    want = {c.get("type"): c for c in desired["conditions"]}
    return have != want


KEPT_STATUS_FIELDS = ("health", "issues", "action", "conditions", "straggler", POLICIES_FIELD)
"""The fields of `desired_status` besides the isolated GPUs and the repair history."""


async def write_history(ctx: context.Context, name: str) -> None:
    """Write the node's repair history where no pass writes its status (a cancel of an excluded or no
    longer selected node): the operator's fields as stored, with the history this process made. Errors
    are logged; the next pass that writes the status carries the history too."""
    gpunode = ctx.cache.gpunodes.get(name)
    made = {
        field: listed
        for field, listed in (
            (reading.STATUS_FIELD, ctx.steps.repair.history.get(name)),
            (check_results.STATUS_FIELD, ctx.steps.check.history.get(name)),  # the active checks' runs
        )
        if listed is not None
    }
    if gpunode is None or all(_plain(gpunode.status.get(k)) == v for k, v in made.items()):
        return
    owned = (*KEPT_STATUS_FIELDS, *isolating.STATUS_FIELDS, reading.STATUS_FIELD, check_results.STATUS_FIELD)
    stored: Mapping[str, Any] = gpunode.status
    desired = {k: _plain(stored[k]) for k in owned if k in stored}  # the cache keeps shared read-only forms
    desired.update(made)
    try:
        ctx.cache.refresh_gpunode(await status.apply_gpunode(ctx.client, name, desired), ctx.clock())
    except kube.ApiError:
        logger.warning("writing the repair history of node %s failed (will retry)", name, exc_info=True)


def _plain(value: Any) -> Any:
    """A cached status value as plain JSON data (mappings as dicts, sequences as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


async def _write_status(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    action: vocabulary.NodeAction,
    *,
    results: Sequence[PolicyVerdict] = (),
) -> None:
    gpunode = ctx.cache.gpunodes.get(name)
    desired = desired_status(ctx, policy, name, verdict, action, results=results)
    if gpunode is None or not _differs(dict(gpunode.status), desired):
        return
    ctx.cache.refresh_gpunode(await status.apply_gpunode(ctx.client, name, desired), ctx.clock())


async def _node_condition(
    ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    record = ctx.cache.nodes.get(name)
    if record is None:
        return
    state = NODE_CONDITION[verdict.health]
    reason = verdict.issues[0].value if verdict.issues else "GPUsHealthy"
    if verdict.health is Health.UNKNOWN:
        # Why nothing is judged: GPU Operator maintenance, a stale agent, or an agent in error.
        reason = verdicts.unknown_reason(verdict).value
    messages = [verdict.conditions[c].message for c in verdict.issues if c in verdict.conditions]
    message = "; ".join(m for m in messages if m) or (
        "All GPUs healthy." if verdict.health is Health.HEALTHY else verdict.health.value
    )
    message = message[:1024]
    current = record.condition
    if current is not None and (current.status, current.reason, current.message) == (state, reason, message):
        return
    transition = (
        current.last_transition_time if current is not None and current.status == state else times.render(now)
    )
    ctx.cache.refresh_node(
        await nodes.set_condition(
            ctx.client,
            name,
            status=state,
            reason=reason,
            message=message,
            transition_time=transition,
            now=times.render(now),
        )
    )


def score_stragglers(ctx: context.Context, now: datetime.datetime) -> set[str]:
    """Straggler scores per policy cohort (policies with a Straggler rule); the nodes to judge again.

    Those are the nodes whose score changed in a way a verdict reads (`cohort_members.judged_part`). An
    unflagged node's numbers move whenever a peer reports (the cohort's median moves); they reach its
    `status.straggler` the next time the node is reconciled anyway (its own report, the timer's full
    pass), not as one status write per node per peer's report. The cohorts are kept from tick to tick
    and worked out again where a member changed (`cohorts`).
    """
    return cohorts.score(ctx, now)
