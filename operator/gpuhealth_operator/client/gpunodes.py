"""GPUNode metadata writes: the operator's own annotations (a fire drill's start, its end).

Status is applied elsewhere (`status`); this is a merge patch of
`metadata.annotations` only, so the agent's fields and anyone else's
annotations are left as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuhealth_api import resources
from gpuhealth_operator.client import kube


def gpunode_path(name: str) -> str:
    return f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}/{name}"


async def annotate(client: kube.Client, name: str, annotations: Mapping[str, str | None]) -> kube.JsonObject:
    """Set (or, with None, remove) annotations on the GPUNode; the GPUNode as written."""
    return await client.patch(gpunode_path(name), {"metadata": {"annotations": dict(annotations)}})
