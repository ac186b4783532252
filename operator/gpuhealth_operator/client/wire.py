"""The requests' vocabulary: JSON objects, patch content types, a request's options, and the verbs.

`Verbs` writes GET, POST, PATCH, server-side apply, DELETE and a whole LIST once, over a client's
`request` and `pages`: the HTTP client (`session.Kube`) and the replay's in-memory cluster share them,
so a verb means the same request on both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, TypedDict, Unpack

JsonObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class RequestOptions(TypedDict, total=False):
    """A request's keyword options (`Client.request`); each absent one has its default."""

    query: Mapping[str, str] | None
    """URL query parameters (default none)."""
    body: object
    """Sent as JSON (default none: no body)."""
    content_type: str
    """The body's type (default application/json; a patch names its kind)."""
    urgent: bool
    """A cordon: goes out at once, the others wait while any is in flight (default False)."""
    exempt: bool
    """The leader Lease: never waits, never fenced (default False)."""
    accept: str
    """The answer's type asked for (default application/json)."""


class Verbs:
    """The verbs over `request` and `pages`, which a client implements."""

    async def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> JsonObject:
        raise NotImplementedError

    def pages(
        self, path: str, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[JsonObject], str]]:
        raise NotImplementedError

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        return await self.request("GET", path, query=query)

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

    async def list_all(self, path: str, query: Mapping[str, str] | None = None) -> list[JsonObject]:
        """All items of a collection, following continue tokens (all held at once: small collections)."""
        items: list[JsonObject] = []
        async for page, _ in self.pages(path, query):
            items.extend(page)
        return items
