"""The DeviceTaintRules of a deleted policy: adopted by a policy that isolates on the node, or restored.

A rule whose `gpuhealth.io/policy` names no policy (deleted, renamed, or deleted while no operator ran)
would keep its GPU out for good. Once per timer pass, on the rule list `isolation_support.rules`
reuses for `recent.SECONDS`, each such rule is adopted by the first acting IsolateGPU policy (by name)
that selects its node, which restores the GPU once it has recovered (Event `GPUIsolated`; the adoption
asks for a pass over the node at once, so a GPU that recovered meanwhile is restored then), or else
deleted at once (Event `GPURestored`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events
from gpuhealth_operator.decisions import device_taints, isolation
from gpuhealth_operator.ladder.isolate import device_rules, isolation_support
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import pass_queue

logger = logging.getLogger(__name__)

ALL = isolation_support.ALL


async def sweep(ctx: context.Context, now: datetime.datetime) -> None:
    """One pass over the rules (see the module). A rule of an invalid policy (still there) or of a node
    outside this operator's cache is left alone. Errors are logged: the next pass tries again."""
    version = await isolation_support.any_version(ctx, now)
    if version is None:
        return
    try:
        async with ctx.steps.isolate.locks[ALL]:
            await _sweep(ctx, version, now)
    except device_rules.TRANSIENT as error:
        logger.warning(
            "could not restore or adopt the rules of deleted policies (next pass retries): %s", error
        )


async def _sweep(ctx: context.Context, version: str, now: datetime.datetime) -> None:
    present = {device_taints.label_value(n) for n in (*ctx.cache.policies, *ctx.cache.policy_errors)}
    nodes = {device_taints.label_value(n): n for n in ctx.cache.nodes}
    for rule in await isolation_support.rules(ctx, version, now):
        owner = isolation_support.owner(rule)
        labels = rule["metadata"].get("labels") or {}
        node = nodes.get(str(labels.get(keys.NODE_LABEL)))
        if owner is None or owner in present or node is None:
            continue
        name = rule["metadata"]["name"]
        index, uuid = (
            isolation_support.label_int(labels.get(keys.GPU_INDEX_LABEL)),
            str(labels.get(keys.GPU_UUID_LABEL)),
        )
        gpu = isolation_support.gpu_name(index, uuid)
        adopter = next(
            (
                p
                for p in sorted(ctx.cache.policies.values(), key=lambda p: p.name)
                if isolation_support.isolates(p) and not p.dry_run and node in ctx.cache.selection(p).selected
            ),
            None,
        )
        try:
            if adopter is not None:
                adopted = await device_rules.adopt(
                    ctx.client, version, name, deleted=owner, policy=device_taints.label_value(adopter.name)
                )
            else:
                adopted = False
                await device_rules.delete(ctx.client, version, name)
        finally:
            ctx.steps.isolate.rules_read.drop((ALL, version))
        subject = events.subject(ctx.cache, node)
        if adopter is not None:
            if not adopted:
                continue  # deleted or adopted meanwhile: the next list says what is there
            key = (adopter.name, node)
            state = ctx.steps.isolate.isolations.get(key) or isolation.NodeState()
            if all(g.uuid != uuid for g in state.in_place):
                taken = isolation.Isolated(index, uuid, name)
                ctx.steps.isolate.isolations[key] = dataclasses.replace(
                    state, in_place=(*state.in_place, taken)
                )
            # The adopter restores a recovered GPU only on a pass over the node: ask for one now, or it
            # waits for the next agent report (a 300 s heartbeat at rest) or the next full pass.
            ctx.passes.request(node, pass_queue.Ask("timer"))
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.GPU_ISOLATED,
                f"{gpu} stays isolated: policy {adopter.name} adopts DeviceTaintRule {name} of policy "
                f"{owner}, which is gone, and restores the GPU once it has recovered.",
            )
            continue
        ctx.meters.actions.labels("RestoreGPU", "PolicyDeleted").inc()
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.GPU_RESTORED,
            f"{gpu} restored: DeviceTaintRule {name} deleted, as policy {owner} that isolated it was "
            "deleted and no acting IsolateGPU policy selects the node.",
            events.WARNING,
        )
