"""Patches of a Node's topology-domain marks: the label and the NoSchedule taint gpuhealth.io/domain-degraded.

Both are keys only gpu-health writes; nothing else on the Node is touched.
The label alone is a merge patch of that one key. A change of the taint
rewrites `spec.taints` as a whole (a patch cannot add to or remove from the
list), so it carries the resourceVersion it was computed from and fails
with 409 if the Node changed meanwhile (a human's taint, our
`gpuhealth.io/unhealthy` taint) instead of overwriting it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.client import kube, nodes

LABEL: Final = keys.DOMAIN_DEGRADED_LABEL
TAINT: Final = keys.DOMAIN_DEGRADED_TAINT
TAINT_VALUE: Final = "true"
TAINT_EFFECT: Final = nodes.TAINT_EFFECT


def has_taint(taints: Iterable[Mapping[str, Any]]) -> bool:
    return any(t.get("key") == TAINT for t in taints)


def with_marks(taints: Iterable[Mapping[str, Any]], tainted: bool) -> list[dict[str, Any]]:
    """`taints` with our domain taint (`tainted`) or without it; every other taint is kept as it is."""
    kept = [dict(t) for t in taints if t.get("key") != TAINT]
    if tainted:
        kept.append({"key": TAINT, "value": TAINT_VALUE, "effect": TAINT_EFFECT})
    return kept


async def mark(
    client: kube.Client,
    name: str,
    *,
    label: bool,
    taints: list[dict[str, Any]] | None = None,
    resource_version: str | None = None,
) -> kube.JsonObject:
    """Set (label) or remove the domain label; with `taints` (the Node's whole new `spec.taints`, see
    `with_marks`) also the taint, conditional on `resource_version` (409 if the Node changed)."""
    metadata: dict[str, Any] = {"labels": {LABEL: "true" if label else None}}
    body: dict[str, Any] = {"metadata": metadata}
    if taints is not None:
        metadata["resourceVersion"] = resource_version
        body["spec"] = {"taints": taints or None}
    return await client.patch(nodes.node_path(name), body)
