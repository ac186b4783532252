"""DeviceTaintRules and ResourceSlices as gpu-health reads and writes them: pure bodies, no client.

A `DeviceTaintRule` (resource.k8s.io) taints the DRA devices its
deviceSelector names; gpu-health writes one per isolated GPU, selecting
exactly that GPU's driver, pool and device, found by matching the GPU's UUID
to the `uuid` attribute of the devices in its node's ResourceSlices (the
NVIDIA DRA driver publishes it; device names and indices differ between the
driver's releases, so they are never used to find a GPU).

Which version to write in comes from discovery (`served_version`); whether
the cluster acts on the rules at all only from a rule's status
(`acknowledged`, e.g. on `probe_rule`), because Kubernetes 1.36 serves the
API once its version is enabled yet ignores the rules without the
DRADeviceTaintRules feature gate on the scheduler and controller manager.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_api import keys, vocabulary

GROUP: Final = "resource.k8s.io"
KIND: Final = "DeviceTaintRule"
PLURAL: Final = "devicetaintrules"
KNOWN_VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")
"""resource.k8s.io versions that may serve DeviceTaintRule, preferred first (1.36 serves v1beta2)."""
EVICTION_CONDITION: Final = "EvictionInProgress"
"""The condition kube-controller-manager's device-taint-eviction controller keeps on every rule it acts on."""
PROBE_DRIVER: Final = "probe.gpuhealth.io"
"""A DRA driver name no driver uses: the probe rule selects nothing."""
_MAX_NAME: Final = 253
_MAX_LABEL: Final = 63


@dataclasses.dataclass(frozen=True)
class Device:
    """A DRA device: what a DeviceTaintRule's deviceSelector names."""

    driver: str
    pool: str
    name: str


def acknowledged(rule: Mapping[str, Any]) -> bool:
    """Whether the controller manager acts on this rule: it wrote `EvictionInProgress` for its generation.

    Discovery is not enough: Kubernetes 1.36 serves the API once its version is enabled,
    but only with the DRADeviceTaintRules gate do the scheduler and the controller manager
    honour the rules; without it a rule is stored and ignored, and gets no status.
    """
    metadata, rule_status = rule.get("metadata"), rule.get("status")
    generation = metadata.get("generation") if isinstance(metadata, Mapping) else None
    conditions = rule_status.get("conditions") if isinstance(rule_status, Mapping) else None
    if not isinstance(generation, int) or not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, Mapping)
        and c.get("type") == EVICTION_CONDITION
        and c.get("observedGeneration") == generation
        for c in conditions
    )


def probe_rule(api_version: str, policy: str) -> dict[str, Any]:
    """A harmless rule (NoSchedule on a device no driver publishes) to learn whether rules are acted on.

    Create it, wait a few seconds for `acknowledged`, delete it: no status means the
    cluster serves the API but ignores the rules, and IsolateGPU must take the node ladder.
    """
    _check_version(api_version)
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": KIND,
        "metadata": {
            "name": f"gpuhealth-probe-{policy}"[:_MAX_NAME].rstrip(".-"),
            "labels": {keys.POLICY_LABEL: label_value(policy)},
        },
        "spec": {
            "deviceSelector": {"driver": PROBE_DRIVER, "pool": PROBE_DRIVER, "device": "none"},
            "taint": {
                "key": keys.DEVICE_TAINT,
                "value": "Probe",
                "effect": vocabulary.IsolationEffect.NO_SCHEDULE.value,
            },
        },
    }


def served_version(versions_serving_rules: Iterable[str]) -> str | None:
    """The resource.k8s.io version to write DeviceTaintRules in, from those whose discovery lists them."""
    offered = set(versions_serving_rules)
    return next((v for v in KNOWN_VERSIONS if v in offered), None)


def devices_by_uuid(slices: Iterable[Mapping[str, Any]]) -> dict[str, Device]:
    """GPU UUID → its device, from ResourceSlice bodies (any API version that has spec.devices[].attributes).

    A UUID on two devices is left out: tainting the wrong one would be worse than draining.
    """
    found: dict[str, list[Device]] = {}
    for body in slices:
        spec = body.get("spec") if isinstance(body, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        driver, pool = spec.get("driver"), spec.get("pool")
        pool_name = pool.get("name") if isinstance(pool, Mapping) else None
        devices = spec.get("devices")
        if not isinstance(driver, str) or not isinstance(pool_name, str) or not isinstance(devices, list):
            continue
        for device in devices:
            name = device.get("name") if isinstance(device, Mapping) else None
            attributes = device.get("attributes") if isinstance(device, Mapping) else None
            uuid = attributes.get("uuid") if isinstance(attributes, Mapping) else None
            value = uuid.get("string") if isinstance(uuid, Mapping) else None
            if isinstance(name, str) and isinstance(value, str) and value:
                found.setdefault(value, []).append(Device(driver, pool_name, name))
    return {uuid: devices[0] for uuid, devices in found.items() if len(set(devices)) == 1}


def rule_name(node: str, gpu_index: int) -> str:
    """`gpuhealth-<node>-gpu-<index>`; a node name too long for it is cut and made unique by a hash."""
    suffix = f"-gpu-{gpu_index}"
    name = f"gpuhealth-{node}{suffix}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = _MAX_NAME - len(f"gpuhealth--{digest}{suffix}")
    return f"gpuhealth-{node[:keep].rstrip('.-')}-{digest}{suffix}"


def label_value(name: str) -> str:
    """`name` as a label value: itself when it fits 63 characters, else cut and made unique by a hash."""
    if len(name) <= _MAX_LABEL:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: _MAX_LABEL - len(digest) - 1].rstrip('.-_')}-{digest}"


def device_taint_rule(
    *,
    api_version: str,
    policy: str,
    node: str,
    gpu_index: int,
    gpu_uuid: str,
    device: Device,
    condition: vocabulary.Condition,
    effect: vocabulary.IsolationEffect,
    node_uid: str | None = None,
) -> dict[str, Any]:
    """The DeviceTaintRule isolating one GPU: selects exactly its device; labelled with policy and node.

    Owned by its Node (`node_uid`), so the garbage collector deletes it with the Node: a replaced
    machine's rule would otherwise count against the policy's maxUnavailableGPUs for good.
    """
    _check_version(api_version)
    metadata: dict[str, Any] = {
        "name": rule_name(node, gpu_index),
        "labels": {
            keys.POLICY_LABEL: label_value(policy),
            keys.NODE_LABEL: label_value(node),
            keys.GPU_INDEX_LABEL: str(gpu_index),
            keys.GPU_UUID_LABEL: gpu_uuid,
        },
    }
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": keys.DEVICE_TAINT, "value": condition.value, "effect": effect.value},
        },
    }


def _check_version(api_version: str) -> None:
    if api_version not in KNOWN_VERSIONS:
        raise ValueError(f"{GROUP}/{api_version} is not a version gpu-health writes DeviceTaintRules in")
