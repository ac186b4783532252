"""The node ladder's cordon: within the disruption budget, its outcome known or held, lifted only if ours.

`cordon` asks the budget (`admission`, which holds an admitted node "in
flight" until its cordon is in the cache, so concurrent reconciles never admit
more than maxUnavailable) and cordons from the cached Node's version. A cordon
whose answer was lost (`outcome_unknown`) keeps its place until a newer Node
version says whether it landed (`settle_unknown`). `uncordon` lifts only our
cordon, only from a version of the Node that shows it ours, removes our
bookkeeping annotations and undoes the drain. `budget_exceeded` says once per
wait that a node waits for the budget.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import TypeGuard

import aiohttp

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube, nodes
from gpuhealth_operator.decisions import model, times, verdicts
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache
from gpuhealth_operator.verdict import node_changes

Action = vocabulary.Action


async def budget_exceeded(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> None:
    """Say once per wait that the node waits for the budget."""
    if not ctx.admission.start_waiting(policy.name, name):
        return
    if _pending_as_stored(ctx, policy.name, name):
        return  # said by an earlier process (a restart, a leader change), which recorded the wait
    why = ctx.admission.wait_reason(policy, name, ctx.cache, ctx.verdicts.wanting)
    wanted = verdict.wanted_action.value.lower() if verdict.wanted_action else "act on"
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.BUDGET_EXCEEDED,
        f"Policy {policy.name} wants to {wanted} the node ({node_patches.issues_text(verdict)}) but {why}; "
        "waiting for the budget.",
        events.WARNING,
    )


def _pending_as_stored(ctx: context.Context, policy: str, name: str) -> bool:
    """Whether the GPUNode status as stored says the policy's action on the node is Pending: the wait
    is said before the status that records it is written, so a wait this process first meets with its
    status already Pending was said (by this policy's entry in `status.policies` where several policies
    select the node, else by `status.action`). Not where GPUs wait to be isolated (also Pending)."""
    gpunode = ctx.cache.gpunodes.get(name)
    isolation = ctx.steps.isolate.isolations.get((policy, name))
    if gpunode is None or (isolation is not None and isolation.decision is not None):
        return False  # GPUs of the node wait for isolation, or were judged for it: Pending may be theirs
    stored = gpunode.status
    pending = vocabulary.NodeAction.PENDING.value
    entries = stored.get("policies")
    if isinstance(entries, list):
        return any(
            isinstance(e, dict) and e.get("policy") == policy and e.get("action") == pending for e in entries
        )
    return stored.get("action") == pending


async def cordon(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> bool:
    """Cordon within the budget; False when the budget says wait (True too when the Node is gone)."""
    for lost in list(ctx.steps.cordon.unknown):  # almost always none: places the cluster has settled since
        settle_unknown(ctx, policy, lost)
    if not await ctx.admission.admit(policy, name, ctx.cache, ctx.verdicts.wanting, now):
        return False

    tainted = False
    sent_from: str | None = None

    def patch(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        nonlocal tainted, sent_from
        sent_from = record.resource_version
        labels, taint = node_changes.marks(record, verdict)
        # The verdict's taint rides along when a rule asks for one (a second request saved per cordon).
        tainted = taint != verdict.wanted_taint
        return nodes.cordon(
            ctx.client,
            name,
            policy=policy.name,
            resource_version=record.resource_version,
            cordoned_at=times.render(now),
            drain_started=times.render(now) if verdict.wanted_action is Action.DRAIN else None,
            labels=labels,
            taints=nodes.with_taint(record.taints, verdict.wanted_taint) if tainted else None,
        )

    try:
        # Someone else cordoned it meanwhile (settled): not ours to claim.
        patched = await node_patches.patch_with_retries(ctx, name, node_patches.unschedulable, patch)
    except BaseException as error:
        if sent_from is not None and outcome_unknown(error):
            # It may have landed: the node keeps its place (in flight) until the cluster says.
            ctx.steps.cordon.unknown[name] = sent_from
        else:
            _settled(ctx, policy, name)
        raise
    _settled(ctx, policy, name)
    if patched is node_patches.Patched.WRITTEN:
        node_patches.observe_latency(ctx, verdict, Action.CORDON.value, now)
        if tainted and verdict.wanted_taint is not None:
            node_patches.observe_latency(ctx, verdict, Action.TAINT.value, now)
    return patched is not node_patches.Patched.CONFLICTED  # the caller announces it


def outcome_unknown(error: BaseException) -> bool:
    """Whether a write that failed with `error` may still have been applied (or be applied yet).

    A 4xx answer (but 408) says the API server refused the write, NotLeading that it was
    never sent, a refused connection that it never left; a 5xx (a 504 from the API server's
    own timeout, a proxy's 502), a timeout, a broken connection or a cancellation say nothing.
    """
    if isinstance(error, kube.ApiError):
        return error.status >= 500 or error.status == 408
    return not isinstance(error, aiohttp.ClientConnectorError)


def _settled(ctx: context.Context, policy: model.Policy, name: str) -> None:
    """The cordon's outcome is known (in the cache, or refused): its node is no longer in flight."""
    ctx.steps.cordon.unknown.pop(name, None)
    ctx.admission.release(policy, name)


def settle_unknown(ctx: context.Context, policy: model.Policy, name: str) -> None:
    """A cordon whose answer was lost holds its place until a newer Node version than the one it was
    computed from is seen: its resourceVersion precondition means it cannot land after that, so that
    version (cordoned, or not) is the truth the budget counts from then on."""
    sent_from = ctx.steps.cordon.unknown.get(name)
    if sent_from is None:
        return
    record = ctx.cache.nodes.get(name)
    if record is None or record.resource_version != sent_from:
        _settled(ctx, policy, name)


async def uncordon(
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

    def liftable(record: cache.NodeRecord | None) -> TypeGuard[cache.NodeRecord]:
        return (
            record is not None
            and record.view.unschedulable
            and allowed(policy, record.view, verdict)  # ours, selected (not excluded)
            and not record.cordon_taken_over  # a human cordoned it again: theirs (`overrides.react` says so)
        )

    if not liftable(ctx.cache.nodes.get(name)):
        return False
    await draining.say_done(ctx, policy, name)  # the drain's Event goes before its cordon
    body: kube.JsonObject | None = None
    for _attempt in range(3):
        record = ctx.cache.nodes.get(name)
        if not liftable(record):
            return False
        try:
            body = await nodes.uncordon(
                ctx.client, name, policy=policy.name, resource_version=record.resource_version
            )
            break
        except kube.ApiError as error:
            if error.status not in (409, 422):
                raise
            # Changed under us: judged again from the version now stored.
            await node_patches.refresh(ctx, name)
    if body is None:
        return False
    record = ctx.cache.refresh_node(body)
    bookkeeping = (
        nodes.DRAIN_STARTED_ANNOTATION,
        nodes.CORDONED_AT_ANNOTATION,
        keys.REPAIR_ANNOTATION,
        keys.REPAIR_WAITING_ANNOTATION,
    )
    repair_label = {keys.REPAIR_NODE_UID_LABEL: None}  # the label a repair's Jobs select goes with its state
    if record is not None and (
        any(key in record.view.annotations for key in bookkeeping)
        or keys.REPAIR_NODE_UID_LABEL in record.view.labels
    ):
        ctx.cache.refresh_node(
            await nodes.patch_metadata(
                ctx.client, name, annotations=dict.fromkeys(bookkeeping), labels=repair_label
            )
        )
    await draining.NodeDrain(ctx, policy, name).undo()
    ctx.meters.actions.labels("Uncordon", "Validated" if validated else "Recovered").inc()
    why = (
        "repaired and validated (spec.repair)"
        if validated
        else f"healthy for {policy.recovery_healthy_for_seconds:g}s"
    )
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.NODE_UNCORDONED,
        f"Node uncordoned by policy {policy.name}: {why}.",
    )
    return True
