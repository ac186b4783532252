"""Exactly-once lifecycle Events: NodeCordoned and NodeDrained, said once per cordon.

A cordon's identity is the time it was made (`gpuhealth.io/cordoned-at`,
written in the cordon's own patch). Its Events are named from that identity
(`events.Recorder.announce`), so whichever term says one first wins and a
later one finds it there: a term that dies between the cordon and its Event
leaves the announcement to the next reconcile of any term, and a drain
repeated after a crash (it finds the node empty) does not say Drained twice.
"""

from __future__ import annotations

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache


def cordon_id(record: cache.NodeRecord) -> str | None:
    """Our cordon's identity: when it was made (a cordon older than that annotation: its drain's start)."""
    annotations = record.view.annotations
    return annotations.get(keys.CORDONED_AT_ANNOTATION) or annotations.get(keys.DRAIN_STARTED_ANNOTATION)


async def cordoned(ctx: context.Context, policy: str, name: str, issues: str, draining: bool) -> None:
    """Say NodeCordoned once per cordon of `policy`, also when the term that cordoned died first.

    Cheap on every reconcile: a cordon this process saw announced is not asked about again;
    one that could not be announced is tried again by the next reconcile.
    """
    record = ctx.cache.nodes.get(name)
    if record is None or not record.view.unschedulable or record.view.cordoned_by != policy:
        return
    cordoned_at = record.view.annotations.get(keys.CORDONED_AT_ANNOTATION)
    if cordoned_at is None or ctx.steps.cordon.announced.get(name) == cordoned_at:
        return  # announced by this process, or a cordon from before cordons had an identity
    draining = draining or keys.DRAIN_STARTED_ANNOTATION in record.view.annotations
    what = "cordoned and will be drained" if draining else "cordoned"
    if await ctx.recorder.announce_on(
        ctx.cache,
        name,
        vocabulary.EventReason.NODE_CORDONED,
        f"Node {what} by policy {policy}: {issues} (cordoned at {cordoned_at}).",
        cordoned_at,
        events.WARNING,
    ):
        ctx.steps.cordon.announced[name] = cordoned_at


async def drained(ctx: context.Context, name: str, message: str) -> bool:
    """Say NodeDrained once per cordon; False when it could not be said (then the drain must not count)."""
    record = ctx.cache.nodes.get(name)
    cordon = cordon_id(record) if record is not None else None
    if cordon is None:  # gone meanwhile: nothing to tie it to, say it plainly
        await ctx.recorder.emit_on(ctx.cache, name, vocabulary.EventReason.NODE_DRAINED, message)
        return True
    return await ctx.recorder.announce_on(
        ctx.cache, name, vocabulary.EventReason.NODE_DRAINED, f"{message} (cordoned at {cordon})", cordon
    )
