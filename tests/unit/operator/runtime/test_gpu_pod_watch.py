"""Issue 51: the watch of pods that feeds the active checks' index of GPU pods (`runtime/gpu_pod_watch`).

It asks the API server for the pods not ended only (a server-side field selector), its LIST replaces
the index (also after 410 Gone: the pods deleted meanwhile go), and it runs only while a policy wants
active checks. A local HTTP server plays the API server (`watch_server`).
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import operator_context
from drain_cluster import until
from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import gpu_pod_watch
from gpuhealth_operator.shared import context, settings
from watch_server import ApiServer

GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
CHECKING = policies.parse_policy(
    "p",
    1,
    {
        "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Event"}],
        "activeChecks": [
            {"name": "q", "template": "DcgmDiagQuick", "everySeconds": 3600, "idleForSeconds": 60}
        ],
    },
)


def gpu_pod(name: str, node: str, version: str) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}}
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"nodeName": node, "containers": [container]},
    }


def new_context(server: ApiServer) -> context.Context:
    client = kube.Kube(kube.Credentials(server.url, None, True, None, None, None))
    return operator_context.new_context(client, config=settings.Settings(tick_seconds=0.02))


def test_the_list_fills_the_index_and_a_list_after_gone_replaces_it() -> None:
    server = ApiServer(
        [gpu_pod("a", "n1", "3"), gpu_pod("b", "n2", "4"), gpu_pod("c", "n3", "5")],
        "7",
        [[{"type": "ADDED", "object": gpu_pod("d", "n4", "8")}, GONE]],
        later=[[gpu_pod("b", "n2", "4"), gpu_pod("e", "n5", "9")]],  # a, c, d deleted during the gap
    )
    busy: list[set[str]] = []

    async def scenario() -> None:
        async with server:
            ctx = new_context(server)
            pods = ctx.steps.check.pods
            applied = pods.listed

            def listed(now: datetime.datetime) -> None:  # what each LIST left in the index
                applied(now)
                busy.append(set(pods.busy))

            pods.listed = listed  # type: ignore[method-assign]
            watch = gpu_pod_watch.watch(ctx)
            task = asyncio.create_task(watch.run())
            try:
                await asyncio.wait_for(server.open_watches.wait(), timeout=20)
                await asyncio.wait_for(watch.dispatcher.idle(), timeout=20)
                assert pods.synced
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await ctx.client.close()

    asyncio.run(scenario())
    assert busy == [{"n1", "n2", "n3"}, {"n2", "n5"}], "the LIST after 410 Gone replaced the index"
    assert server.lists == 2
    assert all(r.get("fieldSelector") == gpu_pod_watch.NOT_ENDED for r in server.requests)


def test_the_watch_runs_only_while_a_policy_wants_checks() -> None:
    server = ApiServer([gpu_pod("a", "n1", "3")], "7", [])

    async def scenario() -> None:
        async with server:
            ctx = new_context(server)
            task = asyncio.create_task(gpu_pod_watch.run(ctx))
            try:
                await asyncio.sleep(0.1)  # several looks (every 0.02 s) with no policy wanting checks
                assert server.requests == [], "a cluster without checks pays nothing"
                ctx.cache.put_policy(CHECKING)
                await until(lambda: ctx.steps.check.pods.synced, what="the watch started and listed")
                assert set(ctx.steps.check.pods.busy) == {"n1"}
                ctx.cache.remove_policy("p")
                await until(lambda: not ctx.steps.check.pods.synced, what="the watch stopped")
                assert not ctx.steps.check.pods.busy, "the index is emptied with it"
                asked = len(server.requests)
                await asyncio.sleep(0.1)
                assert len(server.requests) == asked
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await ctx.client.close()

    asyncio.run(scenario())
