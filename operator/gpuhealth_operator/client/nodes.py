"""Patches of Node objects: labels, our taint, cordon/uncordon, the GPUHealthy condition.

Every patch is minimal (it names only the keys we own) and idempotent. Where a
patch must not race a human (cordon, taints, uncordon), it carries a
precondition: the resourceVersion it was computed from, or a JSON-patch `test`
of our ownership annotation, so a concurrent change makes it fail instead of
overwrite. Each function returns the Node as the API server stored it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth_api import keys
from gpuhealth_operator.client import kube

DRAIN_STARTED_ANNOTATION = keys.DRAIN_STARTED_ANNOTATION
"""Alias of `keys.DRAIN_STARTED_ANNOTATION` (remediation reads it here)."""

CORDONED_AT_ANNOTATION = keys.CORDONED_AT_ANNOTATION
"""Alias of `keys.CORDONED_AT_ANNOTATION` (remediation reads it here; a human's re-cordon leaves it in
place: `overrides.cordon_taken_over`)."""

JSON_PATCH = "application/json-patch+json"

TAINT_EFFECT = "NoSchedule"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


async def patch_metadata(
    client: kube.Client,
    name: str,
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> kube.JsonObject:
    """Set (value) or remove (None) the given labels and annotations; other keys are untouched."""
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return await client.patch(node_path(name), {"metadata": metadata})


async def cordon(
    client: kube.Client,
    name: str,
    *,
    policy: str,
    resource_version: str,
    cordoned_at: str,
    drain_started: str | None = None,
    labels: Mapping[str, str | None] | None = None,
    taints: list[dict[str, Any]] | None = None,
) -> kube.JsonObject:
    """Mark the node unschedulable and record that `policy` did it, and when (`cordoned_at`).

    Fails with 409 if the node changed since `resource_version` (a human may
    have cordoned it meanwhile, and then it is not ours to claim). `labels`
    and `taints` (the whole new `spec.taints`, see `with_taint`; None leaves
    them alone) ride along, so the verdict's labels and taint land in the
    same write.
    """
    # A cordon on new evidence ends a human override: its baseline goes.
    annotations: dict[str, str | None] = {
        keys.CORDONED_BY_ANNOTATION: policy,
        keys.CORDONED_AT_ANNOTATION: cordoned_at,
        keys.OVERRIDDEN_EVIDENCE_ANNOTATION: None,
    }
    if drain_started is not None:
        annotations[keys.DRAIN_STARTED_ANNOTATION] = drain_started
    metadata: dict[str, Any] = {"resourceVersion": resource_version, "annotations": annotations}
    if labels:
        metadata["labels"] = dict(labels)
    spec: dict[str, Any] = {"unschedulable": True}
    if taints is not None:
        spec["taints"] = taints or None
    body = {"metadata": metadata, "spec": spec}
    return await client.patch(node_path(name), body, urgent=True)


async def uncordon(
    client: kube.Client, name: str, *, policy: str, resource_version: str | None = None
) -> kube.JsonObject:
    """Make the node schedulable again, only if `policy` is the one that cordoned it.

    The JSON-patch `test` makes the API server refuse (422) when the annotation
    names anyone else or is gone, so a human's cordon is never lifted; with
    `resource_version`, also when the Node changed since the version the caller
    found to be our cordon (a human's uncordon and cordon leave the annotation).
    """
    ours = f"/metadata/annotations/{_pointer(keys.CORDONED_BY_ANNOTATION)}"
    ops: list[dict[str, Any]] = []
    if resource_version is not None:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    ops += [
        {"op": "test", "path": ours, "value": policy},
        {"op": "replace", "path": "/spec/unschedulable", "value": False},
        {"op": "remove", "path": ours},
    ]
    return await client.patch(node_path(name), ops, content_type=JSON_PATCH)


async def drop_claim(
    client: kube.Client, name: str, *, resource_version: str, baseline: str | None
) -> kube.JsonObject:
    """After a human override: remove our claim and drain bookkeeping, keep the evidence `baseline`.

    Fails with 409 if the node changed since `resource_version` (cordoned again meanwhile, say).
    """
    annotations = {
        keys.CORDONED_BY_ANNOTATION: None,
        keys.CORDONED_AT_ANNOTATION: None,
        keys.DRAIN_STARTED_ANNOTATION: None,
        keys.REPAIR_WAITING_ANNOTATION: None,
        keys.OVERRIDDEN_EVIDENCE_ANNOTATION: baseline,
    }
    body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
    return await client.patch(node_path(name), body, urgent=True)


async def adopt_cordon(
    client: kube.Client, name: str, *, deleted: str, policy: str, drain_started: bool
) -> kube.JsonObject:
    """Make `policy` the owner of a cordon whose `cordoned-by` names the deleted policy `deleted`.

    Conditional on the annotation still naming `deleted` and the node still being
    unschedulable (JSON-patch `test`, 422 otherwise), so a human's change meanwhile wins.
    The old drain's start goes (`drain_started`: the node has one): the adopting policy's
    drain is its own, with its own timeout.
    """
    ours = f"/metadata/annotations/{_pointer(keys.CORDONED_BY_ANNOTATION)}"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": ours, "value": deleted},
        {"op": "test", "path": "/spec/unschedulable", "value": True},
        {"op": "replace", "path": ours, "value": policy},
    ]
    if drain_started:
        ops.append(
            {"op": "remove", "path": f"/metadata/annotations/{_pointer(keys.DRAIN_STARTED_ANNOTATION)}"}
        )
    return await client.patch(node_path(name), ops, content_type=JSON_PATCH)


async def set_drain_started(client: kube.Client, name: str, value: str | None) -> kube.JsonObject:
    return await patch_metadata(client, name, annotations={keys.DRAIN_STARTED_ANNOTATION: value})


async def set_taint(
    client: kube.Client, name: str, *, taints: list[dict[str, Any]], value: str | None, resource_version: str
) -> kube.JsonObject:
    """Hold our NoSchedule taint with `value` (None removes it); other taints are kept.

    `spec.taints` is replaced as a whole by any patch, so the new list is
    computed from the node at `resource_version` and the patch fails on change.
    """
    body = {
        "metadata": {"resourceVersion": resource_version},
        "spec": {"taints": with_taint(taints, value) or None},
    }
    return await client.patch(node_path(name), body)


def with_taint(taints: Iterable[Mapping[str, Any]], value: str | None) -> list[dict[str, Any]]:
    """`taints` with our NoSchedule taint holding `value` (None: without it); other taints are kept."""
    kept = [dict(t) for t in taints if t.get("key") != keys.UNHEALTHY_TAINT]
    if value is not None:
        kept.append({"key": keys.UNHEALTHY_TAINT, "value": value, "effect": TAINT_EFFECT})
    return kept


async def set_condition(
    client: kube.Client, name: str, *, status: str, reason: str, message: str, transition_time: str, now: str
) -> kube.JsonObject:
    """Upsert the GPUHealthy Node condition (strategic merge keys conditions by type)."""
    condition = {
        "type": keys.NODE_CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition_time,
        "lastHeartbeatTime": now,
    }
    return await client.patch(
        f"{node_path(name)}/status",
        {"status": {"conditions": [condition]}},
        content_type=kube.STRATEGIC_MERGE_PATCH,
    )
