"""The HTTP client of the API server: one aiohttp session, the write fence, cordons first.

`Kube` sends each request through one connection pool, counts it for the metrics, holds every other
request back while a cordon is in flight (`urgent`), and asks the fence right before a write leaves
(`NotLeading` otherwise). The verbs over `request` are `wire.Verbs`'; reading collections is `listing`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import ssl
import time
import types
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp

from gpuhealth_operator.client import auth, kubeconfigs, latency, listing, wire
from gpuhealth_operator.client.api_errors import ApiError, NotLeading
from gpuhealth_operator.client.wire import JsonObject

logger = logging.getLogger(__name__)

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Verbs that write; with a fence, each is checked against it right before it is sent."""
URGENT_QUIET_SECONDS = 0.25
"""Requests that are not urgent wait this long after the last urgent one started."""


@dataclasses.dataclass(frozen=True)
class _Guarded:
    """Marks a request the fence must allow once more when its connection is ready."""

    method: str
    path: str


class Kube(wire.Verbs):
    """One connection pool to the API server; counts requests for the metrics."""

    def __init__(
        self,
        credentials: kubeconfigs.Credentials,
        *,
        timeout_seconds: float = 30.0,
        pool_size: int = 8,
        on_request: Callable[[str], None] | None = None,
        fence: Callable[[], bool] | None = None,
        user_agent: str = "gpu-health-operator",
    ) -> None:
        self.credentials = credentials
        self._on_request = on_request
        self.fence = fence
        """Asked right before each non-exempt write is sent (see `request`); None: every write goes."""
        self._user_agent = user_agent
        # The timeout bounds the server (connecting, then each wait for its next bytes), not the queue for a
        # pooled connection: in a start-up flood writes wait there longer than any answer takes, and a
        # `total` deadline expired them unsent, to be retried (1,324 in one 5,000-node start-up). A queued
        # write is still fenced when it leaves (`_fence_trace`); the leader's Lease has its own client.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=timeout_seconds, sock_read=timeout_seconds
        )
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self.requests_total = 0
        """Requests sent so far (every verb), for the request-rate metric and the bench."""
        self._urgent_in_flight = 0
        self._no_urgent = asyncio.Event()
        self._no_urgent.set()
        self._last_urgent = float("-inf")
        self._token_read_at = time.monotonic()

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if self.credentials.insecure:
            return False
        context = ssl.create_default_context(cafile=self.credentials.ca_path)
        if self.credentials.certificate_path:
            context.load_cert_chain(self.credentials.certificate_path, self.credentials.private_key_path)
        return context

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": self._user_agent}
            if self.credentials.token:
                headers["Authorization"] = f"Bearer {self.credentials.token}"
            connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=self._pool_size)
            self._session = aiohttp.ClientSession(
                base_url=self.credentials.server.rstrip("/") + "/",
                headers=headers,
                connector=connector,
                timeout=self._timeout,
                trace_configs=[self._fence_trace()],
            )
        return self._session

    def _fence_trace(self) -> aiohttp.TraceConfig:
        """Ask the fence again once the request has its connection, the last step before it is sent.

        A write may wait long for a pooled connection (or for a connection to a
        struggling API server); the fence must judge the moment it leaves, not
        the moment it was queued. aiohttp releases the connection when a trace
        callback raises.
        """

        async def check(
            _session: aiohttp.ClientSession, context: types.SimpleNamespace, _params: object
        ) -> None:
            guarded = context.trace_request_ctx
            if isinstance(guarded, _Guarded):
                self._check_fence(guarded.method, guarded.path)

        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(check)
        trace.on_connection_create_start.append(check)
        trace.on_connection_create_end.append(check)
        return trace

    def _check_fence(self, method: str, path: str) -> None:
        if self.fence is not None and not self.fence():
            raise NotLeading(method, path)

    def _current_token(self) -> str | None:
        """The bearer token; an in-cluster one is re-read every TOKEN_REREAD_SECONDS (bound tokens expire)."""
        if (
            self.credentials.token_path
            and time.monotonic() - self._token_read_at >= auth.TOKEN_REREAD_SECONDS
        ):
            self._token_read_at = time.monotonic()
            self.credentials = auth.reread_token(self.credentials)
        return self.credentials.token

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
        urgent: bool = False,
        exempt: bool = False,
        accept: str = "application/json",
    ) -> JsonObject:
        """Send one request; return the decoded JSON body; raise ApiError on a non-2xx status.

        An `urgent` request (a cordon) goes out at once; the others wait while
        any urgent one is in flight, so that in a burst of faults every node's
        cordon reaches the API server before the Events and status writes that
        report on it. An `exempt` request (the leader Lease) never waits.

        A write that is not `exempt` goes out only while the fence allows it:
        asked here, and again right before it is sent; NotLeading otherwise.
        """
        guarded = method in MUTATING_METHODS and not exempt and self.fence is not None
        if guarded:
            self._check_fence(method, path)
        if urgent:
            self._urgent_in_flight += 1
            self._no_urgent.clear()
            self._last_urgent = time.monotonic()
            try:
                return await self._send(
                    method, path, query, body, content_type, guarded=guarded, accept=accept
                )
            finally:
                self._urgent_in_flight -= 1
                if not self._urgent_in_flight:
                    self._no_urgent.set()
        if not exempt:
            await self._wait_for_quiet()
        return await self._send(method, path, query, body, content_type, guarded=guarded, accept=accept)

    async def _wait_for_quiet(self) -> None:
        """Until no urgent request is in flight and none started for URGENT_QUIET_SECONDS.

        The quiet period matters in a burst: faults arrive one watch event at a
        time, and without it the reports on the first nodes would queue at the
        API server ahead of the cordons of the next ones.
        """
        while True:
            await self._no_urgent.wait()
            remaining = self._last_urgent + URGENT_QUIET_SECONDS - time.monotonic()
            if remaining <= 0 and self._no_urgent.is_set():
                return
            await asyncio.sleep(max(remaining, 0.01))

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: object,
        content_type: str,
        *,
        guarded: bool = False,
        accept: str = "application/json",
    ) -> JsonObject:
        self.requests_total += 1
        if self._on_request is not None:
            self._on_request(method)
        if method in MUTATING_METHODS:
            latency.write_sent()  # the pass's first write ends its event's own latency (`latency`)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        headers["Accept"] = accept
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = path.lstrip("/")
        if query:
            url += "?" + urllib.parse.urlencode(query)
        trace_context = _Guarded(method, path) if guarded else None
        async with self._get_session().request(
            method, url, data=data, headers=headers, trace_request_ctx=trace_context
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", text)
            result: JsonObject = json.loads(text) if text else {}
            return result

    async def list_names(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        """A collection page whose items may carry nothing but `metadata.name` (and the list's
        `metadata`: its resourceVersion, `continue`).

        Asked for as a Table without objects: ~60 bytes per GPUNode. Even their metadata alone
        (managedFields: every field of an agent's report) made the resync 11 % of the operator's
        CPU at rest at 5,000 nodes. A server that cannot print a Table answers with the whole
        list, which has the names too.
        """
        page = await self.request(
            "GET", path, query={**(query or {}), "includeObject": "None"}, accept=listing.NAMES_TABLE
        )
        return listing.table_names(page) if page.get("kind") == "Table" else page

    def pages(
        self, path: str, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[JsonObject], str]]:
        """A collection page by page (`listing.pages`): one page of decoded objects held at a time."""
        return listing.pages(self.get, path, query)

    async def watch(
        self, path: str, query: Mapping[str, str], timeout_seconds: float, quiet_seconds: float | None = None
    ) -> AsyncIterator[JsonObject]:
        """A watch's events (`watch=true` is added), each decoded as its line arrives, until the server
        ends the stream. `timeout_seconds` bounds the whole stream (the server's `timeoutSeconds` ends it
        sooner): a quiet watch sends nothing for minutes, which the pool's read timeout would end.
        `quiet_seconds`: the longest wait for the stream's next bytes; beyond it the stream is taken for a
        dead connection and ends as if the server had ended it (a connect that times out still raises).
        ApiError when the server refuses it (410 Gone: the version is too old). Not counted among the
        requests (`requests_total`, the metric): a stream is not a request rate."""
        headers = {"Accept": "application/json"}
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = path.lstrip("/") + "?" + urllib.parse.urlencode({**query, "watch": "true"})
        timeout = aiohttp.ClientTimeout(
            total=timeout_seconds, sock_connect=self._timeout.sock_connect, sock_read=quiet_seconds
        )
        async with self._get_session().get(url, headers=headers, timeout=timeout) as response:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", await response.text())
            try:
                async with contextlib.aclosing(listing.json_lines(response.content.iter_any())) as events:
                    async for event in events:
                        yield event
            except aiohttp.ServerTimeoutError:  # only the stream's read bound fires here: it went silent
                logger.info(
                    "watch of %s sent nothing for %.0f s: ended, to be opened again", path, quiet_seconds
                )
