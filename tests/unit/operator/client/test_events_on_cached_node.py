"""An Event said about a cached Node (`emit_on`, `announce_on`) names it as `events.subject` does."""

import asyncio
import datetime
from typing import Any, cast

from gpuhealth_operator.client import events, kube
from gpuhealth_operator.state import cache

NOW = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)


class Posted:
    """The Events created, as the API server stores them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return body


def _cluster() -> cache.ClusterCache:
    nodes = cache.ClusterCache()
    nodes.put_node({"metadata": {"name": "gpu-1", "uid": "node-uid", "resourceVersion": "1"}, "spec": {}})
    nodes.put_gpunode({"metadata": {"name": "gpu-1", "uid": "gpunode-uid", "resourceVersion": "1"}}, NOW)
    return nodes


def _said(say: str, nodes: cache.ClusterCache, name: str) -> list[dict[str, Any]]:
    posted = Posted()
    recorder = events.Recorder(client=cast(kube.Kube, posted), instance="test")
    if say == "emit_on":
        asyncio.run(recorder.emit_on(nodes, name, "NodeCordoned", "cordoned", events.WARNING))
    elif say == "announce_on":
        asyncio.run(recorder.announce_on(nodes, name, "NodeCordoned", "cordoned", "t", events.WARNING))
    elif say == "emit":
        asyncio.run(recorder.emit(events.subject(nodes, name), "NodeCordoned", "cordoned", events.WARNING))
    else:
        asyncio.run(
            recorder.announce(events.subject(nodes, name), "NodeCordoned", "cordoned", "t", events.WARNING)
        )
    for body in posted.bodies:  # when it was said is not what it says
        body.pop("firstTimestamp")
        body.pop("lastTimestamp")
    return posted.bodies


def test_an_event_on_a_cached_node_carries_the_uids_the_cache_knows() -> None:
    nodes = _cluster()
    for one_call, two_calls in (("emit_on", "emit"), ("announce_on", "announce")):
        said = _said(one_call, nodes, "gpu-1")
        assert said == _said(two_calls, nodes, "gpu-1")
        assert said[0]["involvedObject"]["uid"] == "node-uid"
        assert said[0]["related"]["uid"] == "gpunode-uid"
        # A Node the cache does not know (gone): the Event names it without uids, as `subject` does.
        assert _said(one_call, nodes, "gone") == _said(two_calls, nodes, "gone")
