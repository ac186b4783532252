"""Requests for IsolateGPU: DeviceTaintRules (probe, list ours, create, delete) and ResourceSlices.

The pure bodies and readings are `decisions.device_taints`; this module only
sends them. `probe` learns whether the cluster acts on DeviceTaintRules at
all: discovery for the version serving them, then a harmless probe rule the
controller manager must acknowledge (Kubernetes 1.36 stores and ignores rules
when the DRADeviceTaintRules feature gate is off).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator import kube
from gpuhealth_operator.decisions import device_taints, isolation

PROBE_TIMEOUT_SECONDS: Final = 15.0
PROBE_POLL_SECONDS: Final = 0.25
SLICE_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""resource.k8s.io versions to list ResourceSlices in, preferred first."""


def rules_path(api_version: str, name: str | None = None) -> str:
    path = f"/apis/{device_taints.GROUP}/{api_version}/{device_taints.PLURAL}"
    return f"{path}/{name}" if name else path


async def served_version(client: kube.Kube) -> str | None:
    """Discovery alone (no write): the resource.k8s.io version serving devicetaintrules, if any."""
    serving = []
    for known in device_taints.KNOWN_VERSIONS:
        try:
            found = await client.get(f"/apis/{device_taints.GROUP}/{known}")
        except kube.ApiError as error:
            if error.status in (403, 404):
                continue
            raise
        if any(r.get("name") == device_taints.PLURAL for r in found.get("resources") or []):
            serving.append(known)
    return device_taints.served_version(serving)


async def probe(client: kube.Kube, policy: str, generation: int) -> isolation.Support:
    """Discovery for the version serving devicetaintrules, then a probe rule the controller manager acks."""
    version = await served_version(client)
    if version is None:
        return isolation.Support(
            generation,
            None,
            f"{device_taints.GROUP} serves no DeviceTaintRule version: "
            "IsolateGPU falls back to the node ladder",
        )
    rule = device_taints.probe_rule(version, policy)
    name = rule["metadata"]["name"]
    try:
        await _delete(client, rules_path(version, name))
        await client.create(rules_path(version), rule)
        acked = await _acknowledged(client, rules_path(version, name))
    except kube.ApiError as error:
        return isolation.Support(
            generation,
            None,
            f"the probe DeviceTaintRule failed ({error.status} {error.reason}): "
            "IsolateGPU falls back to the node ladder",
        )
    finally:
        await _delete(client, rules_path(version, name))
    if not acked:
        return isolation.Support(
            generation,
            None,
            f"{device_taints.GROUP}/{version} stores DeviceTaintRules but nothing acts on them "
            "(feature gate DRADeviceTaintRules off?): IsolateGPU falls back to the node ladder",
        )
    return isolation.Support(
        generation, version, f"acted on ({device_taints.GROUP}/{version}): IsolateGPU isolates GPUs"
    )


async def _acknowledged(client: kube.Kube, path: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROBE_TIMEOUT_SECONDS
    while True:
        if device_taints.acknowledged(await client.get(path)):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(PROBE_POLL_SECONDS)


async def _delete(client: kube.Kube, path: str) -> bool:
    """Delete; False if it was not there."""
    try:
        await client.delete(path)
    except kube.ApiError as error:
        if error.not_found:
            return False
        raise
    return True


async def delete(client: kube.Kube, api_version: str, name: str) -> bool:
    """Delete a rule; False if it was not there."""
    return await _delete(client, rules_path(api_version, name))


async def exists(client: kube.Kube, api_version: str, name: str) -> bool:
    try:
        await client.get(rules_path(api_version, name))
    except kube.ApiError as error:
        if error.not_found:
            return False
        raise
    return True


async def create(client: kube.Kube, api_version: str, body: Mapping[str, Any]) -> bool:
    """Create a rule; False if one of its name is there already."""
    try:
        await client.create(rules_path(api_version), body)
    except kube.ApiError as error:
        if error.status != 409:
            raise
        return False
    return True


async def ours(client: kube.Kube, api_version: str | None, policy: str) -> list[kube.JsonObject]:
    """The rules of a policy (its label), every node's."""
    if api_version is None:
        return []
    selector = f"{keys.POLICY_LABEL}={device_taints.label_value(policy)}"
    return await client.list_all(rules_path(api_version), {"labelSelector": selector})


async def devices(client: kube.Kube, node: str) -> dict[str, device_taints.Device]:
    """GPU UUID → DRA device, from the node's ResourceSlices (empty: no DRA driver publishes the node)."""
    for version in SLICE_VERSIONS:
        try:
            slices = await client.list_all(
                f"/apis/{device_taints.GROUP}/{version}/resourceslices",
                {"fieldSelector": f"spec.nodeName={node}"},
            )
        except kube.ApiError as error:
            if error.status == 404:
                continue
            raise
        return device_taints.devices_by_uuid(slices)
    return {}
