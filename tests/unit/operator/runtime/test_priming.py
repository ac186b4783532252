"""Priming: paged LISTs into the cache a lost term kept, pruning only after a complete list.

Driven with a client whose GET answers from a fixed cluster in pages (the
real `kube.Kube.pages` follows the continue tokens), so what is shown is the
operator's own handling: each page lands in the cache before the next is
asked for, a listed object older than the cached one does not replace it,
an object is dropped only when a complete list of its kind lacks it, and a
list that fails half-way (504, a timeout) keeps the whole cache and is
retried with backoff.
"""

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
import pytest

import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, priming, resync
from gpuhealth_operator.shared import context, settings

LIST_VERSION = "100"


class Paged(kube.Kube):
    """Answers LISTs from `objects` (path → bodies) in pages; writes nothing; can fail one page."""

    def __init__(self, objects: Mapping[str, list[dict[str, Any]]]) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.objects = objects
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.fail_at: tuple[str, str] | None = None
        """(path, continue token): answer that page once with 504, as a lagging watch cache does."""
        self.cache_sizes: list[int] = []
        self.ctx: context.Context | None = None

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        query = dict(query or {})
        self.queries.append((path, query))
        if self.ctx is not None and path == resync.GPUNODES_PATH:
            self.cache_sizes.append(len(self.ctx.cache.gpunodes))
        token = query.get("continue", "")
        if self.fail_at == (path, token):
            self.fail_at = None
            raise kube.ApiError(504, "Gateway Timeout", "Timeout: Too large resource version: 25468")
        start = int(token or 0)
        limit = int(query["limit"])
        items = self.objects.get(path, [])
        rest = start + limit < len(items)
        meta = {"resourceVersion": LIST_VERSION, **({"continue": str(start + limit)} if rest else {})}
        return {"metadata": meta, "items": [dict(i) for i in items[start : start + limit]]}


def node(name: str, version: str, pool: str = "gpu") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version, "labels": {"pool": pool}}, "spec": {}}


def gpunode(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "status": {}}


def kept_cache(client: Paged) -> context.Context:
    """A context over a cache an earlier term left: nodes `kept` and `deleted` at version 50."""
    ctx = operator_context.new_context(client)
    for name in ("kept", "deleted"):
        ctx.cache.put_node(node(name, "50"))
        ctx.cache.put_gpunode(gpunode(name, "50"), ctx.clock())
    return operator_context.new_context(client, instance="t2", cluster=ctx.cache)


def test_backoff_doubles_from_the_retry_period_up_to_a_cap() -> None:
    assert priming.backoff_seconds(0, 2.0) == 0.0
    assert [priming.backoff_seconds(n, 2.0) for n in (1, 2, 3, 4, 5, 6)] == [2, 4, 8, 16, 30, 30]
    assert priming.backoff_seconds(1000, 2.0, cap_seconds=7) == 7


def test_pages_are_asked_for_one_at_a_time_with_a_limit_and_the_first_pages_version() -> None:
    async def scenario() -> None:
        client = Paged({resync.NODES_PATH: [node(f"n{i}", "1") for i in range(600)]})
        seen = []
        async for items, version in client.pages(resync.NODES_PATH):
            seen.append((len(items), version, len(client.queries)))
        assert seen == [(250, "100", 1), (250, "100", 2), (100, "100", 3)]
        assert all(q["limit"] == str(kube.LIST_PAGE_SIZE) for _, q in client.queries)

    asyncio.run(scenario())


def test_each_page_is_in_the_cache_before_the_next_is_asked_for() -> None:
    async def scenario() -> None:
        names = [f"g{i}" for i in range(600)]
        client = Paged(
            {
                resync.NODES_PATH: [node(n, "60") for n in names],
                resync.GPUNODES_PATH: [gpunode(n, "60") for n in names],
            }
        )
        ctx = operator_context.new_context(client)
        client.ctx = ctx
        await priming.prime(ctx)
        assert client.cache_sizes == [0, 250, 500]
        assert len(ctx.cache.gpunodes) == 600

    asyncio.run(scenario())


def test_a_new_term_lists_into_the_kept_cache_and_drops_only_what_a_complete_list_lacks() -> None:
    async def scenario() -> None:
        client = Paged(
            {
                resync.NODES_PATH: [node("kept", "60", pool="moved"), node("new", "70")],
                resync.GPUNODES_PATH: [gpunode("kept", "40"), gpunode("new", "70")],
            }
        )
        ctx = kept_cache(client)
        primed = await priming.prime(ctx)

        assert primed.pruned == {"nodes": ["deleted"], "gpunodes": ["deleted"], "policies": []}
        assert primed.listed == {"nodes": 2, "gpunodes": 2, "policies": 0, "agent pods": 0}
        # The term's Node and GPUNode watches start where these lists ended, not with a LIST of their own.
        assert primed.versions == {resync.NODES_PATH: LIST_VERSION, resync.GPUNODES_PATH: LIST_VERSION}
        assert set(ctx.cache.nodes) == set(ctx.cache.gpunodes) == {"kept", "new"}
        kept = ctx.cache.node("kept")
        assert kept is not None and kept.view.labels == {"pool": "moved"}  # the newer listing replaced it
        record = ctx.cache.gpunode("kept")
        assert record is not None and record.resource_version == "50"  # an older listing did not

    asyncio.run(scenario())


def test_a_list_that_fails_half_way_keeps_the_cache_and_is_retried() -> None:
    async def scenario() -> None:
        nodes = [node("kept", "60")] + [node(f"x{i}", "60") for i in range(300)]
        client = Paged({resync.NODES_PATH: nodes, resync.GPUNODES_PATH: [gpunode("kept", "60")]})
        ctx = kept_cache(client)
        client.fail_at = (resync.NODES_PATH, "250")

        with pytest.raises(kube.ApiError):
            await priming.prime(ctx)
        # The first page landed; nothing was dropped: "deleted" waits for a complete list.
        assert {"kept", "deleted", "x0"} <= set(ctx.cache.nodes)
        assert "deleted" in ctx.cache.gpunodes

        client.fail_at = (resync.NODES_PATH, "250")
        primed = await asyncio.wait_for(priming.prime_until_done(ctx, retry_seconds=0.01), 5)
        assert primed.pruned["nodes"] == ["deleted"]
        assert len(ctx.cache.nodes) == 301
        assert "deleted" not in ctx.cache.gpunodes

    asyncio.run(scenario())


def test_kopf_lists_in_pages_too() -> None:
    kopf_settings = kopf.OperatorSettings()
    handlers.configure(kopf_settings)
    assert kopf_settings.watching.chunk_size == kube.LIST_PAGE_SIZE


def test_priming_takes_only_the_agent_daemonsets_pods_in_its_namespace() -> None:
    """A tenant's pod with the agent's labels, listed at the start of a term, is not an agent."""

    def agent_pod(namespace: str, node_name: str, owner: str) -> dict[str, Any]:
        owners = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u", "controller": True}]
        return {
            "metadata": {"namespace": namespace, "name": f"a-{node_name}", "ownerReferences": owners},
            "spec": {"nodeName": node_name},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }

    async def scenario() -> None:
        ours = settings.Settings().agent_pod_namespace or ""
        pods = [agent_pod(ours, "n1", "DaemonSet"), agent_pod("tenant", "n2", "DaemonSet")]
        pods.append(agent_pod(ours, "n3", "ReplicaSet"))
        ctx = kept_cache(Paged({priming.PODS_PATH: pods}))
        primed = await priming.prime(ctx)
        assert primed.listed["agent pods"] == 1
        assert set(ctx.agent_pods.nodes) == {"n1"}

    asyncio.run(scenario())
