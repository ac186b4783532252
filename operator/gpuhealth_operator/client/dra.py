"""Requests to `resource.k8s.io` (Dynamic Resource Allocation) that several steps make: which versions
serve a resource (discovery), and a node's ResourceSlices."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from gpuhealth_operator.client import kube

GROUP: Final = "resource.k8s.io"
SLICE_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""resource.k8s.io versions to list ResourceSlices in, preferred first."""


async def serving(client: kube.Client, plural: str, versions: Iterable[str]) -> list[str]:
    """Discovery alone (no write): those of `versions` whose resource list names `plural`."""
    found = []
    for version in versions:
        try:
            listed = await client.get(f"/apis/{GROUP}/{version}")
        except kube.ApiError as error:
            if error.status in (403, 404):
                continue
            raise
        if any(r.get("name") == plural for r in listed.get("resources") or []):
            found.append(version)
    return found


async def resource_slices(client: kube.Client, node: str) -> list[kube.JsonObject]:
    """The node's ResourceSlices, every driver's, in the first version served (none: no DRA here)."""
    for version in SLICE_VERSIONS:
        try:
            return await client.list_all(
                f"/apis/{GROUP}/{version}/resourceslices", {"fieldSelector": f"spec.nodeName={node}"}
            )
        except kube.ApiError as error:
            if error.status == 404:
                continue
            raise
    return []
