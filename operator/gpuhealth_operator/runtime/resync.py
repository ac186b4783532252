"""Converge the cache after watch gaps: re-list Nodes, GPUNodes and policies, prune what is gone.

The watches tell us of every deletion they see, but not of one that happened
while no watch was open: when a watch resumes with 410 Gone (the API server
no longer has the history since our last event, e.g. after its restart, or
after we were paused for long), kopf lists the kind again and hands each
listed object to the handlers as an event of type None, yet says nothing of
the objects that vanished meanwhile. Such an object would stay in the cache
for the rest of the term, holding its place in a policy's budget and its
memory (lock, drain task, results, verdicts).

So whenever a handler sees an object listed again (kopf re-listed), and anyway
every `resync_seconds`, this lists the three kinds itself and prunes, through the
cache's and the context's own methods, every object cached but not listed.
Only pruning: what exists is brought in by kopf's listing and watch, whose
order we must not disturb. An object is pruned only if it was cached before
the LIST was sent and, where the cache knows its resourceVersion, not cached
from a version newer than the list's, so one created while we listed stays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from gpuhealth_api import resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import reconciler
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 1.0
"""After kopf's re-list begins, wait this long so that one LIST of ours covers the whole burst."""

NODES_PATH = "/api/v1/nodes"
GPUNODES_PATH = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}"
POLICIES_PATH = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.POLICY_PLURAL}"


def _not_after(version: str | None, list_version: str) -> bool:
    """Whether a cached object's resourceVersion is at most the list's (unknown counts as older)."""
    if version is None:
        return True
    try:
        return int(version) <= int(list_version)
    except ValueError:
        return False  # not etcd's integers: we cannot tell, so keep the object


def gone(
    before: Collection[str],
    cached: Mapping[str, str | None],
    listed: Collection[str],
    list_version: str,
) -> list[str]:
    """What to prune: cached before the LIST was sent and still, not listed, not newer than the list.

    `before` are the names cached when the LIST was sent, `cached` the names
    cached now with their resourceVersion (None when the cache does not keep
    it), `listed` the names the LIST returned as of `list_version`.
    """
    listed_set = set(listed)
    return sorted(
        name
        for name, version in cached.items()
        if name in before and name not in listed_set and _not_after(version, list_version)
    )


@dataclasses.dataclass(frozen=True)
class Listing:
    names: frozenset[str]
    resource_version: str


async def list_names(ctx: context.Context, path: str, label_selector: str = "") -> Listing:
    """The names of a collection and the resourceVersion it was listed at (one snapshot across pages)."""
    names: set[str] = set()
    params = {
        "limit": str(kube.LIST_PAGE_SIZE),
        **({"labelSelector": label_selector} if label_selector else {}),
    }
    version = ""
    while True:
        page = await ctx.client.list_names(path, params)  # names only: not 250 GPUNodes' facts at once
        meta = page.get("metadata") or {}
        version = version or str(meta.get("resourceVersion", ""))
        names.update(str((item.get("metadata") or {}).get("name", "")) for item in page.get("items") or [])
        token = meta.get("continue")
        if not token:
            return Listing(frozenset(names), version)
        params["continue"] = str(token)


def node_versions(ctx: context.Context) -> dict[str, str | None]:
    return {name: record.resource_version for name, record in ctx.cache.nodes.items()}


def gpunode_versions(ctx: context.Context) -> dict[str, str | None]:
    return {name: record.resource_version for name, record in ctx.cache.gpunodes.items()}


def policy_versions(ctx: context.Context) -> dict[str, str | None]:
    return dict.fromkeys({*ctx.cache.policies, *ctx.cache.policy_errors})


async def resync(ctx: context.Context) -> dict[str, list[str]]:
    """List the three kinds and prune what is gone; what was pruned, by kind."""
    pruned: dict[str, list[str]] = {}

    before = set(ctx.cache.nodes)
    listing = await list_names(ctx, NODES_PATH, ctx.config.node_selector)
    pruned["nodes"] = gone(before, node_versions(ctx), listing.names, listing.resource_version)
    for name in pruned["nodes"]:
        ctx.cache.remove_node(name)
        if ctx.config.node_selector:  # gone, or left this operator's pool: its GPUNode is not ours
            ctx.cache.remove_gpunode(name)
        ctx.forget_node(name)

    before = set(ctx.cache.gpunodes)
    listing = await list_names(ctx, GPUNODES_PATH)
    pruned["gpunodes"] = gone(before, gpunode_versions(ctx), listing.names, listing.resource_version)
    for name in pruned["gpunodes"]:
        ctx.cache.remove_gpunode(name)
        ctx.forget_node(name)

    before = set(policy_versions(ctx))
    listing = await list_names(ctx, POLICIES_PATH)
    pruned["policies"] = gone(before, policy_versions(ctx), listing.names, listing.resource_version)
    for name in pruned["policies"]:
        await reconciler.policy_deleted(ctx, name)  # as on its DELETED event

    if any(pruned.values()):
        logger.warning(
            "resync: pruned what was deleted while no watch saw it: %s",
            "; ".join(f"{kind} {', '.join(names)}" for kind, names in pruned.items() if names),
        )
    return pruned


class Relists:
    """Heard by a kopf handler: kopf listed the policies again (they arrive with event type None);
    told by our Node and GPUNode watches (`relisted`) when they list their kind again.

    Not kopf's first listing of a term: the term's priming listed and pruned just before kopf
    started, so a resync then would only list the whole cluster a second time. A listed object
    this term's watches already showed means a re-list (after a watch gap): that asks for one.
    """

    def __init__(self) -> None:
        self.wanted = asyncio.Event()
        self._seen: set[int] = set()
        """Hashes of (kind, uid) of the objects kopf showed this term (ints: ~60 bytes per object)."""

    async def on_event(self, event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        meta = body.get("metadata") or {}
        key = hash((body.get("kind"), meta.get("uid") or meta.get("name")))
        if event["type"] is None and key in self._seen:
            self.wanted.set()
        if event["type"] == "DELETED":
            self._seen.discard(key)
        else:
            self._seen.add(key)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """For the policies, which kopf watches (Nodes' and GPUNodes' own watches call `relisted`)."""
        kopf.on.event(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, registry=registry, id="resync"
        )(self.on_event)

    def relisted(self) -> None:
        """A watch of ours listed its kind again after a gap (`watching`)."""
        self.wanted.set()


async def run(ctx: context.Context, relists: Relists) -> None:
    """Resync after every re-list kopf makes, and every `resync_seconds`; a failed pass is retried."""
    while True:
        # Not `asyncio.wait_for`: its inner task, started after kopf, is one kopf cancels when it stops.
        try:
            async with asyncio.timeout(ctx.config.resync_seconds):
                await relists.wanted.wait()
            await asyncio.sleep(SETTLE_SECONDS)
        except TimeoutError:
            pass
        relists.wanted.clear()
        try:
            await resync(ctx)
        except reconciler.TRANSIENT_ERRORS as error:
            logger.warning("resync failed (will retry): %s", error)
            relists.wanted.set()
            await asyncio.sleep(ctx.config.lease_retry_seconds)
        except Exception:
            logger.exception("resync failed (will retry)")
            relists.wanted.set()
            await asyncio.sleep(ctx.config.lease_retry_seconds)
