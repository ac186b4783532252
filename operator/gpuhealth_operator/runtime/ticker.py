"""The periodic pass for time-based transitions, and the policies' status.

Watch events cover everything a change in the cluster causes; what time
alone causes (a condition held for `forSeconds`, an agent going stale, the
budget freeing up, `healthyForSeconds` of recovery, straggler cohorts
shifting) needs a clock. Every `tick_seconds` this judges the nodes where a
clock runs (`is_due`, asked only of the candidates `decisions.due` names;
every node every `full_pass_seconds`), acts where a verdict changed, and
refreshes each policy's status counts when they may have moved. A pass that
finds nothing to change sends no request. Each due node is judged once per
pass: the reconcile reuses the verdicts judged for the budget's ranking, but
judges a node that moved since (a report landed while the pass acted on
others) by the clock, never at the pass's earlier instant (`judging.judged_at`).
One node's error never ends the timer: it is logged and the next pass retries.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
from typing import Any

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import kube, status
from gpuhealth_operator.decisions import model, times, verdicts
from gpuhealth_operator.ladder import steps
from gpuhealth_operator.ladder.domain import domain_actions
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.ladder.isolate import isolating, isolation_support
from gpuhealth_operator.ladder.repair import repair_permission
from gpuhealth_operator.runtime import heap, reconciler
from gpuhealth_operator.shared import context, gpu_meters, metric_labels
from gpuhealth_operator.state import cache
from gpuhealth_operator.verdict import judging, resting

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0
"""How often the policies' status is recounted at the latest, and domain marks checked for drift: what
the full pass did every 10 s before it became a slow safety net (`--full-pass-seconds`, 300 s)."""

PASS_CHUNK = 250
"""Nodes judged (or reconciled) between two returns to the event loop in one pass: a full pass over
5,000 nodes is ~0.5 s of CPU, which in one piece would hold back a fault's watch event as long."""


def is_due(ctx: context.Context, name: str, now: datetime.datetime) -> bool:
    """Whether time alone may change this node's verdict now (else only a watch event can).

    A healthy node with a fresh heartbeat and nothing pending has no clock
    running: skipping it keeps the timer's cost proportional to the nodes in
    trouble, not to the fleet.
    """
    record = ctx.cache.node(name)
    gpunode = ctx.cache.gpunode(name)
    if record is None or gpunode is None:
        return False  # gone: nothing to judge
    if name in ctx.steps.drain or (
        ctx.admission.notified and any(ctx.admission.waiting(policy, name) for policy in ctx.cache.policies)
    ):
        return True
    if not gpunode.at_rest or not record.at_rest:
        return True  # a condition pending or held, an action, our label or cordon: a clock runs
    if ctx.agent_pods.not_ready(name):
        return True  # the agent's pod is not Ready: it turns stale after a grace (`decisions.liveness`)
    # The timer wakes just before the agent turns stale, by the operator's clock (see `signals.agent_stale`).
    if not resting.fresh(ctx, gpunode, now):
        return True
    return not any((policy, name) in ctx.verdicts for policy in ctx.cache.policies)


def due_nodes(ctx: context.Context, now: datetime.datetime, *, full: bool) -> list[str]:
    """The nodes `is_due` now, in the cache's order, asking only the candidates `decisions.due` names
    (all of them when `full` or after a policy changed): the cost follows what changed, not the fleet.

    The candidates are every node touched since the last pass, those due on it, those whose stale
    deadline comes within two ticks, and the sets held elsewhere that keep a clock running (drains,
    nodes waiting for the budget, agents not Ready). A candidate found not due gets its deadline back.
    """
    index = ctx.cache.due
    taken = index.take(now.timestamp(), 2 * ctx.config.tick_seconds)
    if full or taken is None:
        pool: list[str] = list(ctx.cache.gpunodes)
    else:
        taken |= ctx.steps.drain.tasks.keys()
        taken |= {name for _, name in ctx.admission.notified}
        taken |= ctx.agent_pods.not_ready_nodes
        pool = ctx.cache.in_order(taken)
    due = []
    for name in pool:
        if name in ctx.cache.nodes and is_due(ctx, name, now):
            due.append(name)
        elif (gpunode := ctx.cache.gpunode(name)) is not None:
            index.expect(name, cache.stale_deadline(gpunode))
    index.keep(due)
    return due


async def tick(
    ctx: context.Context, *, full: bool = False, statuses: bool = True, refresh: bool | None = None
) -> None:
    """One pass; `statuses=False` leaves the policies' status and gauges as they are (they only
    report: no decision reads them), for a backtest that refreshes them on its full passes alone.

    `refresh` (default: `full`) is the periodic part that is not judging: the GPU gauges go on (a
    recount only if what they count moved: `update_policy_statuses`), and domain marks a human removed
    come back (`domain_actions.on_timer`).
    """
    refresh = full if refresh is None else refresh
    now = ctx.clock()
    moved = reconciler.score_stragglers(ctx, now)
    if full:
        names = [n for n in ctx.cache.gpunodes if n in ctx.cache.nodes]
        due_nodes(ctx, now, full=True)  # what stays due after this pass, for the next ones
    else:
        due = due_nodes(ctx, now, full=False)
        moved_names = [n for n in moved if n in ctx.cache.nodes]
        names = ctx.cache.in_order({*due, *moved_names}) if moved_names else due
    # Judge every due node before acting on any, so the budget ranks all waiting nodes, not the first seen.
    for index, name in enumerate(names, 1):
        record = ctx.cache.node(name)
        for policy in judging.selecting_policies(ctx, record) if record is not None else ():
            judging.judge(ctx, policy, name, now)
        if index % PASS_CHUNK == 0:
            await asyncio.sleep(0)  # let watch events (a fault) in: a full pass is ~0.1 ms per node
    results: list[BaseException | None] = []
    for start in range(0, len(names), PASS_CHUNK):
        results += await asyncio.gather(
            *(
                reconciler.reconcile_node(ctx, name, "timer", now)
                for name in names[start : start + PASS_CHUNK]
            ),
            return_exceptions=True,
        )
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Exception):
            ctx.meters.reconcile_errors.labels("timer").inc()
            logger.error("reconcile of node %s failed", name, exc_info=result)
        elif isinstance(result, BaseException):
            raise result  # cancelled: the timer is stopping
    swept = steps.Tick(now, full=full, refresh=refresh, write=reconciler.write_history)
    for step in steps.STEPS:  # each ladder step's timer sweep, in the ladder's order (`ladder/steps.py`)
        for name in await step.sweep(ctx, swept) or ():
            await reconciler.write_history(ctx, name)  # a repair's Cancelled, where no pass writes the status
    if statuses:
        await update_policy_statuses(ctx, now, full=full, refresh=refresh)


async def update_policy_statuses(
    ctx: context.Context, now: datetime.datetime, *, full: bool, refresh: bool
) -> None:
    """Recount the policies' status and gauges when what they count moved (`_status_marks`), and write
    those that changed; at rest, count nothing: a refresh only carries the GPU gauges forward (the
    GPU-hours lost grow with the time). A refresh after a move counts the GPUs too (a pass between
    refreshes counts them only when due), and every full pass recounts all: the safety net for what
    moves with time alone (a drain that timed out before a restart)."""
    marks = _status_marks(ctx)  # kept once written: a failed write is tried again at the next pass
    if full or (refresh and marks != ctx.status.gpus_marks):
        await write_policy_statuses(ctx, now, count_gpus=True)
        ctx.status.marks = ctx.status.gpus_marks = marks
    elif marks != ctx.status.marks:
        await write_policy_statuses(ctx, now)
        ctx.status.marks = marks
    elif refresh:
        ctx.meters.carry_gpus(now)


def _status_marks(ctx: context.Context) -> tuple[object, ...]:
    """What moves when a policy's status or GPU gauges may have: recounting only then keeps a pass at
    rest from counting every selected node of every policy. Change counters of the cache and the
    verdicts; the rest are small collections (what waits for the budget, runs, is isolated), compared
    by value, so a swap of one entry for another is seen too."""
    return (
        ctx.cache.marks,
        ctx.verdicts.changes,
        frozenset(ctx.admission.notified),
        frozenset(ctx.steps.drain.tasks),
        tuple((name, result.completed) for name, result in ctx.steps.drain.results.items()),
        tuple(ctx.steps.isolated.items()),
        tuple(ctx.steps.isolate.support.items()),
        tuple(ctx.breakers.states.items()),
        tuple(ctx.breakers.acted.items()),
        tuple(ctx.steps.domain.states.items()),
    )


async def run(ctx: context.Context) -> None:
    """Tick forever; a failed tick is logged and the next one retries."""
    last_full = last_refresh = float("-inf")
    trimmer = heap.Trimmer()
    while True:
        started = asyncio.get_running_loop().time()
        full = started - last_full >= ctx.config.full_pass_seconds
        if full:
            last_full = started
        refresh = full or started - last_refresh >= REFRESH_SECONDS
        if refresh:
            last_refresh = started
        try:
            await tick(ctx, full=full, refresh=refresh)
            if refresh:
                trimmer.maybe(full=full)  # after a burst (the process grew), never at rest
        except reconciler.TRANSIENT_ERRORS as error:
            ctx.meters.reconcile_errors.labels("timer").inc()
            logger.warning("timer pass failed (will retry): %s", error)
        except Exception:
            ctx.meters.reconcile_errors.labels("timer").inc()
            logger.exception("timer pass failed (will retry)")
        elapsed = asyncio.get_running_loop().time() - started
        await asyncio.sleep(max(0.05, ctx.config.tick_seconds - elapsed))


def _troubles(node: str, verdict: model.NodeVerdict) -> list[tuple[str, str, str]]:
    """`node_unhealthy`'s series for one verdict: each true condition of a node not Healthy; an Unknown
    node's one reason (it judges nothing else)."""
    health = verdict.health
    if health is vocabulary.Health.HEALTHY:
        return []
    if health is vocabulary.Health.UNKNOWN:
        return [(node, verdicts.unknown_reason(verdict).value, health.value)]
    return [(node, issue.value, health.value) for issue in verdict.issues]


def policy_status(
    ctx: context.Context, name: str, now: datetime.datetime, *, count_gpus: bool = False
) -> dict[str, Any]:
    """The policy's status, its gauges set on the way; its GPUs counted when `count_gpus` or due."""
    previous = ctx.status.written.get(name) or {}
    error = ctx.cache.policy_errors.get(name)
    policy = ctx.cache.policies.get(name)
    counts = {"selectedNodes": 0, "unhealthyNodes": 0, "cordonedNodes": 0, "pendingNodes": 0}
    health_counts: collections.Counter[str] = collections.Counter()
    unknown_counts: collections.Counter[str] = collections.Counter()
    tally = gpu_meters.GPUTally()
    count_gpus = policy is not None and (count_gpus or ctx.meters.gpus_due(name, now))
    generation = 0
    drain_failed = 0
    retired = 0
    troubled: list[tuple[str, str, str]] = []  # (node, condition, health): node_unhealthy's series
    if policy is not None:
        generation = policy.generation
        for node in ctx.cache.selection(policy).selected:
            record = ctx.cache.node(node)
            if record is None:
                continue
            counts["selectedNodes"] += 1
            verdict = ctx.verdicts.get((name, record.view.name))
            if verdict is not None:
                health_counts[verdict.health.value] += 1
                if verdict.health is vocabulary.Health.UNHEALTHY:
                    counts["unhealthyNodes"] += 1
                elif verdict.health is vocabulary.Health.UNKNOWN:
                    unknown_counts[verdicts.unknown_reason(verdict).value] += 1
                troubled.extend(_troubles(record.view.name, verdict))
                if count_gpus:
                    _tally_gpus(ctx, tally, name, record, verdict)
            if record.view.unschedulable and record.view.cordoned_by == name:
                counts["cordonedNodes"] += 1
                if draining.timed_out(ctx, policy, record, now):
                    drain_failed += 1
            if ctx.admission.waiting(name, record.view.name):
                counts["pendingNodes"] += 1
            if record.view.labels.get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL:
                retired += 1
        for health in vocabulary.Health:
            ctx.meters.nodes.labels(name, health.value).set(health_counts[health.value])
        for reason in metric_labels.UNKNOWN_REASONS:
            ctx.meters.unknown_nodes.labels(name, reason).set(unknown_counts[reason])
        ctx.meters.budget_pending.labels(name).set(counts["pendingNodes"])
        ctx.meters.drain_failed_nodes.labels(name).set(drain_failed)
        ctx.meters.nodes_retired.labels(name).set(retired)
        ctx.meters.set_unhealthy_nodes(name, troubled)
        if count_gpus:
            ctx.meters.record_gpus(name, tally, now)
    if error is not None:
        generation = error[0]
        ready: dict[str, Any] = {
            "type": vocabulary.PolicyConditionType.READY.value,
            "status": "False",
            "reason": vocabulary.PolicyConditionReason.INVALID_SPEC.value,
            "message": error[1],
        }
    else:
        mode = (
            "dry run: decisions are recorded, no Node is changed" if policy and policy.dry_run else "acting"
        )
        ready = {
            "type": vocabulary.PolicyConditionType.READY.value,
            "status": "True",
            "reason": vocabulary.PolicyConditionReason.ACCEPTED.value,
            "message": f"Policy accepted ({mode}).",
        }
    written: list[dict[str, Any]] = previous.get("conditions") or []  # type: ignore[assignment]
    conditions = [ready]
    support = isolation_support.condition(ctx, policy) if policy is not None and error is None else None
    if support is not None:
        conditions.append(support)
        counts["isolatedGPUs"] = isolating.isolated_gpus(ctx, name)
        ctx.meters.isolated_gpus.labels(name).set(counts["isolatedGPUs"])
    elif policy is not None:
        ctx.meters.isolated_gpus.labels(name).set(0)
    permitted = repair_permission.condition(ctx, policy) if error is None else None
    if permitted is not None:
        conditions.append(permitted)
    for condition in conditions:
        before = next((c for c in written if c.get("type") == condition["type"]), {})
        same = before.get("status") == condition["status"] and before.get("lastTransitionTime")
        condition["lastTransitionTime"] = before["lastTransitionTime"] if same else times.render(now)
        condition["observedGeneration"] = generation
    if policy is not None and not policy.dry_run:  # the breaker keeps its own transition times
        conditions.append({**ctx.breakers.condition(name, now), "observedGeneration": generation})
    return {
        "observedGeneration": generation,
        **counts,
        **ctx.breakers.status(name),
        **domain_actions.status(ctx, name),
        "conditions": conditions,
    }


def _tally_gpus(
    ctx: context.Context,
    tally: gpu_meters.GPUTally,
    policy: str,
    record: cache.NodeRecord,
    verdict: model.NodeVerdict,
) -> None:
    """Count a judged node's GPUs under its model: healthy and in service, or out of service and why."""
    gpunode = ctx.cache.gpunode(record.view.name)
    reported, name = cache.gpu_count_and_model(gpunode.status if gpunode is not None else {})
    view = record.view
    count = reported if reported is not None else view.gpu_capacity or 0
    reason: str | None = None
    if view.unschedulable and view.cordoned_by == policy:
        reason = "cordoned"
    elif keys.UNHEALTHY_TAINT in view.taint_keys and verdict.wanted_taint is not None:
        reason = "isolated"
    elif verdict.health is vocabulary.Health.UNKNOWN:
        reason = "unknown"
    healthy = verdict.health is vocabulary.Health.HEALTHY
    model_name = str(name or metric_labels.UNKNOWN_MODEL)
    isolated = ctx.steps.isolated.get((policy, view.name))
    if reason is None and isolated is not None and isolated.in_place:
        # IsolateGPU: the GPUs under a DeviceTaintRule are out, the node's others stay in service.
        gone = min(len(isolated.in_place), count)
        tally.add(model_name, gone, healthy=False, out_reason="isolated")
        count -= gone
    tally.add(model_name, count, healthy=healthy, out_reason=reason)


def _without_times(status_: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status_.get("conditions", [])
    ]
    return {**status_, "conditions": conditions}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _without_times(a) == _without_times(b)


async def write_policy_statuses(
    ctx: context.Context, now: datetime.datetime, *, count_gpus: bool = False
) -> None:
    for name in sorted(set(ctx.cache.policies) | set(ctx.cache.policy_errors)):
        desired = policy_status(ctx, name, now, count_gpus=count_gpus)
        previous = ctx.status.written.get(name)
        if previous is not None and _same(previous, desired):
            continue
        try:
            await status.apply_policy(ctx.client, name, desired)
        except kube.ApiError as error:
            if not error.not_found:
                raise
            continue  # deleted meanwhile: its DELETED event (or the resync) forgets it; the others go on
        ctx.status.written[name] = desired
