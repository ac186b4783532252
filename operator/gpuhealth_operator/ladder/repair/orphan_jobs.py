"""Step Jobs go with their Node (issue 45, item 6).

A repair or validation Job is pinned to its node by name (`spec.nodeName`) and tolerates every taint,
so one that outlives its Node would run, privileged, on whatever registers under that name next: a
machine nobody cordoned or drained. Two things delete such a Job:

- the garbage collector: every step Job is owned by its Node (`jobs.fill` writes an ownerReference with
  the Node's UID), so deleting the Node deletes the Job and then its pods, and a Node re-created under
  the name (a new UID) owns none of them;
- this module, in case the collector is late or the Job was made before Jobs had an owner: on the
  timer's next tick after a Node is deleted (`Context.steps.repair.gone_nodes`), and on every full
  pass (after a restart, for Nodes deleted or re-created while no operator ran), it deletes every
  step Job whose Node is gone or has another UID than the one the Job was made for (a Job with no
  owner: was created before the Node was, both stamps of the API server's clock).

No new step starts on a re-created Node by itself: it carries no repair annotation and no cordon of
ours, so it takes a new fault, cordon and drain first (`repairing.begin`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth_api import keys, timestamps, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.ladder.repair import jobs, reading
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NODE_KIND = "Node"
FEW = 8
"""Up to this many Nodes deleted since the last tick are looked up one by one; more, in one list."""


@dataclasses.dataclass(frozen=True)
class NodeIdentity:
    """Which Node holds the name now: its UID and creationTimestamp."""

    uid: str
    created: str


def owner_uid(job: Mapping[str, Any]) -> str | None:
    """The UID of the Node the Job was made for (its ownerReference), None for a Job without one."""
    for owner in (job.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("kind") == NODE_KIND and owner.get("apiVersion") == "v1":
            uid = owner.get("uid")
            return uid if isinstance(uid, str) and uid else None
    return None


def why_stale(job: Mapping[str, Any], node: NodeIdentity | None) -> str | None:
    """Why the step Job must go: its Node is gone (`node` None) or is another Node of the same name (the
    owner's UID differs; a Job with no owner was created before the Node); None: it is its Node's."""
    meta = job.get("metadata") or {}
    name = (meta.get("labels") or {}).get(keys.NODE_LABEL, "")
    if node is None:
        return f"its Node {name} is gone"
    made_for = owner_uid(job)
    if made_for is not None:
        return (
            None
            if made_for == node.uid
            else f"its Node {name} was re-created (UID {made_for}, now {node.uid})"
        )
    if _before(str(meta.get("creationTimestamp") or ""), node.created):
        return f"its Node {name} was re-created after the Job ({node.created})"
    return None


def _before(job_created: str, node_created: str) -> bool:
    try:
        return timestamps.parse(job_created) < timestamps.parse(node_created)
    except ValueError:
        return False  # a stamp missing or unreadable: it cannot be told, the collector decides


def in_use(ctx: context.Context) -> bool:
    """Whether any policy runs Jobs (`spec.repair`): without one the operator may hold no right to list
    them, and a Job left from one deleted since is still the garbage collector's."""
    return any(p.repair is not None for p in ctx.cache.policies.values())


async def _identity(ctx: context.Context, name: str) -> NodeIdentity | None:
    """The Node of the name: from the cache, else from the API server (the cache may not hold a Node
    outside the operator's pool, or not yet after a restart); None when there is no such Node."""
    record = ctx.cache.nodes.get(name)
    if record is not None and record.uid:
        return NodeIdentity(record.uid, record.created)
    try:
        node = await ctx.client.get(f"/api/v1/nodes/{name}")
    except kube.ApiError as error:
        if error.not_found:
            return None
        raise
    meta = node.get("metadata") or {}
    return NodeIdentity(str(meta.get("uid") or ""), str(meta.get("creationTimestamp") or ""))


async def sweep(ctx: context.Context, *, full: bool) -> None:
    """Delete the step Jobs of the Nodes deleted since the last tick (all stale ones when `full`)."""
    gone, ctx.steps.repair.gone_nodes = ctx.steps.repair.gone_nodes, set()
    if not (full or gone) or not in_use(ctx):
        return
    ours = f"{jobs.MANAGED_BY_LABEL}={jobs.MANAGED_BY}"
    # A few deleted Nodes: a list of each one's Jobs; a scale-down of many: one list of all of ours.
    each = not full and len(gone) <= FEW
    selectors = [f"{ours},{keys.NODE_LABEL}={name}" for name in sorted(gone)] if each else [ours]
    try:
        for selector in selectors:
            await _delete_stale(ctx, await _list(ctx, selector))
    except kube.ApiError as error:
        if error.status in (401, 403):  # no right to Jobs: none of ours can exist to delete
            logger.debug("step Jobs not listed: %s %s", error.status, error.reason)
            return
        ctx.steps.repair.gone_nodes |= gone  # the next tick tries again
        logger.warning("deleting the step Jobs of deleted Nodes failed (will retry)", exc_info=True)


async def _list(ctx: context.Context, selector: str) -> list[kube.JsonObject]:
    found = await ctx.client.get(jobs.jobs_path(reading.namespace(ctx)), {"labelSelector": selector})
    items = found.get("items") or []
    return [dict(j) for j in items if isinstance(j, Mapping)]


async def _delete_stale(ctx: context.Context, listed: Iterable[kube.JsonObject]) -> None:
    found: dict[str, NodeIdentity | None] = {}
    for job in listed:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        node = labels.get(keys.NODE_LABEL)
        if labels.get(jobs.MANAGED_BY_LABEL) != jobs.MANAGED_BY or not node or meta.get("deletionTimestamp"):
            continue  # not ours, or going already
        if node not in found:
            found[node] = await _identity(ctx, node)
        why = why_stale(job, found[node])
        if why is None:
            continue
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        if await jobs.delete(ctx.client, str(meta.get("namespace")), str(meta.get("name"))):
            logger.warning("step Job %s deleted: %s", where, why)
            await ctx.recorder.emit_on(
                ctx.cache,
                node,
                vocabulary.EventReason.REMEDIATION_PAUSED,
                f"Repair Job {where} deleted: {why}. It ran pinned to the node's name; no step runs on a "
                "Node of this name before a new fault, cordon and drain of its own.",
                events.WARNING,
            )
