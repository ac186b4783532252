"""Carrying out one policy's verdict on one Node: labels, taint, budgeted cordon, drain, uncordon.

The verdict says what the node deserves; this module makes the Node match it
with minimal patches, and returns the `status.action` that describes where
the node now stands. The disruption budget is decided under the policy's
lock, and a node admitted by it is held "in flight" until its cordon is in
the cache, so concurrent reconciles can never admit more than maxUnavailable.

Dry-run policies come here too: they compute the same changes, say them in
a `DryRun` Event, and change nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator import cache, context, kube
from gpuhealth_operator.actions import drain, events, nodes
from gpuhealth_operator.decisions import budget, model, policies, times, verdicts

logger = logging.getLogger(__name__)

Action = vocabulary.Action
NodeAction = vocabulary.NodeAction

LESSER_ACTIONS: dict[Action | None, NodeAction] = {
    None: NodeAction.NONE,
    Action.EVENT: NodeAction.EVENT,
    Action.LABEL: NodeAction.LABELED,
    Action.TAINT: NodeAction.TAINTED,
}


def _subject(ctx: context.Context, name: str) -> events.Subject:
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    return events.Subject(
        node=name, node_uid=record.uid if record else None, gpunode_uid=gpunode.uid if gpunode else None
    )


def _issues(verdict: model.NodeVerdict) -> str:
    return ", ".join(verdict.issues) or "no issues"


def _reason(verdict: model.NodeVerdict) -> str:
    return verdict.issues[0].value if verdict.issues else "None"


def label_changes(record: cache.NodeRecord, verdict: model.NodeVerdict) -> dict[str, str | None]:
    labels = record.view.labels
    return {k: v for k, v in verdict.wanted_labels.items() if labels.get(k) != v}


def our_taint(record: cache.NodeRecord) -> str | None:
    for taint in record.taints:
        if taint.get("key") == keys.UNHEALTHY_TAINT:
            return str(taint.get("value") or "")
    return None


def _observe_latency(
    ctx: context.Context, verdict: model.NodeVerdict, action: str, now: datetime.datetime
) -> None:
    if verdict.detected_at is not None:
        latency = max(0.0, times.seconds_between(verdict.detected_at, datetime.datetime.now(datetime.UTC)))
        ctx.meters.detection_to_action.labels(action).observe(latency)
    ctx.meters.actions.labels(action, _reason(verdict)).inc()


async def _refresh(ctx: context.Context, name: str) -> cache.NodeRecord:
    return ctx.cache.put_node(await ctx.client.get(nodes.node_path(name)))


async def remediate(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    """Make the Node match the verdict under `policy`; the resulting GPUNode `status.action`."""
    if policy.dry_run:
        return await _dry_run(ctx, policy, name, verdict)
    # Capacity first: a cordon is the latency-critical write (it carries the label changes with it).
    action = await _capacity(ctx, policy, name, verdict, now)
    await _labels(ctx, name, verdict, now)
    await _taint(ctx, name, verdict, now)
    return action


async def _labels(
    ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    changes = label_changes(ctx.cache.nodes[name], verdict)
    if not changes:
        return
    ctx.cache.put_node(await nodes.patch_metadata(ctx.client, name, labels=changes))
    if any(v == "true" for k, v in changes.items() if k != keys.HEALTH_LABEL):
        _observe_latency(ctx, verdict, Action.LABEL.value, now)


async def _taint(ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime) -> None:
    for _attempt in range(3):
        record = ctx.cache.nodes[name]
        if our_taint(record) == verdict.wanted_taint:
            return
        try:
            body = await nodes.set_taint(
                ctx.client,
                name,
                taints=[dict(t) for t in record.taints],
                value=verdict.wanted_taint,
                resource_version=record.resource_version,
            )
        except kube.ApiError as error:
            if not error.conflict:
                raise
            await _refresh(ctx, name)
            continue
        ctx.cache.put_node(body)
        if verdict.wanted_taint is not None:
            _observe_latency(ctx, verdict, Action.TAINT.value, now)
        return


async def _admit(ctx: context.Context, policy: model.Policy, name: str) -> bool:
    """Ask the budget; if admitted, the node is in flight until its cordon is in the cache."""
    async with ctx.policy_locks[policy.name]:
        selection = ctx.cache.selection(policy)
        wanting = ctx.verdicts.wanting[policy.name]
        if budget.admits(policy, name, selection.selected, _holders(ctx, policy, selection), wanting):
            ctx.in_flight[policy.name].add(name)
            return True
        return False


def _holders(ctx: context.Context, policy: model.Policy, selection: cache.Selection) -> set[str]:
    """Selected nodes that take up the policy's budget, those admitted but not yet seen cordoned included."""
    return selection.unavailable | (ctx.in_flight[policy.name] & selection.selected)


async def _capacity(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    record = ctx.cache.nodes[name]
    wanted = verdict.wanted_action
    key = (policy.name, name)
    if wanted in vocabulary.DISRUPTIVE_ACTIONS:
        if not record.view.unschedulable and not await _cordon(ctx, policy, name, verdict, now):
            await _budget_exceeded(ctx, policy, name, verdict)
            return NodeAction.PENDING
        ctx.budget_notified.discard(key)
        if wanted is Action.CORDON:
            return NodeAction.CORDONED
        return await _drain(ctx, policy, name, now)

    ctx.budget_notified.discard(key)
    if record.view.unschedulable and record.view.cordoned_by == policy.name:
        if verdicts.may_uncordon(policy, record.view, verdict):
            await _uncordon(ctx, policy, name, verdict)
            return LESSER_ACTIONS.get(wanted, NodeAction.NONE)
        result = ctx.drain_results.get(name)
        if name in ctx.drains and not ctx.drains[name].done():
            return NodeAction.DRAINING
        if (result is not None and result.completed) or _status_action(ctx, name) == NodeAction.DRAINED:
            return NodeAction.DRAINED
        return NodeAction.CORDONED
    return LESSER_ACTIONS.get(wanted, NodeAction.NONE)


async def _budget_exceeded(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> None:
    """Say once per wait that the node waits for the budget."""
    key = (policy.name, name)
    if key in ctx.budget_notified:
        return
    ctx.budget_notified.add(key)
    selection = ctx.cache.selection(policy)
    limit = policies.resolve_max_unavailable(policy, len(selection.selected))
    holders = sorted(_holders(ctx, policy, selection))
    wanted = verdict.wanted_action.value.lower() if verdict.wanted_action else "act on"
    if len(holders) >= limit:
        views = [ctx.cache.nodes[n].view for n in holders if n in ctx.cache.nodes]
        why = (
            f"{len(holders)} of its {len(selection.selected)} selected nodes are already unschedulable "
            f"(maxUnavailable={limit}): {budget.holders_text(policy, views)}"
        )
    else:
        free = limit - len(holders)
        why = f"the {free} free place(s) under maxUnavailable={limit} go to worse or older faults first"
    await ctx.recorder.emit(
        _subject(ctx, name),
        vocabulary.EventReason.BUDGET_EXCEEDED,
        f"Policy {policy.name} wants to {wanted} the node ({_issues(verdict)}) but {why}; "
        "waiting for the budget.",
        events.WARNING,
    )


def _status_action(ctx: context.Context, name: str) -> str | None:
    gpunode = ctx.cache.gpunodes.get(name)
    return gpunode.status.get("action") if gpunode else None


async def _cordon(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> bool:
    """Cordon within the budget; False when the budget says wait."""
    if not await _admit(ctx, policy, name):
        return False
    try:
        for _attempt in range(3):
            record = ctx.cache.nodes[name]
            if record.view.unschedulable:
                return True  # someone cordoned it meanwhile: not ours to claim
            started = times.render(now) if verdict.wanted_action is Action.DRAIN else None
            try:
                body = await nodes.cordon(
                    ctx.client,
                    name,
                    policy=policy.name,
                    resource_version=record.resource_version,
                    drain_started=started,
                    labels=label_changes(record, verdict),
                )
            except kube.ApiError as error:
                if not error.conflict:
                    raise
                await _refresh(ctx, name)
                continue
            ctx.cache.put_node(body)
            _observe_latency(ctx, verdict, Action.CORDON.value, now)
            what = "cordoned and will be drained" if verdict.wanted_action is Action.DRAIN else "cordoned"
            await ctx.recorder.emit(
                _subject(ctx, name),
                vocabulary.EventReason.NODE_CORDONED,
                f"Node {what} by policy {policy.name}: {_issues(verdict)}.",
                events.WARNING,
            )
            return True
        return False
    finally:
        ctx.in_flight[policy.name].discard(name)


async def _drain(ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime) -> NodeAction:
    task = ctx.drains.get(name)
    if task is not None and not task.done():
        return NodeAction.DRAINING
    result = ctx.drain_results.get(name)
    if result is not None:
        return NodeAction.DRAINED if result.completed else NodeAction.CORDONED
    record = ctx.cache.nodes[name]
    started = times.parse(record.view.annotations.get(nodes.DRAIN_STARTED_ANNOTATION))
    previous_action = _status_action(ctx, name)
    if started is not None and previous_action == NodeAction.DRAINED:
        return NodeAction.DRAINED  # drained before a restart; nothing left to do
    if started is None:
        started = now
        ctx.cache.put_node(await nodes.set_drain_started(ctx.client, name, times.render(now)))
    deadline = started + datetime.timedelta(seconds=policy.drain_timeout_seconds)
    if deadline <= now and previous_action == NodeAction.CORDONED:
        return NodeAction.CORDONED  # this drain already failed (DrainFailed was said); a human takes over
    ctx.drains[name] = asyncio.create_task(
        _run_drain(ctx, policy, name, started, deadline), name=f"drain-{name}"
    )
    return NodeAction.DRAINING


async def _run_drain(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    started: datetime.datetime,
    deadline: datetime.datetime,
) -> drain.Result:
    options = drain.Options(
        grace_period_seconds=policy.drain_grace_period_seconds,
        delete_empty_dir_data=policy.drain_delete_empty_dir_data,
        force=policy.drain_force,
        exclude_namespaces=policy.drain_exclude_namespaces,
        backoff_initial_seconds=ctx.config.eviction_backoff_initial_seconds,
        backoff_max_seconds=ctx.config.eviction_backoff_max_seconds,
    )
    try:
        result = await drain.drain(
            ctx.client,
            name,
            options=options,
            deadline=deadline,
            semaphore=ctx.eviction_slots,
            on_eviction=lambda outcome: ctx.meters.evictions.labels(outcome).inc(),
        )
    except Exception:
        logger.exception("drain of node %s crashed; the next reconcile retries it", name)
        raise
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    subject = _subject(ctx, name)
    if result.completed:
        ctx.meters.drain_duration.labels("completed").observe(elapsed)
        await ctx.recorder.emit(
            subject, vocabulary.EventReason.NODE_DRAINED, drain.drained_message(policy.name, result)
        )
    else:
        ctx.meters.drain_duration.labels("failed").observe(elapsed)
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.DRAIN_FAILED,
            drain.failed_message(policy.name, policy.drain_timeout_seconds, result),
            events.WARNING,
        )
    ctx.drain_results[name] = result
    return result


async def _uncordon(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> None:
    try:
        body = await nodes.uncordon(ctx.client, name, policy=policy.name)
    except kube.ApiError as error:
        if error.status not in (409, 422):
            raise
        await _refresh(ctx, name)  # the annotation changed under us: it is no longer ours to lift
        return
    ctx.cache.put_node(body)
    if nodes.DRAIN_STARTED_ANNOTATION in ctx.cache.nodes[name].view.annotations:
        ctx.cache.put_node(await nodes.set_drain_started(ctx.client, name, None))
    task = ctx.drains.pop(name, None)
    if task is not None:
        task.cancel()
    ctx.drain_results.pop(name, None)
    ctx.meters.actions.labels("Uncordon", "Recovered").inc()
    await ctx.recorder.emit(
        _subject(ctx, name),
        vocabulary.EventReason.NODE_UNCORDONED,
        f"Node uncordoned by policy {policy.name}: healthy for {policy.recovery_healthy_for_seconds:g}s.",
    )


def dry_run_changes(record: cache.NodeRecord, policy: model.Policy, verdict: model.NodeVerdict) -> list[str]:
    """What a non-dry-run policy would change on the Node now, in words."""
    changes = []
    for key, value in sorted(label_changes(record, verdict).items()):
        changes.append(f"remove label {key}" if value is None else f"label {key}={value}")
    if our_taint(record) != verdict.wanted_taint:
        changes.append(
            "remove taint " + keys.UNHEALTHY_TAINT
            if verdict.wanted_taint is None
            else f"taint {keys.UNHEALTHY_TAINT}={verdict.wanted_taint}:{nodes.TAINT_EFFECT}"
        )
    if verdict.wanted_action is Action.DRAIN and not record.view.unschedulable:
        changes.append("cordon and drain")
    elif verdict.wanted_action is Action.CORDON and not record.view.unschedulable:
        changes.append("cordon")
    elif record.view.cordoned_by == policy.name and verdicts.may_uncordon(policy, record.view, verdict):
        changes.append("uncordon")
    return changes


async def _dry_run(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> NodeAction:
    key = (policy.name, name)
    changes = dry_run_changes(ctx.cache.nodes[name], policy, verdict)
    disruptive = verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS
    if changes and (disruptive or verdict.issues):
        message = f"Dry run: policy {policy.name} would {', '.join(changes)} ({_issues(verdict)})."
        if ctx.dry_run_said.get(key) != message:
            ctx.dry_run_said[key] = message
            ctx.meters.actions.labels(vocabulary.NodeAction.DRY_RUN.value, _reason(verdict)).inc()
            await ctx.recorder.emit(_subject(ctx, name), vocabulary.EventReason.DRY_RUN, message)
    elif not changes:
        ctx.dry_run_said.pop(key, None)
    return NodeAction.DRY_RUN if verdict.wanted_action is not None else NodeAction.NONE
