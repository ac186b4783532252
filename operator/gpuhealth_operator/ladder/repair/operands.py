"""The GPU Operator's operands step aside for a reset (issue 48, Deliver 2; DESIGN.md "Repair that
releases the GPU").

On a node the GPU Operator manages, its device plugin, DCGM host engine, dcgm-exporter and GFD keep the
GPU open, and the drain leaves DaemonSet pods running, so `nvidia-smi --gpu-reset` would refuse. Before
a ResetGPU step's Job the operator turns off, through the operator's own per-node labels
(`keys.GPU_OPERATOR_OPERAND_LABELS`), exactly those that are "true" (`decisions.operands.to_pause`), and
records them in the Node annotation `keys.OPERANDS_PAUSED_ANNOTATION` in the same patch (resourceVersion
precondition: the labels changed are the ones read), so no label is ever off without its record. The
reset waits until the operand pods on the node are gone (`holders`). When the reset is over (its Job
ended, the step failed, the cycle ended; `repairing`), `restore` sets back only the recorded labels
still "false" — a human's edit meanwhile wins — and removes the record in one patch. The record lives
on the Node, so a restarted or new leader restores it too.

A node without these labels (the GPU Operator does not manage it) is left alone: docs/repair.md says
what to stop by hand there.
"""

from __future__ import annotations

import logging

from gpuhealth_api import keys
from gpuhealth_operator.client import drain, kube, nodes
from gpuhealth_operator.decisions import operands
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)


def paused(ctx: context.Context, name: str) -> tuple[str, ...] | None:
    """The labels recorded as paused on the Node (None: no record)."""
    record = ctx.cache.nodes.get(name)
    if record is None or keys.OPERANDS_PAUSED_ANNOTATION not in record.view.annotations:
        return None
    return operands.parse(record.view.annotations[keys.OPERANDS_PAUSED_ANNOTATION])


async def pause(ctx: context.Context, name: str) -> tuple[str, ...] | None:
    """Turn the node's "true" operand labels off, recorded in the same write; the labels paused (those
    recorded already, by this process or one before it), () where none is on, None on a conflict (the
    Node changed: decided again next pass)."""
    known = paused(ctx, name)
    if known is not None:
        return known
    record = ctx.cache.nodes.get(name)
    if record is None:
        return None
    wanted = operands.to_pause(record.view.labels)
    if not wanted:
        return ()
    body = {
        "metadata": {
            "resourceVersion": record.resource_version,
            "labels": dict.fromkeys(wanted, operands.OFF),
            "annotations": {keys.OPERANDS_PAUSED_ANNOTATION: operands.render(wanted)},
        }
    }
    try:
        written = await ctx.client.patch(nodes.node_path(name), body)
    except kube.ApiError as error:
        if not error.conflict:
            raise
        await node_patches.refresh(ctx, name)
        return None
    ctx.cache.refresh_node(written)
    logger.info("node %s: GPU Operator operands paused for a reset: %s", name, ", ".join(wanted))
    return wanted


async def holders(ctx: context.Context, name: str, labels: tuple[str, ...]) -> list[str]:
    """The node's operand pods of the paused labels still there (none: the reset may start)."""
    if not labels:
        return []
    return operands.holders(await drain.list_pods(ctx.client, name), labels)


async def restore(ctx: context.Context, name: str) -> None:
    """Set back what we paused and still own, and remove the record (nothing where none is recorded)."""
    recorded = paused(ctx, name)
    record = ctx.cache.nodes.get(name)
    if recorded is None or record is None:
        return
    back = operands.to_restore(record.view.labels, recorded)
    body = {
        "metadata": {
            "resourceVersion": record.resource_version,
            "labels": dict(back),
            "annotations": {keys.OPERANDS_PAUSED_ANNOTATION: None},
        }
    }
    if not back:
        del body["metadata"]["labels"]
    try:
        written = await ctx.client.patch(nodes.node_path(name), body)
    except kube.ApiError as error:
        if error.not_found:
            return
        if not error.conflict:
            raise
        await node_patches.refresh(ctx, name)  # a human's edit meanwhile: decided again next pass
        return
    ctx.cache.refresh_node(written)
    kept = sorted(set(recorded) - set(back))
    logger.info(
        "node %s: GPU Operator operands restored: %s%s",
        name,
        ", ".join(back) or "none",
        f" (left as a human set them: {', '.join(kept)})" if kept else "",
    )
