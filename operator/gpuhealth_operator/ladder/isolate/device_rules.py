"""Requests for IsolateGPU: DeviceTaintRules (probe, list ours, create, delete) and ResourceSlices.

The pure bodies and readings are `decisions.device_taints`; this module only
sends them. `probe` learns whether the cluster acts on DeviceTaintRules at
all: discovery for the version serving them, then a harmless probe rule the
controller manager must acknowledge (Kubernetes 1.36 stores and ignores rules
when the DRADeviceTaintRules feature gate is off).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.client import dra, kube
from gpuhealth_operator.decisions import device_taints, isolation

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS: Final = 15.0
PROBE_POLL_SECONDS: Final = 0.25
PROBE_ATTEMPTS: Final = 3
PROBE_RETRY_SECONDS: Final = 1.0
"""Wait before the second attempt of a probe that met a transient error (twice that before the third)."""
TRANSIENT: Final = kube.TRANSIENT_ERRORS
"""What a request may raise; an ApiError is transient only as `transient` says."""


def rules_path(api_version: str, name: str | None = None) -> str:
    path = f"/apis/{device_taints.GROUP}/{api_version}/{device_taints.PLURAL}"
    return f"{path}/{name}" if name else path


async def served_version(client: kube.Client) -> str | None:
    """Discovery alone (no write): the resource.k8s.io version serving devicetaintrules, if any."""
    serving = await dra.serving(client, device_taints.PLURAL, device_taints.KNOWN_VERSIONS)
    return device_taints.served_version(serving)


async def probe(client: kube.Client, policy: str, generation: int) -> isolation.Support:
    """Discovery for the version serving devicetaintrules, then a probe rule the controller manager acks.

    A transient error (a timeout, 429, 5xx, a conflict with a probe rule still being deleted) is
    retried up to `PROBE_ATTEMPTS` times; still no answer, the Support is not `definite`: IsolateGPU
    must not fall back to the node ladder for good on one bad moment of the API server.
    """
    error: BaseException | None = None
    for attempt in range(PROBE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(PROBE_RETRY_SECONDS * attempt)
        try:
            return await _probe_once(client, policy, generation)
        except TRANSIENT as caught:
            if isinstance(caught, kube.ApiError) and not transient(caught):
                raise
            error = caught
    what = (
        f"{error.status} {error.reason}" if isinstance(error, kube.ApiError) else (str(error) or repr(error))
    )
    return isolation.Support(
        generation,
        None,
        f"not known yet: the probe met a transient error {PROBE_ATTEMPTS} times ({what}); it is tried again",
        definite=False,
    )


def transient(error: kube.ApiError) -> bool:
    """An API error that says nothing about DeviceTaintRules: try again (409: a probe rule being deleted)."""
    return error.status in (409, 429) or error.status >= 500


async def _probe_once(client: kube.Client, policy: str, generation: int) -> isolation.Support:
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
        if transient(error):
            raise
        return isolation.Support(
            generation,
            None,
            f"the probe DeviceTaintRule was refused ({error.status} {error.reason}): "
            "IsolateGPU falls back to the node ladder",
        )
    finally:
        try:
            await _delete(client, rules_path(version, name))
        except TRANSIENT:
            logger.warning("could not delete probe DeviceTaintRule %s (deleted at the next probe)", name)
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


async def _acknowledged(client: kube.Client, path: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROBE_TIMEOUT_SECONDS
    while True:
        if device_taints.acknowledged(await client.get(path)):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(PROBE_POLL_SECONDS)


async def _delete(client: kube.Client, path: str) -> bool:
    """Delete; False if it was not there."""
    try:
        await client.delete(path)
    except kube.ApiError as error:
        if error.not_found:
            return False
        raise
    return True


async def delete(client: kube.Client, api_version: str, name: str) -> bool:
    """Delete a rule; False if it was not there."""
    return await _delete(client, rules_path(api_version, name))


async def exists(client: kube.Client, api_version: str, name: str) -> bool:
    try:
        await client.get(rules_path(api_version, name))
    except kube.ApiError as error:
        if error.not_found:
            return False
        raise
    return True


async def create(client: kube.Client, api_version: str, body: Mapping[str, Any]) -> bool:
    """Create a rule; False if one of its name is there already."""
    try:
        await client.create(rules_path(api_version), body)
    except kube.ApiError as error:
        if error.status != 409:
            raise
        return False
    return True


async def ours(client: kube.Client, api_version: str | None, policy: str) -> list[kube.JsonObject]:
    """The rules of a policy (its label), every node's."""
    if api_version is None:
        return []
    selector = f"{keys.POLICY_LABEL}={device_taints.label_value(policy)}"
    return await client.list_all(rules_path(api_version), {"labelSelector": selector})


async def of_nodes(client: kube.Client, api_version: str) -> list[kube.JsonObject]:
    """The rules gpu-health wrote for nodes, every policy's (label `gpuhealth.io/node` set; the caller
    keeps only those carrying it, for a server that would not filter by a label's existence)."""
    return await client.list_all(rules_path(api_version), {"labelSelector": keys.NODE_LABEL})


async def adopt(client: kube.Client, api_version: str, name: str, *, deleted: str, policy: str) -> bool:
    """Relabel the rule of a deleted policy as `policy`'s (label values); False if it is gone or was
    relabelled meanwhile (the patch is conditional on the old label: a JSON patch `test`)."""
    path = ["", "metadata", "labels", keys.POLICY_LABEL.replace("~", "~0").replace("/", "~1")]
    pointer = "/".join(path)
    try:
        await client.patch(
            rules_path(api_version, name),
            [
                {"op": "test", "path": pointer, "value": deleted},
                {"op": "replace", "path": pointer, "value": policy},
            ],
            content_type="application/json-patch+json",
        )
    except kube.ApiError as error:
        if error.not_found or error.status == 422:
            return False
        raise
    return True


async def devices(client: kube.Client, node: str) -> dict[str, device_taints.Device]:
    """GPU UUID → DRA device, from the node's ResourceSlices (empty: no DRA driver publishes the node)."""
    return device_taints.devices_by_uuid(await dra.resource_slices(client, node))
