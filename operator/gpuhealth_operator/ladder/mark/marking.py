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
from gpuhealth_operator.client import kube, nodes
from gpuhealth_operator.decisions import model
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache
from gpuhealth_operator.verdict import node_changes

Action = vocabulary.Action


async def apply(ctx: context.Context, name: str, verdict: model.NodeVerdict, now: datetime.datetime) -> None:
    """Make the Node's labels and taint what `verdict` wants; a fault's new mark is counted as an action."""
    record = ctx.cache.nodes.get(name)
    if record is None:
        return  # gone: nothing to mark
    changes, taint = node_changes.marks(record, verdict)
    if changes:
        await _labels(ctx, name, verdict, changes, now)
    await _taint(ctx, name, verdict, now, read=(record, taint))


async def _labels(
    ctx: context.Context,
    name: str,
    verdict: model.NodeVerdict,
    changes: dict[str, str | None],
    now: datetime.datetime,
) -> None:
    ctx.cache.refresh_node(await nodes.patch_metadata(ctx.client, name, labels=changes))
    if any(v == "true" for k, v in changes.items() if k != keys.HEALTH_LABEL):
        node_patches.observe_latency(ctx, verdict, Action.LABEL.value, now)
    for key in sorted(k for k, v in changes.items() if v is None and k != keys.HEALTH_LABEL):
        # Said both ways (issue 45): setting it was the condition's Event; its removal is a decision too.
        await ctx.recorder.emit_on(
            ctx.cache,
            name,
            vocabulary.EventReason.NODE_UNLABELED,
            f"Label {key} removed: no rule of the verdict wants it now (health {verdict.health.value}).",
        )


async def _taint(
    ctx: context.Context,
    name: str,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
    read: tuple[cache.NodeRecord, str | None],
) -> None:
    """`read`: a version of the Node and its taint as `apply` read them (the labels patch may have
    replaced it since)."""

    def patch(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        return nodes.set_taint(
            ctx.client,
            name,
            taints=[dict(t) for t in record.taints],
            value=verdict.wanted_taint,
            resource_version=record.resource_version,
        )

    def taint_of(record: cache.NodeRecord) -> str | None:
        return read[1] if record is read[0] else node_changes.our_taint(record)

    before = ctx.cache.nodes.get(name)
    had = taint_of(before) if before is not None else None
    if before is not None and had == verdict.wanted_taint:
        return  # the cached Node carries the taint wanted: nothing to patch
    patched = await node_patches.patch_with_retries(
        ctx, name, lambda record: taint_of(record) == verdict.wanted_taint, patch
    )
    if patched is node_patches.Patched.WRITTEN and verdict.wanted_taint is not None:
        node_patches.observe_latency(ctx, verdict, Action.TAINT.value, now)
    if patched is node_patches.Patched.WRITTEN and verdict.wanted_taint is None:
        await ctx.recorder.emit_on(
            ctx.cache,
            name,
            vocabulary.EventReason.NODE_UNTAINTED,
            f"Taint {keys.UNHEALTHY_TAINT}"
            + (f"={had}" if had else "")
            + " removed: no Taint rule fires now "
            f"(health {verdict.health.value}).",
        )
