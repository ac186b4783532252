"""Reading collections: page by page, names only (a Table), and a watch's stream of events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping

from gpuhealth_operator.client.wire import JsonObject

LIST_PAGE_SIZE = 250
"""Objects per page of a large LIST (ours and kopf's): a page of GPUNodes is ~3 MB of JSON, decoded and
dropped before the next is asked for, instead of the whole fleet's at once (~65 MB at 5,000 nodes)."""
NAMES_TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1,application/json"
"""Accept header asking for a Table (with `includeObject=None`: rows of printed columns, no objects);
the API server answers with the plain list where it cannot."""


async def pages(
    get: Callable[[str, Mapping[str, str]], Awaitable[JsonObject]],
    path: str,
    query: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[list[JsonObject], str]]:
    """A collection page by page (`limit` items, default LIST_PAGE_SIZE): each page's items and version.

    The caller handles a page before the next is asked for, so no more than one page of decoded
    objects need be held at once. The resourceVersion is the first page's: one snapshot across pages.
    """
    params = dict(query or {})
    params.setdefault("limit", str(LIST_PAGE_SIZE))
    version = ""
    while True:
        page = await get(path, params)
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


def table_names(table: JsonObject) -> JsonObject:
    """A Table's rows as a list of items that carry only their name, with the Table's list metadata."""
    columns = table.get("columnDefinitions") or []
    at = next((i for i, c in enumerate(columns) if c.get("format") == "name"), 0)
    return {
        "metadata": table.get("metadata") or {},
        "items": [{"metadata": {"name": str(row["cells"][at])}} for row in table.get("rows") or []],
    }


async def json_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[JsonObject, None]:
    """A watch stream's events, each decoded as its line completes (a chunk may end mid-line)."""
    rest = b""
    async for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.strip():
                yield json.loads(line)
