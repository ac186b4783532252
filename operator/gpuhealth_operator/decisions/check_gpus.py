"""How an active check holds every GPU of its node: the device plugin's resource, or a DRA claim.

A check must go through the scheduler holding all of the node's GPUs, or it could share the node with a
workload, and it could not be preempted for one. Where the GPUs are published decides how (`access`):

- the device plugin advertises `nvidia.com/gpu` capacity: the check's first container requests all of it;
- else a DRA driver's ResourceSlices publish GPU devices for the node: the check's pod holds them all
  through a claim made from a ResourceClaimTemplate (`claim_template`) whose one request is
  `exactly: {deviceClassName, allocationMode: All}`. The pod's required node affinity pins it to the
  node, so "All" is every device of the class on that node, and none is left for a workload to share;
- else nothing can hold the GPUs through the scheduler: no check starts (the reason is `Access.why`).

Pure: the ResourceSlices and the served `resource.k8s.io` version come from the caller
(`ladder.check.check_claims`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_api import keys

GROUP: Final = "resource.k8s.io"
CLAIM_TEMPLATES: Final = "resourceclaimtemplates"
KNOWN_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""resource.k8s.io versions serving ResourceClaimTemplate, preferred first (v1 is GA from 1.34)."""
CLAIM_NAME: Final = "gpus"
"""The name of the check pod's claim (`spec.resourceClaims[].name`) and of its one request."""
DEVICE_PLUGIN: Final = "device-plugin"
DRA: Final = "dra"
GPU_TYPES: Final = ("gpu",)
"""Values of a device's `type` attribute that are whole GPUs (the NVIDIA DRA driver also publishes
`mig` devices); a device without the attribute counts as a GPU."""


@dataclasses.dataclass(frozen=True)
class Access:
    """How a check holds the node's GPUs: `kind` DEVICE_PLUGIN or DRA with `gpus` of them, or None
    (no check can start) with `why`."""

    kind: str | None
    gpus: int
    why: str = ""


def access(node: str, gpu_capacity: int, dra_devices: int, *, driver: str) -> Access:
    """The device plugin where the Node advertises `nvidia.com/gpu`, else DRA where `driver` publishes
    GPU devices for it, else none."""
    if gpu_capacity > 0:
        return Access(DEVICE_PLUGIN, gpu_capacity)
    if dra_devices > 0:
        return Access(DRA, dra_devices)
    return Access(
        None,
        0,
        f"node {node} advertises no {keys.GPU_RESOURCE} capacity and no ResourceSlice of DRA driver "
        f"{driver} publishes a GPU of it: a check could not hold its GPUs through the scheduler",
    )


def gpu_devices(slices: Iterable[Mapping[str, Any]], node: str, *, driver: str) -> int:
    """How many whole GPUs the ResourceSlices of `driver` publish for `node` (any resource.k8s.io
    version: spec.driver, spec.nodeName, spec.devices[].attributes; v1beta1's `basic` too)."""
    count = 0
    for body in slices:
        spec = body.get("spec") if isinstance(body, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        for device in spec.get("devices") or []:
            if isinstance(device, Mapping) and _is_gpu(device):
                count += 1
    return count


def _is_gpu(device: Mapping[str, Any]) -> bool:
    basic = device.get("basic")
    attributes = (basic if isinstance(basic, Mapping) else device).get("attributes")
    kind = attributes.get("type") if isinstance(attributes, Mapping) else None
    value = kind.get("string") if isinstance(kind, Mapping) else None
    return value is None or value in GPU_TYPES


def served_version(versions_serving_templates: Iterable[str]) -> str | None:
    """The version to write ResourceClaimTemplates in, of those whose discovery lists them."""
    offered = set(versions_serving_templates)
    return next((v for v in KNOWN_VERSIONS if v in offered), None)


def template_name(job_name: str, token: str) -> str:
    """One template per check Job, never reused: a new Job of the node's never finds its predecessor's
    template (still to be garbage-collected) under its name."""
    return f"{job_name}-{token}"


def claim_template(
    *,
    api_version: str,
    name: str,
    namespace: str,
    device_class: str,
    job: Mapping[str, Any],
) -> dict[str, Any]:
    """The ResourceClaimTemplate of a check Job: every device of `device_class` on the node, owned by the
    Job (the garbage collector deletes it with the Job), labelled as the Job is."""
    if api_version not in KNOWN_VERSIONS:
        raise ValueError(f"unknown {GROUP} version {api_version!r}")
    meta = job.get("metadata") or {}
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "All"}
    # v1beta1 puts the request's fields on the request itself; v1beta2 and v1 under `exactly`.
    body = (
        {"name": CLAIM_NAME, **request}
        if api_version == "v1beta1"
        else {"name": CLAIM_NAME, "exactly": request}
    )
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(meta.get("labels") or {}),
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": meta.get("name"), "uid": meta.get("uid")}
            ],
        },
        "spec": {"spec": {"devices": {"requests": [body]}}},
    }


def claimed_template(job: Mapping[str, Any]) -> str | None:
    """The ResourceClaimTemplate a check Job's pod holds its GPUs through (None: the device plugin's)."""
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    for claim in pod_spec.get("resourceClaims") or []:
        if isinstance(claim, Mapping) and claim.get("name") == CLAIM_NAME:
            name = claim.get("resourceClaimTemplateName")
            return name if isinstance(name, str) and name else None
    return None
