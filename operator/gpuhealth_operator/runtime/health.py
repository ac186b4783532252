"""The /healthz liveness endpoint, served by every replica (leader or standby).

It answers from the event loop, so a wedged loop fails the probe and the
kubelet restarts the container. The body says whether this replica leads.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web


@dataclasses.dataclass
class Health:
    leading: bool = False
    _runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "leader": self.leading})

    async def start(self, port: int) -> None:
        if not port:
            return
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "0.0.0.0", port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
