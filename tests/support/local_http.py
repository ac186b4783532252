"""A local HTTP server for the unit tests of the operator's own HTTP client (`kube`, `watching`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web


class Serving:
    """Serve every path and method with `handle` on a free loopback port for the duration of the block;
    the block gets the server's URL."""

    def __init__(self, handle: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self._handle = handle
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
