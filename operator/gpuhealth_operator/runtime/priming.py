"""Bring the cache up to date before a term acts: paged LISTs into compact records, then prune.

A term must not decide before its cache holds the whole fleet (the budget
counts every node a policy selects), so each term lists Nodes, GPUNodes,
policies and agent pods first. At 5,000 nodes a GPUNode list is ~65 MB of
JSON; held at once as decoded objects it cost several hundred MB. So each
page (`kube.LIST_PAGE_SIZE` objects) is turned into the cache's compact records as it
arrives and dropped before the next is asked for.

The cache outlives a term: a replica that lost its Lease keeps what it knew,
and its next term lists again into the same cache. A listed object replaces
its record only if it is not older (`ClusterCache.put_*`); an object is
taken as deleted only after a complete list of its kind did not show it
(`resync.gone`, the same rule as the periodic resync), so a list that fails
half-way (a client timeout, `504 Timeout: Too large resource version` from an
API server whose watch cache lags) loses nothing: it is retried with backoff
from the cache as it stands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, reconciler, resync
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import agent_pods

logger = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
BACKOFF_CAP_SECONDS = 30.0
"""A failing list is retried at most this far apart (the API server may be saturated, not down)."""


def backoff_seconds(failures: int, base_seconds: float, cap_seconds: float = BACKOFF_CAP_SECONDS) -> float:
    """How long to wait before the next attempt after `failures` failed ones in a row (doubling, capped)."""
    if failures <= 0:
        return 0.0
    return float(min(cap_seconds, base_seconds * 2 ** min(failures - 1, 16)))


@dataclasses.dataclass(frozen=True)
class Primed:
    """What one priming did: objects listed and objects pruned, by kind; the list's resourceVersion by path,
    for the watches that follow (`watching.Watch(since=...)`)."""

    listed: Mapping[str, int]
    pruned: Mapping[str, list[str]]
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)


async def _converge(
    ctx: context.Context,
    path: str,
    put: Callable[[Mapping[str, Any]], object],
    versions: Callable[[], Mapping[str, str | None]],
    query: Mapping[str, str] | None = None,
) -> tuple[set[str], list[str], str]:
    """List one kind page by page into the cache; the names listed, those to prune (not yet pruned), and
    the list's resourceVersion (every page is served at the first one's)."""
    before = set(versions())
    listed: set[str] = set()
    list_version = ""
    async for items, version in ctx.client.pages(path, query):
        list_version = list_version or version
        for body in items:
            listed.add(str((body.get("metadata") or {}).get("name", "")))
            put(body)
        del items
    return listed, resync.gone(before, versions(), listed, list_version), list_version


async def prime(ctx: context.Context) -> Primed:
    """List the cluster into the cache (kept from an earlier term, if any) and prune what is gone."""
    ctx.judging.resting.clear()  # a term judges every node afresh: another replica may have acted meanwhile
    listed: dict[str, int] = {}
    pruned: dict[str, list[str]] = {}
    versions: dict[str, str] = {}

    selector = ctx.config.node_selector
    names, pruned["nodes"], versions[resync.NODES_PATH] = await _converge(
        ctx,
        resync.NODES_PATH,
        ctx.cache.put_node,
        lambda: resync.node_versions(ctx),
        {"labelSelector": selector} if selector else None,
    )
    listed["nodes"] = len(names)
    for name in pruned["nodes"]:
        ctx.cache.remove_node(name)
        ctx.forget_node(name)

    def put_gpunode(body: Mapping[str, Any]) -> None:
        if handlers.in_pool(ctx, str((body.get("metadata") or {}).get("name", ""))):
            ctx.cache.put_gpunode(body, ctx.clock())

    names, pruned["gpunodes"], versions[resync.GPUNODES_PATH] = await _converge(
        ctx, resync.GPUNODES_PATH, put_gpunode, lambda: resync.gpunode_versions(ctx)
    )
    if selector:  # a GPUNode kept from the last term whose Node left this operator's pool meanwhile
        outside = {n for n in ctx.cache.gpunodes if ctx.cache.node(n) is None}
        pruned["gpunodes"] = sorted(outside.union(pruned["gpunodes"]))
    listed["gpunodes"] = len(names)
    for name in pruned["gpunodes"]:
        ctx.cache.remove_gpunode(name)
        ctx.forget_node(name)

    names, pruned["policies"], _ = await _converge(
        ctx,
        resync.POLICIES_PATH,
        lambda body: handlers.store_policy(ctx, body),
        lambda: resync.policy_versions(ctx),
    )
    listed["policies"] = len(names)
    for name in pruned["policies"]:
        await reconciler.policy_deleted(ctx, name)

    if ctx.config.agent_pod_selector:
        now = ctx.clock()
        query = {"labelSelector": ctx.config.agent_pod_selector}
        count = 0
        async for items, _ in ctx.client.pages(PODS_PATH, query):
            for body in items:
                if agent_pods.is_agent(body, ctx.config.agent_pod_namespace):
                    ctx.agent_pods.observe(body, now)
                    count += 1
        listed["agent pods"] = count
    if any(pruned.values()):
        logger.warning(
            "priming: dropped from the cache what was deleted since the last term: %s",
            "; ".join(f"{kind} {', '.join(names)}" for kind, names in pruned.items() if names),
        )
    return Primed(listed, pruned, versions)


async def prime_until_done(ctx: context.Context, retry_seconds: float) -> Primed:
    """Prime, retrying transient failures with backoff; the cache keeps what each attempt brought in."""
    failures = 0
    while True:
        try:
            primed = await prime(ctx)
        except reconciler.TRANSIENT_ERRORS as error:
            if isinstance(error, kube.ApiError) and error.status == 400:
                raise  # e.g. a --node-selector the API server cannot parse: retrying cannot help
            failures += 1
            wait = backoff_seconds(failures, retry_seconds)
            logger.warning(
                "could not list the cluster (attempt %d; retrying in %.0f s, the cache of %d nodes kept): %s",
                failures,
                wait,
                len(ctx.cache.nodes),
                error,
            )
            await asyncio.sleep(wait)
            continue
        logger.info(
            "cache primed: %s",
            ", ".join(f"{count} {kind}" for kind, count in primed.listed.items()),
        )
        return primed
