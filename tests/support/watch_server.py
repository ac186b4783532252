"""A local HTTP server playing the API server's LIST and WATCH of one kind, for the unit tests of our
watches (`runtime/watching.py` and the watches built on it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

import local_http

HANG: dict[str, Any] = {}
"""In a watch's script: the stream goes silent from there on and stays open (a half-open connection)."""


def node(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


class ApiServer:
    """LISTs answer from `objects` (two per page); each WATCH plays the next script of `watches`:
    a list of events, then the stream ends (or, for the last script, stays open). Each LIST after the
    first answers from the next of `later` where there is one (what changed while no watch saw it)."""

    def __init__(
        self,
        objects: list[dict[str, Any]],
        version: str,
        watches: list[list[dict[str, Any]]],
        later: list[list[dict[str, Any]]] | None = None,
    ) -> None:
        self.objects = objects
        self.later = list(later or [])
        self.lists = 0
        self.version = version
        self.watches = watches
        self.requests: list[dict[str, str]] = []
        self.url = ""
        self._serving = local_http.Serving(self.handle)
        self.open_watches = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(query)
        if query.get("watch") != "true":
            start = int(query.get("continue") or 0)
            if not start:
                self.lists += 1
                if self.lists > 1 and self.later:
                    self.objects = self.later.pop(0)
            page = self.objects[start : start + 2]
            more = start + 2 < len(self.objects)
            meta = {"resourceVersion": self.version, **({"continue": str(start + 2)} if more else {})}
            return web.json_response({"metadata": meta, "items": page})
        script = self.watches.pop(0) if self.watches else None
        if script is not None and script and isinstance(script[0].get("status"), int):  # refused outright
            return web.json_response(script[0], status=script[0]["status"])
        response = web.StreamResponse()
        await response.prepare(request)
        for event in script or []:
            if event is HANG:  # a connection gone dead: nothing more comes, nothing ends it
                await asyncio.Event().wait()
            await response.write(json.dumps(event).encode() + b"\n")
        if script is None:  # the last watch stays open, as a quiet one does
            self.open_watches.set()
            await asyncio.Event().wait()
        return response

    async def __aenter__(self) -> ApiServer:
        self.url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._serving.__aexit__()
