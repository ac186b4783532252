"""Carrying out one policy's verdict on one Node: labels, taint, budgeted cordon, drain, uncordon.

The verdict says what the node deserves; this module walks the node ladder
in order (GPU isolation, a human's override, a repair in progress, the
budgeted cordon, the drain, the uncordon), patches labels and taint, and
returns the `status.action` that describes where the node now stands. The
cordon and uncordon are `cordoning`'s, the drain is `draining`'s, the labels
and taint `marking`'s, a Node patch from its cached version `node_patches`'.

A Node deleted while it is being reconciled leaves nothing to do: every
look-up after an `await` may find it gone (None), and the pass then stops.

Dry-run policies come here too: they compute the same changes, say them in
a `DryRun` Event, and change nothing.
"""

from __future__ import annotations

import datetime
import logging

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, verdicts
from gpuhealth_operator.ladder import announcements, node_patches, stopping
from gpuhealth_operator.ladder.cordon import cordoning
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.ladder.isolate import isolating
from gpuhealth_operator.ladder.mark import marking
from gpuhealth_operator.ladder.override import overrides
from gpuhealth_operator.ladder.repair import repairing
from gpuhealth_operator.shared import context
from gpuhealth_operator.verdict import judging

logger = logging.getLogger(__name__)

Action = vocabulary.Action
NodeAction = vocabulary.NodeAction

LESSER_ACTIONS: dict[Action | None, NodeAction] = {
    None: NodeAction.NONE,
    Action.EVENT: NodeAction.EVENT,
    Action.LABEL: NodeAction.LABELED,
    Action.TAINT: NodeAction.TAINTED,
}


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
    await marking.apply(ctx, name, judged, now)
    return isolating.node_action(ctx, policy.name, name, action)


async def _capacity(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    cordoning.settle_unknown(ctx, policy, name)
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
        if handled.returned and await cordoning.uncordon(ctx, policy, name, verdict, validated=True):
            return LESSER_ACTIONS.get(verdict.wanted_action, NodeAction.NONE)
        return handled.action
    record = ctx.cache.nodes.get(name)
    if record is None:
        return NodeAction.NONE  # gone: nothing left to do
    wanted = verdict.wanted_action
    if wanted in vocabulary.DISRUPTIVE_ACTIONS:
        if not record.view.unschedulable and not await cordoning.cordon(ctx, policy, name, verdict, now):
            await cordoning.budget_exceeded(ctx, policy, name, verdict)
            return NodeAction.PENDING
        ctx.admission.stop_waiting(policy.name, name)
        record = ctx.cache.nodes.get(name)
        if record is None:
            return NodeAction.NONE
        await announcements.cordoned(
            ctx, policy.name, name, node_patches.issues_text(verdict), wanted is Action.DRAIN
        )
        if wanted is Action.CORDON or record.view.cordoned_by is None:
            return NodeAction.CORDONED  # cordoned by someone else: theirs to drain and lift, never ours
        drained = await draining.advance(ctx, policy, name, now)
        if drained is NodeAction.DRAINED and policy.repair is not None:
            return await repairing.begin(ctx, policy, name, verdict, now)  # a repair cycle, or it waits
        return drained

    ctx.admission.stop_waiting(policy.name, name)
    if record.view.unschedulable and record.view.cordoned_by == policy.name:
        await announcements.cordoned(
            ctx, policy.name, name, node_patches.issues_text(verdict), wanted is Action.DRAIN
        )
        if verdicts.may_uncordon(policy, record.view, verdict):
            await cordoning.uncordon(ctx, policy, name, verdict)
            return LESSER_ACTIONS.get(wanted, NodeAction.NONE)
        return draining.shown(ctx, name)
    if verdict.overridden:
        return NodeAction.OVERRIDDEN  # a human said no to this evidence
    return LESSER_ACTIONS.get(wanted, NodeAction.NONE)


async def _dry_run(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> NodeAction:
    key = (policy.name, name)
    record = ctx.cache.nodes.get(name)
    if record is None:
        return NodeAction.NONE  # gone: nothing to say
    planned = await isolating.plan(ctx, policy, record, verdict)
    verdict, changes = planned.verdict, planned.changes
    disruptive = verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS
    if changes and (disruptive or verdict.issues or planned.isolating):
        message = (
            f"Dry run: policy {policy.name} would {', '.join(changes)} ({node_patches.issues_text(verdict)})."
        )
        message += planned.ladder_note
        if disruptive:
            message += repairing.dry_run_note(ctx, policy, name, verdict)
        if ctx.steps.dry_run.said.get(key) != message:
            ctx.steps.dry_run.said[key] = message
            ctx.meters.actions.labels(
                vocabulary.NodeAction.DRY_RUN.value, node_patches.first_reason(verdict)
            ).inc()
            await ctx.recorder.emit_on(ctx.cache, name, vocabulary.EventReason.DRY_RUN, message)
    elif not changes:
        ctx.steps.dry_run.said.pop(key, None)
    return NodeAction.DRY_RUN if verdict.wanted_action is not None else NodeAction.NONE
