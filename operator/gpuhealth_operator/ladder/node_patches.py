"""Patching one Node from its cached version, and counting what was done to it.

Every writer of the node ladder (labels, taint, cordon, uncordon) patches the
Node computed from the version the cache holds, with its resourceVersion as
a precondition: a conflict means someone changed it meanwhile, so it is read
again and the change computed afresh (`patch_with_retries`).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Awaitable, Callable

from gpuhealth_operator.client import kube, nodes
from gpuhealth_operator.decisions import model
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache


def issues_text(verdict: model.NodeVerdict) -> str:
    """The verdict's issues, for a message."""
    return ", ".join(verdict.issues) or "no issues"


def first_reason(verdict: model.NodeVerdict) -> str:
    """The verdict's first issue, for a metric label."""
    return verdict.issues[0].value if verdict.issues else "None"


def observe_latency(
    ctx: context.Context, verdict: model.NodeVerdict, action: str, now: datetime.datetime
) -> None:
    """Count an action on the Node, and the time from the fault's detection to it."""
    if verdict.detected_at is not None:
        latency = max(0.0, (datetime.datetime.now(datetime.UTC) - verdict.detected_at).total_seconds())
        ctx.meters.detection_to_action.labels(action, first_reason(verdict)).observe(latency)
    ctx.meters.actions.labels(action, first_reason(verdict)).inc()


async def refresh(ctx: context.Context, name: str) -> cache.NodeRecord | None:
    """Read the Node again into the cache (after a conflict); None: it is gone."""
    return ctx.cache.refresh_node(await ctx.client.get(nodes.node_path(name)))


class Patched(enum.Enum):
    WRITTEN = "written"
    SETTLED = "settled"
    """Nothing to write: the cached Node already is as wanted."""
    GONE = "gone"
    CONFLICTED = "conflicted"
    """Every attempt met a newer Node."""


def unschedulable(record: cache.NodeRecord) -> bool:
    """The cordon's `settled` (`patch_with_retries`): the Node is cordoned already, by whoever."""
    return record.view.unschedulable


async def patch_with_retries(
    ctx: context.Context,
    name: str,
    settled: Callable[[cache.NodeRecord], bool],
    patch: Callable[[cache.NodeRecord], Awaitable[kube.JsonObject]],
    attempts: int = 3,
) -> Patched:
    """Patch the Node computed from its cached record (with its resourceVersion); on 409 re-read and retry."""
    for _attempt in range(attempts):
        record = ctx.cache.nodes.get(name)
        if record is None:
            return Patched.GONE
        if settled(record):
            return Patched.SETTLED
        try:
            body = await patch(record)
        except kube.ApiError as error:
            if not error.conflict:
                raise
            await refresh(ctx, name)
            continue
        return Patched.WRITTEN if ctx.cache.refresh_node(body) is not None else Patched.GONE
    return Patched.CONFLICTED
