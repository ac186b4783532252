"""A thin asyncio client for the Kubernetes API: JSON in, JSON out.

The operator talks to a handful of endpoints with plain dict bodies
(merge/strategic patches, server-side apply, evictions, Events, Leases), so a
typed model layer would only cost CPU and memory per node. Credentials come
from `kubeconfigs` (in-cluster, or a kubeconfig's token or client certificate)
and, for exec plugins and auth-providers, from the official client's loader,
imported only then; the requests go through one aiohttp session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import pathlib
import ssl
import time
import types
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import aiohttp

from gpuhealth_operator.client import kubeconfigs, latency

JsonObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

logger = logging.getLogger(__name__)

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Verbs that write; with a fence, each is checked against it right before it is sent."""
URGENT_QUIET_SECONDS = 0.25
"""Requests that are not urgent wait this long after the last urgent one started."""
IN_CLUSTER_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
TOKEN_REREAD_SECONDS = 60.0
"""The kubelet refreshes a projected token at 80% of its life (at least an hour): a minute is ample."""
LIST_PAGE_SIZE = 250
"""Objects per page of a large LIST (ours and kopf's): a page of GPUNodes is ~3 MB of JSON, decoded and
dropped before the next is asked for, instead of the whole fleet's at once (~65 MB at 5,000 nodes)."""
NAMES_TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1,application/json"
"""Accept header asking for a Table (with `includeObject=None`: rows of printed columns, no objects);
the API server answers with the plain list where it cannot."""


class ApiError(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


TRANSIENT_ERRORS = (ApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
"""What a request can fail with that the next pass tries again: the API server's refusal, the connection."""


class NotLeading(ApiError):
    """A write refused before it was sent: this replica's leader term does not allow writes now."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "NotLeading", f"{method} {path} not sent: this replica no longer leads")


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate to it."""

    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    token: str | None
    token_path: str | None = None
    """In-cluster: the projected ServiceAccount token file, which the kubelet rotates; re-read often."""


async def load_credentials(kubeconfig: pathlib.Path | None) -> Credentials:
    """Read credentials: the given kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube/config.

    Read by `kubeconfig` (no Kubernetes client imported: ~40 MiB); a kubeconfig user that
    authenticates through an exec plugin or an auth-provider goes to the client's own loader.
    """
    try:
        if kubeconfig is not None:
            found = kubeconfigs.from_file(kubeconfig)
        else:
            found = kubeconfigs.in_cluster() or kubeconfigs.from_file(kubeconfigs.default_path())
    except kubeconfigs.NeedsClientLoader:
        return await _client_loader(kubeconfig)
    return Credentials(**dataclasses.asdict(found))


async def _client_loader(kubeconfig: pathlib.Path | None) -> Credentials:
    """The Kubernetes client's kubeconfig loader, for what `kubeconfigs` does not read (exec plugins)."""
    from kubernetes.aio import config as kconfig  # noqa: PLC0415 - ~40 MiB, only when needed
    from kubernetes.aio.client import configuration as kconfiguration  # noqa: PLC0415

    cfg = kconfiguration.Configuration()
    await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig) if kubeconfig is not None else None, client_configuration=cfg
    )
    header = await cfg.get_api_key_with_prefix("BearerToken") or await cfg.get_api_key_with_prefix(
        "authorization"
    )
    token = header.split(" ", 1)[-1] if header else None
    return Credentials(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=token,
    )


@dataclasses.dataclass(frozen=True)
class _Guarded:
    """Marks a request the fence must allow once more when its connection is ready."""

    method: str
    path: str


class Client(Protocol):
    """What the operator's decisions and actions ask of the API server.

    `Kube` implements it over HTTP; the in-memory cluster of the replay and the unit tests
    (`gpuhealth_sim.backtest.memcluster.MemoryKube`) implements it in memory, and mypy holds both
    to it, so the code the replay runs is the code production runs. The leader election and the CLI
    keep the concrete `Kube` (its fence and credentials are not part of this seam).
    """

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
    ) -> JsonObject: ...

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject: ...

    async def list_names(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject: ...

    async def create(self, path: str, body: object) -> JsonObject: ...

    async def patch(
        self, path: str, body: object, content_type: str = MERGE_PATCH, *, urgent: bool = False
    ) -> JsonObject: ...

    async def apply(self, path: str, body: object, field_manager: str) -> JsonObject: ...

    async def delete(self, path: str) -> JsonObject: ...

    def pages(
        self, path: str, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[JsonObject], str]]: ...

    async def list_all(self, path: str, query: Mapping[str, str] | None = None) -> list[JsonObject]: ...

    async def close(self) -> None: ...


class Kube:
    """One connection pool to the API server; counts requests for the metrics."""

    def __init__(
        self,
        credentials: Credentials,
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
        path = self.credentials.token_path
        if path and time.monotonic() - self._token_read_at >= TOKEN_REREAD_SECONDS:
            self._token_read_at = time.monotonic()
            try:
                fresh = pathlib.Path(path).read_text().strip()
            except OSError as error:
                logger.warning("could not re-read the ServiceAccount token %s: %s", path, error)
            else:
                if fresh:
                    self.credentials = dataclasses.replace(self.credentials, token=fresh)
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

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        return await self.request("GET", path, query=query)

    async def list_names(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        """A collection page whose items may carry nothing but `metadata.name` (and the list's
        `metadata`: its resourceVersion, `continue`).

        Asked for as a Table without objects: ~60 bytes per GPUNode. Even their metadata alone
        (managedFields: every field of an agent's report) made the resync 11 % of the operator's
        CPU at rest at 5,000 nodes. A server that cannot print a Table answers with the whole
        list, which has the names too.
        """
        page = await self.request(
            "GET", path, query={**(query or {}), "includeObject": "None"}, accept=NAMES_TABLE
        )
        return table_names(page) if page.get("kind") == "Table" else page

    async def create(self, path: str, body: object) -> JsonObject:
        return await self.request("POST", path, body=body)

    async def patch(
        self, path: str, body: object, content_type: str = MERGE_PATCH, *, urgent: bool = False
    ) -> JsonObject:
        return await self.request("PATCH", path, body=body, content_type=content_type, urgent=urgent)

    async def apply(self, path: str, body: object, field_manager: str) -> JsonObject:
        """Server-side apply, forcing ownership of the fields we set (we are their only writer)."""
        return await self.request(
            "PATCH",
            path,
            query={"fieldManager": field_manager, "force": "true"},
            body=body,
            content_type=APPLY_PATCH,
        )

    async def delete(self, path: str) -> JsonObject:
        return await self.request("DELETE", path)

    async def pages(
        self, path: str, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[JsonObject], str]]:
        """A collection page by page (`limit` items, default LIST_PAGE_SIZE): each page's items and version.

        The caller handles a page before the next is asked for, so no more than one page of decoded
        objects need be held at once. The resourceVersion is the first page's: one snapshot across pages.
        """
        params = dict(query or {})
        params.setdefault("limit", str(LIST_PAGE_SIZE))
        version = ""
        while True:
            page = await self.get(path, params)
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            items: list[JsonObject] = page.get("items") or []
            del page
            yield items, version
            del items
            if not token:
                return
            params["continue"] = str(token)
            await asyncio.sleep(0)

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
            rest = b""
            try:
                async for chunk in response.content.iter_any():
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop()
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
            except aiohttp.ServerTimeoutError:  # only the stream's read bound fires here: it went silent
                logger.info(
                    "watch of %s sent nothing for %.0f s: ended, to be opened again", path, quiet_seconds
                )

    async def list_all(self, path: str, query: Mapping[str, str] | None = None) -> list[JsonObject]:
        """All items of a collection, following continue tokens (all held at once: small collections)."""
        items: list[JsonObject] = []
        async for page, _ in self.pages(path, query):
            items.extend(page)
        return items


def table_names(table: JsonObject) -> JsonObject:
    """A Table's rows as a list of items that carry only their name, with the Table's list metadata."""
    columns = table.get("columnDefinitions") or []
    at = next((i for i, c in enumerate(columns) if c.get("format") == "name"), 0)
    return {
        "metadata": table.get("metadata") or {},
        "items": [{"metadata": {"name": str(row["cells"][at])}} for row in table.get("rows") or []],
    }
