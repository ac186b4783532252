"""The request timeout bounds the API server's answer, not the wait for a pooled connection.

In a start-up flood (5,000 nodes judged at once, 8 connections) writes queue for
a connection far longer than any one answer takes; counting that queue against
the timeout expired them unsent and made the operator retry them all.
"""

import asyncio
import time

import pytest
from aiohttp import web

import local_http
from gpuhealth_operator.client import kube


class SlowServer:
    """Answers every request after `delay` seconds; `stuck` paths never get an answer."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.answered = 0
        self.url = ""
        self.released = asyncio.Event()
        self._serving = local_http.Serving(self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        if request.path.startswith("/stuck"):
            await self.released.wait()  # until the server closes: no handler task left pending
        await asyncio.sleep(self.delay)
        self.answered += 1
        return web.json_response({"path": request.path})

    async def __aenter__(self) -> "SlowServer":
        self.url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.released.set()
        await self._serving.__aexit__()


def client(url: str, timeout: float) -> kube.Kube:
    credentials = kube.Credentials(url, None, True, None, None, None)
    return kube.Kube(credentials, pool_size=1, timeout_seconds=timeout)


def test_requests_queued_for_the_only_connection_longer_than_the_timeout_still_complete() -> None:
    async def scenario() -> None:
        async with SlowServer(delay=0.3) as server:
            kube_client = client(server.url, timeout=1.0)
            try:
                # Eight requests through one connection: the last waits ~2.1 s for it, twice the timeout.
                answers = await asyncio.gather(
                    *(kube_client.patch(f"/api/v1/nodes/n{i}", {}) for i in range(8))
                )
            finally:
                await kube_client.close()
        assert [a["path"] for a in answers] == [f"/api/v1/nodes/n{i}" for i in range(8)]
        assert server.answered == 8

    asyncio.run(scenario())


def test_an_answer_that_never_comes_still_times_out() -> None:
    async def scenario() -> float:
        async with SlowServer(delay=0.0) as server:
            kube_client = client(server.url, timeout=0.5)
            started = time.monotonic()
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await kube_client.get("/stuck/forever")
            finally:
                await kube_client.close()
            return time.monotonic() - started

    assert asyncio.run(scenario()) < 5.0
