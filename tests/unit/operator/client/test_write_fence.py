"""The write fence: a replica whose term does not allow writes sends none, however long it queued."""

import asyncio

import pytest
from aiohttp import web

from gpuhealth_operator.client import kube


class Server:
    """A local HTTP server that records what it received; `hold` keeps requests open."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.arrived = asyncio.Event()
        self.hold = asyncio.Event()
        self.hold.set()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(f"{request.method} {request.path}")
        self.arrived.set()
        await self.hold.wait()
        return web.json_response({})


def client(url: str, fence: list[bool], pool_size: int = 4) -> kube.Kube:
    credentials = kube.Credentials(url, None, True, None, None, None)
    return kube.Kube(credentials, pool_size=pool_size, fence=lambda: fence[0])


def run(coroutine: object) -> None:
    asyncio.run(coroutine)  # type: ignore[arg-type]


def test_writes_are_refused_and_never_sent_while_the_fence_is_closed() -> None:
    async def scenario() -> None:
        recorded = Server()
        async with _serving(recorded):
            fence = [False]
            kube_client = client(recorded.url, fence)
            try:
                for method in ("POST", "PUT", "PATCH", "DELETE"):
                    with pytest.raises(kube.NotLeading):
                        await kube_client.request(method, "/api/v1/nodes/a", body={})
                await kube_client.get("/api/v1/nodes/a")
                await kube_client.request(
                    "PUT", "/apis/coordination.k8s.io/v1/leases/l", body={}, exempt=True
                )
                fence[0] = True
                await kube_client.patch("/api/v1/nodes/a", {})
            finally:
                await kube_client.close()
        assert recorded.received == [
            "GET /api/v1/nodes/a",
            "PUT /apis/coordination.k8s.io/v1/leases/l",
            "PATCH /api/v1/nodes/a",
        ]

    run(scenario())


def test_a_write_queued_for_a_connection_is_judged_when_it_leaves_not_when_it_queued() -> None:
    async def scenario() -> None:
        recorded = Server()
        async with _serving(recorded):
            fence = [True]
            kube_client = client(recorded.url, fence, pool_size=1)
            try:
                recorded.hold.clear()
                first = asyncio.create_task(kube_client.patch("/api/v1/nodes/first", {}))
                await recorded.arrived.wait()
                # The only connection is busy: this write passes the first check and waits in the pool.
                queued = asyncio.create_task(kube_client.patch("/api/v1/nodes/queued", {}))
                await asyncio.sleep(0.1)
                assert not queued.done()
                fence[0] = False  # the deadline passes while it waits
                recorded.hold.set()
                await first
                with pytest.raises(kube.NotLeading):
                    await queued
            finally:
                await kube_client.close()
        assert recorded.received == ["PATCH /api/v1/nodes/first"]

    run(scenario())


class _serving:
    """Serve `recorded` on a free loopback port for the duration of the block."""

    def __init__(self, recorded: Server) -> None:
        self.recorded = recorded
        self.runner: web.AppRunner | None = None

    async def __aenter__(self) -> Server:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.recorded.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.recorded.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.recorded

    async def __aexit__(self, *_: object) -> None:
        self.recorded.hold.set()
        assert self.runner is not None
        await self.runner.cleanup()
