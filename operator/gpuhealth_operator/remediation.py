"""Carrying out one policy's verdict on one Node: labels, taint, budgeted cordon, drain, uncordon.

The verdict says what the node deserves; this module makes the Node match it
with minimal patches, and returns the `status.action` that describes where
the node now stands. The disruption budget is asked through `admission`,
which holds an admitted node "in flight" until its cordon is in the cache, so
concurrent reconciles can never admit more than maxUnavailable.

A Node deleted while it is being reconciled leaves nothing to do: every
look-up after an `await` may find it gone (None), and the pass then stops.

Dry-run policies come here too: they compute the same changes, say them in
a `DryRun` Event, and change nothing.
"""

from __future__ import annotations

import datetime
import enum
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator import (
    announcements,
    cache,
    context,
    draining,
    isolating,
    judging,
    kube,
    node_changes,
    overrides,
    repairing,
    stopping,
)
from gpuhealth_operator.actions import events, nodes
from gpuhealth_operator.decisions import model, times, verdicts

logger = logging.getLogger(__name__)

Action = vocabulary.Action
NodeAction = vocabulary.NodeAction

LESSER_ACTIONS: dict[Action | None, NodeAction] = {
    None: NodeAction.NONE,
    Action.EVENT: NodeAction.EVENT,
    Action.LABEL: NodeAction.LABELED,
    Action.TAINT: NodeAction.TAINTED,
}


def _issues(verdict: model.NodeVerdict) -> str:
    return ", ".join(verdict.issues) or "no issues"


def _reason(verdict: model.NodeVerdict) -> str:
    return verdict.issues[0].value if verdict.issues else "None"


def _observe_latency(
    ctx: context.Context, verdict: model.NodeVerdict, action: str, now: datetime.datetime
) -> None:
    if verdict.detected_at is not None:
        latency = max(0.0, times.seconds_between(verdict.detected_at, datetime.datetime.now(datetime.UTC)))
        ctx.meters.detection_to_action.labels(action, _reason(verdict)).observe(latency)
    ctx.meters.actions.labels(action, _reason(verdict)).inc()


async def _refresh(ctx: context.Context, name: str) -> cache.NodeRecord | None:
    return ctx.cache.refresh_node(await ctx.client.get(nodes.node_path(name)))


class Patched(enum.Enum):
    WRITTEN = "written"
    SETTLED = "settled"
    """Nothing to write: the cached Node already is as wanted."""
    GONE = "gone"
    CONFLICTED = "conflicted"
    """Every attempt met a newer Node."""


async def _patch_with_retries(
    ctx: context.Context,
    name: str,
    settled: Callable[[cache.NodeRecord], bool],
    patch: Callable[[cache.NodeRecord], Awaitable[kube.JsonObject]],
    attempts: int = 3,
) -> Patched:
    """Patch the Node computed from its cached record (with its resourceVersion); on 409 re-read and retry."""
    for _attempt in range(attempts):
        record = ctx.cache.node(name)
        if record is None:
            return Patched.GONE
        if settled(record):
            return Patched.SETTLED
        try:
            body = await patch(record)
        except kube.ApiError as error:
            if not error.conflict:
                raise
            await _refresh(ctx, name)
            continue
        return Patched.WRITTEN if ctx.cache.refresh_node(body) is not None else Patched.GONE
    return Patched.CONFLICTED


async def remediate(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    """Make the Node match the verdict under `policy`; the resulting GPUNode `status.action`."""
    if policy.dry_run:
        return await _dry_run(ctx, policy, name, verdict)
    await isolating.isolate(ctx, policy, name, verdict, now)
    # What the node's GPUs are now decided to be (isolated GPUs: off the node ladder) is judged in.
    judged = judging.verdict_now(ctx, policy, name, now)
    if judged is None:
        return NodeAction.NONE  # gone meanwhile: nothing left to do
    # Capacity first: a cordon is the latency-critical write (it carries the label and taint changes).
    action = await _capacity(ctx, policy, name, judged, now)
    await _labels(ctx, name, judged, now)
    await _taint(ctx, name, judged, now)
    return isolating.node_action(ctx, policy.name, name, action)


async def _labels(
    ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    record = ctx.cache.node(name)
    changes = node_changes.label_changes(record, verdict) if record is not None else {}
    if not changes:
        return
    ctx.cache.refresh_node(await nodes.patch_metadata(ctx.client, name, labels=changes))
    if any(v == "true" for k, v in changes.items() if k != keys.HEALTH_LABEL):
        _observe_latency(ctx, verdict, Action.LABEL.value, now)


async def _taint(ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime) -> None:
    def patch(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        return nodes.set_taint(
            ctx.client,
            name,
            taints=[dict(t) for t in record.taints],
            value=verdict.wanted_taint,
            resource_version=record.resource_version,
        )

    patched = await _patch_with_retries(
        ctx, name, lambda record: node_changes.our_taint(record) == verdict.wanted_taint, patch
    )
    if patched is Patched.WRITTEN and verdict.wanted_taint is not None:
        _observe_latency(ctx, verdict, Action.TAINT.value, now)


async def _capacity(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    _settle_unknown_cordon(ctx, policy, name)
    await stopping.adopt(ctx, policy.name, name)  # a cordon left by a deleted policy becomes ours
    # A human uncordon first: it drops our claim (and budget place) before anything is decided.
    await overrides.react(ctx, policy, name, verdict, now)
    await draining.forget(ctx, name)
    await overrides.expire(ctx, name, verdict)
    # The Node as these steps left it (an override just recorded withdraws a Cordon/Drain) is judged in.
    judged = judging.verdict_now(ctx, policy, name, now)
    if judged is None:
        return NodeAction.NONE  # gone meanwhile: nothing left to do
    verdict = judged
    # A repair in progress owns the node until it returns it, retires it, or is cancelled; a retired
    # node stays cordoned until a human returns it (no request unless the Node carries either).
    handled = await repairing.take(ctx, policy, name, verdict, now)
    if handled is not None:
        if handled.returned and await _uncordon(ctx, policy, name, verdict, validated=True):
            return LESSER_ACTIONS.get(verdict.wanted_action, NodeAction.NONE)
        return handled.action
    record = ctx.cache.node(name)
    if record is None:
        return NodeAction.NONE  # gone: nothing left to do
    wanted = verdict.wanted_action
    if wanted in vocabulary.DISRUPTIVE_ACTIONS:
        if not record.view.unschedulable and not await _cordon(ctx, policy, name, verdict, now):
            await _budget_exceeded(ctx, policy, name, verdict)
            return NodeAction.PENDING
        ctx.admission.stop_waiting(policy.name, name)
        record = ctx.cache.node(name)
        if record is None:
            return NodeAction.NONE
        await announcements.cordoned(ctx, policy.name, name, _issues(verdict), wanted is Action.DRAIN)
        if wanted is Action.CORDON or record.view.cordoned_by is None:
            return NodeAction.CORDONED  # cordoned by someone else: theirs to drain and lift, never ours
        drained = await draining.advance(ctx, policy, name, now)
        if drained is NodeAction.DRAINED and policy.repair is not None:
            return await repairing.begin(ctx, policy, name, verdict, now)  # a repair cycle, or it waits
        return drained

    ctx.admission.stop_waiting(policy.name, name)
    if record.view.unschedulable and record.view.cordoned_by == policy.name:
        await announcements.cordoned(ctx, policy.name, name, _issues(verdict), wanted is Action.DRAIN)
        if verdicts.may_uncordon(policy, record.view, verdict):
            await _uncordon(ctx, policy, name, verdict)
            return LESSER_ACTIONS.get(wanted, NodeAction.NONE)
        return draining.shown(ctx, name)
    if verdict.overridden:
        return NodeAction.OVERRIDDEN  # a human said no to this evidence
    return LESSER_ACTIONS.get(wanted, NodeAction.NONE)


async def _budget_exceeded(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> None:
    """Say once per wait that the node waits for the budget."""
    if not ctx.admission.start_waiting(policy.name, name):
        return
    why = ctx.admission.wait_reason(policy, name, ctx.cache, ctx.verdicts.wanting)
    wanted = verdict.wanted_action.value.lower() if verdict.wanted_action else "act on"
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.BUDGET_EXCEEDED,
        f"Policy {policy.name} wants to {wanted} the node ({_issues(verdict)}) but {why}; "
        "waiting for the budget.",
        events.WARNING,
    )


async def _cordon(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> bool:
    """Cordon within the budget; False when the budget says wait (True too when the Node is gone)."""
    for lost in list(ctx.cordons_unknown):  # almost always none: places the cluster has settled since
        _settle_unknown_cordon(ctx, policy, lost)
    if not await ctx.admission.admit(policy, name, ctx.cache, ctx.verdicts.wanting, now):
        return False

    tainted = False
    sent_from: str | None = None

    def patch(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        nonlocal tainted, sent_from
        sent_from = record.resource_version
        # The verdict's taint rides along when a rule asks for one (a second request saved per cordon).
        tainted = node_changes.our_taint(record) != verdict.wanted_taint
        return nodes.cordon(
            ctx.client,
            name,
            policy=policy.name,
            resource_version=record.resource_version,
            cordoned_at=times.render(now),
            drain_started=times.render(now) if verdict.wanted_action is Action.DRAIN else None,
            labels=node_changes.label_changes(record, verdict),
            taints=nodes.with_taint(record.taints, verdict.wanted_taint) if tainted else None,
        )

    try:
        # Someone else cordoned it meanwhile (settled): not ours to claim.
        patched = await _patch_with_retries(ctx, name, lambda record: record.view.unschedulable, patch)
    except BaseException as error:
        if sent_from is not None and outcome_unknown(error):
            # It may have landed: the node keeps its place (in flight) until the cluster says.
            ctx.cordons_unknown[name] = sent_from
        else:
            _cordon_settled(ctx, policy, name)
        raise
    _cordon_settled(ctx, policy, name)
    if patched is Patched.WRITTEN:
        _observe_latency(ctx, verdict, Action.CORDON.value, now)
        if tainted and verdict.wanted_taint is not None:
            _observe_latency(ctx, verdict, Action.TAINT.value, now)
    return patched is not Patched.CONFLICTED  # the caller announces it


def outcome_unknown(error: BaseException) -> bool:
    """Whether a write that failed with `error` may still have been applied (or be applied yet).

    A 4xx answer (but 408) says the API server refused the write, NotLeading that it was
    never sent, a refused connection that it never left; a 5xx (a 504 from the API server's
    own timeout, a proxy's 502), a timeout, a broken connection or a cancellation say nothing.
    """
    if isinstance(error, kube.ApiError):
        return error.status >= 500 or error.status == 408
    return not isinstance(error, aiohttp.ClientConnectorError)


def _cordon_settled(ctx: context.Context, policy: model.Policy, name: str) -> None:
    """The cordon's outcome is known (in the cache, or refused): its node is no longer in flight."""
    ctx.cordons_unknown.pop(name, None)
    ctx.admission.release(policy, name)


def _settle_unknown_cordon(ctx: context.Context, policy: model.Policy, name: str) -> None:
    """A cordon whose answer was lost holds its place until a newer Node version than the one it was
    computed from is seen: its resourceVersion precondition means it cannot land after that, so that
    version (cordoned, or not) is the truth the budget counts from then on."""
    sent_from = ctx.cordons_unknown.get(name)
    if sent_from is None:
        return
    record = ctx.cache.node(name)
    if record is None or record.resource_version != sent_from:
        _cordon_settled(ctx, policy, name)


async def _uncordon(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    *,
    validated: bool = False,
) -> bool:
    """Lift our cordon: only from a version of the Node that shows it ours, and only if still that version.

    `validated`: a repair's validation passed (`repairing`): no healthyForSeconds wait
    (`verdicts.may_return_validated`), every other condition the same. True when uncordoned.
    """
    allowed = verdicts.may_return_validated if validated else verdicts.may_uncordon
    body: kube.JsonObject | None = None
    for _attempt in range(3):
        record = ctx.cache.node(name)
        if (
            record is None
            or not record.view.unschedulable
            or not allowed(policy, record.view, verdict)  # ours, selected (not excluded)
            or record.cordon_taken_over  # a human cordoned it again: theirs (`overrides.react` says so)
        ):
            return False
        try:
            body = await nodes.uncordon(
                ctx.client, name, policy=policy.name, resource_version=record.resource_version
            )
            break
        except kube.ApiError as error:
            if error.status not in (409, 422):
                raise
            await _refresh(ctx, name)  # changed under us: judged again from the version now stored
    if body is None:
        return False
    record = ctx.cache.refresh_node(body)
    bookkeeping = (nodes.DRAIN_STARTED_ANNOTATION, nodes.CORDONED_AT_ANNOTATION, keys.REPAIR_ANNOTATION)
    if record is not None and any(key in record.view.annotations for key in bookkeeping):
        ctx.cache.refresh_node(
            await nodes.patch_metadata(ctx.client, name, annotations=dict.fromkeys(bookkeeping))
        )
    await draining.NodeDrain(ctx, policy, name).undo()
    ctx.meters.actions.labels("Uncordon", "Validated" if validated else "Recovered").inc()
    why = (
        "repaired and validated (spec.repair)"
        if validated
        else f"healthy for {policy.recovery_healthy_for_seconds:g}s"
    )
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.NODE_UNCORDONED,
        f"Node uncordoned by policy {policy.name}: {why}.",
    )
    return True


async def _dry_run(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> NodeAction:
    key = (policy.name, name)
    record = ctx.cache.node(name)
    if record is None:
        return NodeAction.NONE  # gone: nothing to say
    planned = await isolating.plan(ctx, policy, record, verdict)
    verdict, changes = planned.verdict, planned.changes
    disruptive = verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS
    if changes and (disruptive or verdict.issues or planned.isolating):
        message = f"Dry run: policy {policy.name} would {', '.join(changes)} ({_issues(verdict)})."
        message += planned.ladder_note
        if disruptive:
            message += repairing.dry_run_note(ctx, policy, name, verdict)
        if ctx.dry_run_said.get(key) != message:
            ctx.dry_run_said[key] = message
            ctx.meters.actions.labels(vocabulary.NodeAction.DRY_RUN.value, _reason(verdict)).inc()
            await ctx.recorder.emit(events.subject(ctx.cache, name), vocabulary.EventReason.DRY_RUN, message)
    elif not changes:
        ctx.dry_run_said.pop(key, None)
    return NodeAction.DRY_RUN if verdict.wanted_action is not None else NodeAction.NONE
