"""Emergency stops, and cordons a deleted policy left behind.

Four things stop a running drain at once: the node labelled
`gpuhealth.io/exclude=true`, its policy set to `dryRun: true`, its policy
deleted (or made invalid), and the policy no longer selecting the node (the
node relabelled, the selector narrowed). Every drain asks `why_stop` right before each
eviction request, so no request goes out once the watch event is in the
cache; and the watch handlers call `stop_drains` as soon as they stored the
event, which cancels the drain task there and then. The cordon stays (the
fault is still there) and keeps its budget slot until a human or the
recovery rules release it. Each stop is said in a `RemediationPaused` Event.

A deleted policy's cordons are not orphaned silently: `policy_deleted` tells
each such node how to release it, and the next policy that selects the node
adopts the cordon (`adopt`): `cordoned-by` then names the adopting policy,
which drains and uncordons the node as its own.
"""

from __future__ import annotations

import logging

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube, nodes, status
from gpuhealth_operator.decisions import policies, signals, verdicts
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

PAUSED = vocabulary.EventReason.REMEDIATION_PAUSED


def why_stop(ctx: context.Context, policy: str, node: str) -> str | None:
    """Why policy `policy`'s drain of `node` must stop now, in words; None while it may go on."""
    record = ctx.cache.nodes.get(node)
    if record is None:
        return "the node is gone"
    if record.view.labels.get(keys.EXCLUDE_LABEL) == "true":
        return f"the node is labelled {keys.EXCLUDE_LABEL}=true"
    maintenance = signals.gpu_operator_maintenance(record.view.labels)
    if maintenance is not None and not _overdue(ctx, node):  # the driver is away: no GPU for a pod to use
        return maintenance
    current = ctx.cache.policies.get(policy)
    if current is None:
        if policy in ctx.cache.policy_errors:
            return f"policy {policy} is no longer valid"
        return f"policy {policy} was deleted"
    if current.dry_run:
        return f"policy {policy} is now in dry run"
    if not policies.matches(current, record.view):  # relabelled, or the selector narrowed
        return f"policy {policy} no longer selects the node"
    return None


def _overdue(ctx: context.Context, node: str) -> bool:
    """The GPU Operator's maintenance outlasted its limit (`verdicts.maintenance_overdue`): its label
    stops no drain of ours any more."""
    gpunode = ctx.cache.gpunodes.get(node)
    state = gpunode.conditions.get(vocabulary.Condition.GPU_OPERATOR_MAINTENANCE) if gpunode else None
    return verdicts.maintenance_overdue(state, ctx.clock())


def _release_hint(reason: str, node: str) -> str:
    if keys.EXCLUDE_LABEL in reason:
        return (
            f"remove the label (kubectl label node {node} {keys.EXCLUDE_LABEL}-) to hand the node back, "
            "or release it yourself"
        )
    if "dry run" in reason:
        return "set dryRun: false to resume the drain"
    if "GPU Operator" in reason:
        return (
            "the drain resumes once the GPU Operator is done with the node if the fault is still there; the "
            "node stays ours to uncordon once recovered"
        )
    if "no longer selects" in reason:
        return (
            "select the node again to resume the drain, or release it yourself (kubectl uncordon "
            f"{node} && kubectl annotate node {node} {keys.CORDONED_BY_ANNOTATION}-)"
        )
    return "a policy that selects the node adopts the cordon"


async def say_stopped(ctx: context.Context, policy: str, node: str, reason: str) -> None:
    logger.info("drain of node %s by policy %s stopped: %s", node, policy, reason)
    await ctx.recorder.emit_on(
        ctx.cache,
        node,
        PAUSED,
        f"Drain by policy {policy} stopped: {reason}. No further eviction is requested; the node stays "
        f"cordoned and keeps its place in the disruption budget. To go on: {_release_hint(reason, node)}.",
        events.WARNING,
    )


async def stop_drains(ctx: context.Context, *, quiet: frozenset[str] = frozenset()) -> dict[str, str]:
    """Cancel every running drain that must stop; node → why. Each is said in an Event unless in `quiet`."""
    stopped: dict[str, str] = {}
    for node, task in list(ctx.steps.drain.tasks.items()):
        policy = ctx.steps.drain.policies.get(node)
        if task.done() or policy is None:
            continue
        reason = why_stop(ctx, policy, node)
        if reason is None:
            continue
        task.cancel()
        stopped[node] = reason
    for node, reason in stopped.items():
        policy = ctx.steps.drain.policies.get(node, "")
        if node not in quiet and ctx.cache.nodes.get(node) is not None:
            await say_stopped(ctx, policy, node, reason)
    return stopped


async def policy_deleted(ctx: context.Context, name: str) -> None:
    """The policy is gone (already out of the cache): stop its drains, and say how to release its cordons."""
    orphans = sorted(
        n
        for n, record in ctx.cache.nodes.items()
        if record.view.cordoned_by == name and record.view.unschedulable
    )
    stopped = await stop_drains(ctx, quiet=frozenset(orphans))
    for node in orphans:
        gpunode = ctx.cache.gpunodes.get(node)
        issues = str(gpunode.status.get("issues") or "") if gpunode is not None else ""
        drained = " Its drain stopped: no further eviction is requested." if node in stopped else ""
        await ctx.recorder.emit_on(
            ctx.cache,
            node,
            PAUSED,
            f"Policy {name}, which cordoned this node ({issues or 'issues no longer known'}), was deleted; "
            f"the node stays cordoned.{drained} To release it: kubectl uncordon {node} && kubectl annotate "
            f"node {node} {keys.CORDONED_BY_ANNOTATION}- ; or a policy that selects the node adopts the "
            "cordon and drains or uncordons it by its own rules.",
            events.WARNING,
        )


async def adopt(ctx: context.Context, policy: str, name: str) -> None:
    """Take over the node's cordon if the policy that made it is gone (the cache, then the API, says so)."""
    record = ctx.cache.nodes.get(name)
    if record is None or not record.view.unschedulable:
        return
    owner = record.view.cordoned_by
    if not owner or owner == policy or owner in ctx.cache.policies or owner in ctx.cache.policy_errors:
        return
    try:  # only a 404 proves the owner gone (the cache could lag behind a policy just created)
        await ctx.client.get(status.policy_path(owner))
        return
    except kube.ApiError as error:
        if not error.not_found:
            raise
    try:
        started = keys.DRAIN_STARTED_ANNOTATION in record.view.annotations
        body = await nodes.adopt_cordon(ctx.client, name, deleted=owner, policy=policy, drain_started=started)
    except kube.ApiError as error:
        if error.status not in (409, 422):
            raise
        await node_patches.refresh(ctx, name)
        return  # changed meanwhile (a human uncordoned it, another policy adopted it): not ours
    if ctx.cache.refresh_node(body) is None:
        return
    ctx.steps.drain.handed_over(name)  # the deleted policy's drain ended; the adopting policy drains anew
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.NODE_CORDONED,
        f"Policy {policy} adopts the cordon of deleted policy {owner}: it now drains and uncordons the node "
        "by its own rules.",
    )
