"""Human overrides, and drain state tied to the cordon it belongs to (DESIGN.md, safety rule 1).

Anyone else making a node we cordoned schedulable (`kubectl uncordon`)
overrides us. Within the pass that sees it (a Node watch event, else the next
tick) `react` drops our claim (the `cordoned-by` annotation, and with it the
budget place), our drain bookkeeping and any running drain, writes the
evidence that stood as a baseline on the Node (`overridden-evidence`, so a
restart remembers) and says so once in an `OverriddenByUser` Event.
Every policy's verdict then withdraws its Cordon/Drain until the facts show
evidence newer than that baseline (`decisions.overrides.apply`); `expire`
removes the baseline once none of its conditions is true any more. A
schedulable node has no drain, whoever made it so (`draining.forget`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube, nodes
from gpuhealth_operator.decisions import model
from gpuhealth_operator.decisions import overrides as evidence
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache

logger = logging.getLogger(__name__)


def _gathered(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> evidence.Evidence:
    """The evidence standing on the node for this policy and every other that has judged it."""
    gpunode = ctx.cache.gpunodes.get(name)
    judged = [(policy, verdict)]
    for other in sorted(set(ctx.cache.policies) - {policy.name}):
        known = ctx.verdicts.get((other, name))
        if known is not None:
            judged.append((ctx.cache.policies[other], known))
    return evidence.gather_all(judged, gpunode.status if gpunode else {})


async def react(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    """Someone else made a node we cordoned schedulable: drop the claim, keep the baseline, say so once.

    Also when they cordoned it again since, seen or not (`cordon_taken_over`): their uncordon overrode
    us all the same, and the cordon now is theirs, never ours to lift.
    """
    dropped_from: cache.NodeRecord | None = None

    def settled(record: cache.NodeRecord) -> bool:
        return record.view.cordoned_by is None or (record.view.unschedulable and not record.cordon_taken_over)

    def drop(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        nonlocal dropped_from
        dropped_from = record
        found = _gathered(ctx, policy, name, verdict)
        claimant = record.view.cordoned_by  # not None: `settled` says so
        baseline = evidence.render(found, now, claimant) if found.episodes and claimant is not None else None
        return nodes.drop_claim(ctx.client, name, resource_version=record.resource_version, baseline=baseline)

    record = ctx.cache.nodes.get(name)
    if record is None or settled(record):
        return  # gone, or no claim of ours to drop (nearly every pass): nothing to patch
    patched = await node_patches.patch_with_retries(ctx, name, settled, drop)
    if patched is not node_patches.Patched.WRITTEN or dropped_from is None:
        return
    claimant = dropped_from.view.cordoned_by
    ctx.steps.drain.stop(name)
    ctx.meters.actions.labels(vocabulary.NodeAction.OVERRIDDEN.value, "Uncordoned").inc()
    logger.info("node %s was made schedulable by someone else: policy %s's claim dropped", name, claimant)
    what = (
        "made schedulable and cordoned again by someone other than gpu-health (the cordon is theirs: "
        "gpu-health never lifts it)"
        if dropped_from.view.unschedulable
        else "made schedulable by someone other than gpu-health"
    )
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.OVERRIDDEN_BY_USER,
        f"Node {what} while cordoned by policy {claimant}: "
        "gpu-health drops its claim (and its place in the disruption budget) and will not cordon the "
        "node again on the same evidence, only on new evidence (an error count growing, a new XID, a "
        "condition that clears and returns). Evidence still standing: "
        f"{evidence.standing_text(verdict)}.",
        events.WARNING,
    )


async def expire(ctx: context.Context, name: str, verdict: model.NodeVerdict) -> None:
    """Remove an override's baseline once none of its conditions is true (a return is new evidence anyway)."""
    record = ctx.cache.nodes.get(name)
    if record is None or verdict.health is vocabulary.Health.UNKNOWN:
        return
    text = record.view.annotations.get(keys.OVERRIDDEN_EVIDENCE_ANNOTATION)
    if not text:
        return  # no override's baseline (nearly every node): nothing to expire, `parse` would say None
    baseline = evidence.parse(text)
    if baseline is None or evidence.still_stands(baseline, verdict):
        return
    ctx.cache.refresh_node(
        await nodes.patch_metadata(ctx.client, name, annotations={keys.OVERRIDDEN_EVIDENCE_ANNOTATION: None})
    )
