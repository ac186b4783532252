"""The DRA side of the active-check integration tests: a node whose GPUs only the simulator's fake
NVIDIA DRA driver publishes (a ResourceSlice, the DeviceClass; no `nvidia.com/gpu` capacity), and the
claims and claim templates a check leaves in its namespace."""

from __future__ import annotations

import contextlib
from typing import Any, Final

from kubernetes import client

import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim.fleet import dra

GPUS: Final = 8


def objects(k8s: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


def add_node(fleet: operator_harness.Fleet, k8s: client.ApiClient, name: str) -> None:
    """A GPU node whose GPUs only the (fake) NVIDIA DRA driver publishes: no `nvidia.com/gpu` capacity."""
    fleet.add_node(name, gpus=GPUS)
    gone = {keys.GPU_RESOURCE: None}
    client.CoreV1Api(k8s).patch_node_status(name, {"status": {"capacity": gone, "allocatable": gone}})
    api = objects(k8s)
    with contextlib.suppress(client.ApiException):  # one per cluster, shared by the modules
        api.create_cluster_custom_object(dra.GROUP, dra.VERSION, "deviceclasses", dra.device_class())
    uid = client.CoreV1Api(k8s).read_node(name).metadata.uid
    devices = [
        {"name": dra.device_name(i), "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
        for i in range(GPUS)
    ]
    body = {
        "apiVersion": f"{dra.GROUP}/{dra.VERSION}",
        "kind": "ResourceSlice",
        "metadata": {
            "name": dra.slice_name(name),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}],
        },
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    api.create_cluster_custom_object(dra.GROUP, dra.VERSION, "resourceslices", body)


def claims(k8s: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    listed = objects(k8s).list_namespaced_custom_object(dra.GROUP, dra.VERSION, namespace, "resourceclaims")
    return [c for c in listed["items"] if not c["metadata"].get("deletionTimestamp")]


def templates(k8s: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    listed = objects(k8s).list_namespaced_custom_object(
        dra.GROUP, dra.VERSION, namespace, "resourceclaimtemplates"
    )
    return [t for t in listed["items"] if not t["metadata"].get("deletionTimestamp")]


def allocated(k8s: client.ApiClient, namespace: str, pod: str) -> list[dict[str, Any]] | None:
    """The devices allocated to the claim the pod's template made (None: none allocated yet)."""
    for claim in claims(k8s, namespace):
        owners = [r["name"] for r in claim["metadata"].get("ownerReferences") or [] if r["kind"] == "Pod"]
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
        if owners == [pod] and results:
            return list(results)
    return None
