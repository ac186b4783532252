"""A thin asyncio client for the Kubernetes API: JSON in, JSON out. The client's one name for callers.

The operator talks to a handful of endpoints with plain dict bodies
(merge/strategic patches, server-side apply, evictions, Events, Leases), so a
typed model layer would only cost CPU and memory per node. This module is the
seam: `Client`, what the operator asks of the API server, and the names its
callers use, each from the module that owns it: the vocabulary (`wire`), the
errors (`api_errors`), credentials (`auth`), reading collections (`listing`)
and the HTTP client (`session.Kube`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol, Unpack

from gpuhealth_operator.client.api_errors import TRANSIENT_ERRORS, ApiError, NotLeading
from gpuhealth_operator.client.auth import load_credentials
from gpuhealth_operator.client.kubeconfigs import Credentials
from gpuhealth_operator.client.listing import LIST_PAGE_SIZE
from gpuhealth_operator.client.session import Kube
from gpuhealth_operator.client.wire import (
    APPLY_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    JsonObject,
    RequestOptions,
    Verbs,
)

__all__ = [
    "APPLY_PATCH",
    "LIST_PAGE_SIZE",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "TRANSIENT_ERRORS",
    "ApiError",
    "Client",
    "Credentials",
    "JsonObject",
    "Kube",
    "NotLeading",
    "RequestOptions",
    "Verbs",
    "load_credentials",
]


class Client(Protocol):
    """What the operator's decisions and actions ask of the API server.

    `Kube` implements it over HTTP; the in-memory cluster of the replay and the unit tests
    (`gpuhealth_sim.backtest.memcluster.MemoryKube`) implements it in memory, and mypy holds both
    to it, so the code the replay runs is the code production runs. The leader election and the CLI
    keep the concrete `Kube` (its fence and credentials are not part of this seam).
    """

    async def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> JsonObject: ...

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
