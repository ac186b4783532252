"""The Label and Taint actions: the node's health labels and the `gpuhealth.io/unhealthy` taint.

Level-triggered, unlike the drain: every pass makes the Node carry what the verdict wants
(`node_changes`: our labels, our taint) and nothing is left running, so there is no progress
to observe and the undo is a verdict that wants none. A cordon carries the label and taint
changes of its verdict in its own patch (`cordoning.cordon`); `apply` writes what is left.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator import cache, context, kube, node_changes, node_patches
from gpuhealth_operator.actions import nodes
from gpuhealth_operator.decisions import model

Action = vocabulary.Action


async def apply(ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime) -> None:
    """Make the Node's labels and taint what `verdict` wants; a fault's new mark is counted as an action."""
    await _labels(ctx, name, verdict, now)
    await _taint(ctx, name, verdict, now)


async def _labels(
    ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    record = ctx.cache.node(name)
    changes = node_changes.label_changes(record, verdict) if record is not None else {}
    if not changes:
        return
    ctx.cache.refresh_node(await nodes.patch_metadata(ctx.client, name, labels=changes))
    if any(v == "true" for k, v in changes.items() if k != keys.HEALTH_LABEL):
        node_patches.observe_latency(ctx, verdict, Action.LABEL.value, now)


async def _taint(ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime) -> None:
    def patch(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        return nodes.set_taint(
            ctx.client,
            name,
            taints=[dict(t) for t in record.taints],
            value=verdict.wanted_taint,
            resource_version=record.resource_version,
        )

    patched = await node_patches.patch_with_retries(
        ctx, name, lambda record: node_changes.our_taint(record) == verdict.wanted_taint, patch
    )
    if patched is node_patches.Patched.WRITTEN and verdict.wanted_taint is not None:
        node_patches.observe_latency(ctx, verdict, Action.TAINT.value, now)
