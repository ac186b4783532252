"""`--node-selector`: one operator per node pool caches only the pool's Nodes and their GPUNodes.

The API server filters the Node watch and list (a Node that stops matching
arrives as DELETED); GPUNodes carry no Node labels, so the operator keeps a
GPUNode only while its Node (same name) is in the cache, and reads it once
when its Node joins the pool.
"""

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import kopf
import pytest

import handling
import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import cli, handlers, priming, resync
from gpuhealth_operator.shared import context, settings

POOL = "pool=a"
NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


def node(name: str, pool: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "10", "labels": {"pool": pool}}, "spec": {}}


def gpunode(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "10"}, "status": {}}


class Cluster(kube.Kube):
    """Nodes in pools a and b with their GPUNodes; LISTs honour `labelSelector` (k=v) as the API server."""

    def __init__(self, nodes: Mapping[str, str], status: int = 200) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.nodes = dict(nodes)
        self.status = status
        self.paths: list[str] = []

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        self.paths.append(path)
        if self.status != 200:
            raise kube.ApiError(self.status, "Bad Request", "unable to parse requirement")
        selector = (query or {}).get("labelSelector", "")
        meta = {"resourceVersion": "100"}
        if path == resync.NODES_PATH:
            key, _, value = selector.partition("=")
            items = [node(n, p) for n, p in self.nodes.items() if not selector or {key: value} == {"pool": p}]
            return {"metadata": meta, "items": items}
        if path == resync.GPUNODES_PATH:
            return {"metadata": meta, "items": [gpunode(n) for n in self.nodes]}
        if path.startswith(resync.GPUNODES_PATH + "/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.nodes:
                raise kube.ApiError(404, "Not Found", name)
            return gpunode(name)
        return {"metadata": meta, "items": []}

    list_names = get  # names are all a resync reads


def pooled(client: Cluster, selector: str = POOL) -> context.Context:
    config = settings.Settings(node_selector=selector, agent_pod_selector="")
    return operator_context.new_context(client, config=config)


def event(kind: str | None, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": body}  # type: ignore[typeddict-item]


def test_the_flag_is_parsed_and_defaults_to_every_node() -> None:
    assert cli.parse_args([]).node_selector == ""
    assert cli.parse_args(["--node-selector=pool=a"]).node_selector == "pool=a"


def test_only_the_pools_nodes_are_watched_and_every_gpunode() -> None:
    config = settings.Settings(node_selector=POOL, agent_pod_selector="")
    client = kube.Kube(kube.Credentials("http://127.0.0.1:1", None, True, None, None, None))
    ctx = operator_context.new_context(client, config=config)
    assert [(w.kind, w.label_selector) for w in handlers.watches(ctx, lambda: None)] == [
        ("nodes", POOL),
        ("gpunodes", ""),  # another pool's are ignored by `handlers.in_pool`
    ]


def test_priming_caches_the_pools_nodes_and_only_their_gpunodes() -> None:
    async def scenario() -> None:
        ctx = pooled(Cluster({"a1": "a", "a2": "a", "b1": "b"}))
        await priming.prime(ctx)
        assert set(ctx.cache.nodes) == set(ctx.cache.gpunodes) == {"a1", "a2"}

    asyncio.run(scenario())


def test_without_a_selector_every_node_is_cached() -> None:
    async def scenario() -> None:
        ctx = pooled(Cluster({"a1": "a", "b1": "b"}), selector="")
        await priming.prime(ctx)
        assert set(ctx.cache.gpunodes) == {"a1", "b1"}

    asyncio.run(scenario())


def test_another_pools_gpunode_events_are_dropped() -> None:
    async def scenario() -> None:
        ctx = pooled(Cluster({"a1": "a", "b1": "b"}))
        await priming.prime(ctx)
        await handling.handle(handlers.on_gpunode, event("MODIFIED", gpunode("b1")), ctx)
        assert "b1" not in ctx.cache.gpunodes

    asyncio.run(scenario())


def test_a_node_that_joins_the_pool_brings_its_gpunode_and_one_that_leaves_takes_it_away() -> None:
    async def scenario() -> None:
        client = Cluster({"a1": "a", "b1": "b"})
        ctx = pooled(client)
        await priming.prime(ctx)
        # b1 relabelled into pool a: the filtered watch shows it as ADDED; its GPUNode is read once.
        await handling.handle(handlers.on_node, event("ADDED", node("b1", "a")), ctx)
        assert "b1" in ctx.cache.gpunodes
        assert client.paths.count(f"{resync.GPUNODES_PATH}/b1") == 1
        # a1 relabelled out of the pool: the filtered watch shows it as DELETED.
        await handling.handle(handlers.on_node, event("DELETED", node("a1", "b")), ctx)
        assert "a1" not in ctx.cache.nodes
        assert "a1" not in ctx.cache.gpunodes

    asyncio.run(scenario())


def test_a_selector_the_api_server_cannot_parse_stops_the_operator_with_its_answer() -> None:
    async def scenario() -> None:
        ctx = pooled(Cluster({}, status=400), selector="pool in (a")
        with pytest.raises(kube.ApiError, match="unable to parse"):
            await asyncio.wait_for(priming.prime_until_done(ctx, retry_seconds=0.01), 5)

    asyncio.run(scenario())


def test_a_deleted_node_forgets_its_gpu_pods_but_one_that_left_the_pool_keeps_them() -> None:
    """The active checks' index of GPU pods (`state/gpu_pods.py`): a Node relabelled out of the pool and
    back must not look idle while its GPU pod still runs (no event of that pod came meanwhile)."""
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}

    async def scenario(selector: str) -> set[str]:
        ctx = pooled(Cluster({"a1": "a"}), selector=selector)
        await priming.prime(ctx)
        pods = ctx.steps.check.pods
        pods.listing()
        pods.observe(
            None, {"metadata": {"uid": "u"}, "spec": {"nodeName": "a1", "containers": [container]}}, NOW
        )
        pods.listed(NOW)
        await handling.handle(handlers.on_node, event("DELETED", node("a1", "b")), ctx)
        return set(pods.busy)

    assert asyncio.run(scenario(POOL)) == {"a1"}, "left the pool: its pod still runs there"
    assert asyncio.run(scenario("")) == set(), "deleted: its pods go with it"
