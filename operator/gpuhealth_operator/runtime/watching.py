"""Our own LIST + WATCH of Nodes and GPUNodes, the two kinds whose events are most of the operator's work.

kopf takes each watch event through a per-object worker, cause detection,
its handler registry and a kwargs-rich invocation: at 5,000 nodes at rest
(~47 events/s, two thirds of them Node heartbeats that change nothing we
read) that was a third of the operator's CPU. Here an event costs its JSON
decoding and one hand-over. Policies and agent pods, a few events a minute,
stay with kopf.

The events are the ones the handlers were written for under kopf: an initial
LIST delivers every object as an event of type None, then the WATCH's
ADDED / MODIFIED / DELETED follow from the list's resourceVersion. A term's
watches start from the versions of its priming's lists instead (`since`):
the cache already holds what a LIST would bring, and at 5,000 nodes that
LIST is 10,000 objects to decode again for nothing. Events of
one object (by name: a Node deleted and created again is one name in the
cache) are handled one at a time in order; different objects concurrently.
When the API server no longer has the history to resume from (410 Gone, or
an ERROR event), the kind is listed again, which says nothing of what was
deleted meanwhile: `relisted` is called for the resync to prune that (also
for the first LIST of a watch that started from priming's version). A watch
cache that has not caught up with the version yet (504, "Too large resource
version": a saturated API server, right after a LIST read from etcd) is
waited for instead: a LIST would add to the load that keeps it behind. Any
watch that ends or fails resumes from the last version it delivered.

A watch whose handler keeps a whole-kind index (the GPU pods, `gpu_pod_watch`) is given a `Snapshot`:
told as each LIST begins, and once every object of it has been handled, so that the LIST replaces
what the index held (what was deleted meanwhile goes) and the index is not read half-filled.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp

from gpuhealth_operator.client import kube

logger = logging.getLogger(__name__)

Event = dict[str, object]
Handler = Callable[[Event], Awaitable[None]]

SERVER_TIMEOUT_SECONDS = 300
"""How long the API server holds one watch before it ends it (we then resume from the last version)."""
CLIENT_MARGIN_SECONDS = 60.0
"""Beyond the server's timeout, how long before we give up on a stream that went quiet without ending."""
QUIET_SECONDS = 90.0
"""How long a watch may send nothing before it is taken for dead and opened again from its last version.
The API server sends a bookmark about every minute to a watch that asked for them, so a live stream is
never quiet this long; a half-open connection (a load balancer failed over, a NAT entry expired) is,
and without this it would hide every event until the server's timeout ended it (5 minutes)."""
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Waits between failed attempts (the last repeats), counted again after a watch that ended normally."""
QUICK_END_SECONDS = 1.0


class Dispatcher:
    """Hands events to `handler`: in order for one object, concurrently across objects."""

    def __init__(self, handler: Handler, kind: str) -> None:
        self._handler = handler
        self._kind = kind
        self._queues: dict[str, collections.deque[Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, name: str, event: Event) -> None:
        queue = self._queues.get(name)
        if queue is not None:  # its worker is running: it takes this one after the ones before
            queue.append(event)
            return
        self._queues[name] = collections.deque((event,))
        self._idle.clear()
        task = asyncio.create_task(self._drain(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, name: str) -> None:
        queue = self._queues[name]
        try:
            while queue:
                event = queue.popleft()
                try:
                    await self._handler(event)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("handling a %s event of %s failed", self._kind, name)
        finally:
            del self._queues[name]
            if not self._queues:
                self._idle.set()

    async def idle(self) -> None:
        """Until every event handed over has been handled."""
        await self._idle.wait()

    async def close(self) -> None:
        """Stop every handler still running (the term is over: its writes are fenced already)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


class Gone(Exception):
    """The watch cannot resume from the version it has: the kind must be listed again."""


class Behind(Exception):
    """The API server's watch cache has not reached the version asked for yet (504, "Too large resource
    version"): the version is good, so the watch waits and asks again from it, as after a dropped stream."""


BEHIND_CODE = 504
"""An ERROR event's code for `Behind` (the API server's `Timeout: Too large resource version`)."""


class Snapshot(Protocol):
    """What a watch tells an index its LISTs replace (`Watch(snapshot=...)`)."""

    def listing(self) -> None:
        """A LIST begins: the objects it brings (events of type None) replace everything known."""

    def listed(self) -> None:
        """The LIST is complete and every object of it has been handled."""


class Watch:
    """One kind, listed then watched, for as long as `run` runs (the leader's term)."""

    def __init__(
        self,
        client: kube.Kube,
        path: str,
        handler: Handler,
        *,
        label_selector: str = "",
        field_selector: str = "",
        relisted: Callable[[], None] | None = None,
        snapshot: Snapshot | None = None,
        server_timeout_seconds: int = SERVER_TIMEOUT_SECONDS,
        quiet_seconds: float = QUIET_SECONDS,
        since: str | None = None,
    ) -> None:
        self._client = client
        self._path = path
        self.label_selector = label_selector
        self._selector = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            self._selector["fieldSelector"] = field_selector
        self._relisted = relisted
        self._snapshot = snapshot
        self._server_timeout = server_timeout_seconds
        self._quiet = quiet_seconds
        self.kind = path.rsplit("/", 1)[-1]
        self.dispatcher = Dispatcher(handler, self.kind)
        self._since = since or None
        self._version = self._since
        """Where the next watch starts: the last version a stream delivered (None: list first)."""
        self.lists = 0
        """LISTs completed this term (the first is the term's own unless it started from `since`; every
        other one is a re-list)."""

    async def run(self) -> None:
        failures = 0
        try:
            while True:
                try:
                    if self._version is None:
                        self._version = await self._list()
                    began = asyncio.get_running_loop().time()
                    await self._watch(self._version)
                    failures = 0
                    if asyncio.get_running_loop().time() - began < QUICK_END_SECONDS:
                        await asyncio.sleep(RETRY_SECONDS[0])  # a server that ends every watch at once
                except Gone as gone:
                    logger.info("watch of %s must list again: %s", self._path, gone)
                    self._version = None
                except (aiohttp.ClientError, TimeoutError, kube.ApiError, ValueError, Behind) as error:
                    # ValueError: a line that is not JSON (a proxy's error page, a cut stream). Each
                    # resumes from the last version the stream delivered (`_watch` keeps it).
                    wait = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                    failures += 1
                    logger.warning("watch of %s failed (again in %.1f s): %r", self._path, wait, error)
                    await asyncio.sleep(wait)
        finally:
            await self.dispatcher.close()

    async def _list(self) -> str:
        version = ""
        if self._snapshot is not None:
            await self.dispatcher.idle()  # the last stream's events land before the LIST that replaces them
            self._snapshot.listing()
        async for items, listed in self._client.pages(self._path, self._selector):
            version = listed
            for item in items:
                self.dispatcher.put(_name(item), {"type": None, "object": item})
        if self._snapshot is not None:
            await self.dispatcher.idle()
            self._snapshot.listed()
        self.lists += 1
        if (self.lists > 1 or self._since is not None) and self._relisted is not None:
            self._relisted()
        return version

    async def _watch(self, since: str) -> None:
        """Watch from `since` (`_version`) until the server ends the stream, moving `_version` to each
        version seen (where the next watch resumes, also after a stream that failed half-way)."""
        query = {
            **self._selector,
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._server_timeout),
        }
        try:
            async for event in self._client.watch(
                self._path,
                query,
                timeout_seconds=self._server_timeout + CLIENT_MARGIN_SECONDS,
                quiet_seconds=self._quiet,
            ):
                kind, body = event.get("type"), event.get("object")
                if not isinstance(body, dict):
                    continue
                if kind == "ERROR" and body.get("code") == BEHIND_CODE:
                    raise Behind(str(body.get("message")))
                if kind == "ERROR":  # 410 Gone, or another reason it cannot go on from its version
                    raise Gone(f"{body.get('code')} {body.get('message')}")
                self._version = str((body.get("metadata") or {}).get("resourceVersion") or self._version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.dispatcher.put(_name(body), event)
        except kube.ApiError as error:
            if error.status == 410:
                raise Gone(str(error)) from error
            raise


def _name(body: dict[str, object]) -> str:
    meta = body.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""
