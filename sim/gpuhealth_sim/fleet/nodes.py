"""Simulated GPU Nodes: the Node objects a real GPU node would have, managed by kwok.

A real GPU node carries labels from NVIDIA GPU feature discovery
(`nvidia.com/gpu.present`, `.product`, `.count`) and advertises
`nvidia.com/gpu` in capacity and allocatable through the device plugin;
policies select on those labels and the scheduler places GPU pods by that
resource, so the simulator writes exactly those. The annotation
`kwok.x-k8s.io/node: fake` hands the Node to kwok, which keeps it Ready and
runs its pods in place of a kubelet.

`manifest` is pure; `ensure` and `delete` talk to the API server.
"""

import re
from collections.abc import Iterable
from typing import Any

from kubernetes import client

from gpuhealth_api import keys
from gpuhealth_sim.fleet import fleetfile

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_MANAGED = "fake"
POOL_LABEL = "sim.gpuhealth.io/pool"
"""Which fleet pool a simulated node belongs to (simulator bookkeeping, not part of the contract)."""
FIELD_MANAGER = "gpu-health-sim"

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def product_label(model: str) -> str:
    """GPU feature discovery's spelling of a model name: `NVIDIA H100 80GB HBM3` → `NVIDIA-H100-80GB-HBM3`."""
    return _LABEL_UNSAFE.sub("-", model).strip("-_.")[:63].rstrip("-_.")


def resources(plan: fleetfile.NodePlan) -> dict[str, str]:
    """Capacity: a DRA node's GPUs are devices in its ResourceSlice, not the device plugin's resource."""
    if plan.dra:
        return dict(plan.resources)
    return {**plan.resources, keys.GPU_RESOURCE: str(plan.gpu_count)}


def labels(plan: fleetfile.NodePlan) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": plan.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        POOL_LABEL: plan.pool,
        **plan.labels,
        keys.GPU_PRESENT_LABEL: "true",
        keys.GPU_PRODUCT_LABEL: product_label(plan.gpu_model),
        keys.GPU_COUNT_LABEL: str(plan.gpu_count),
    }


def manifest(plan: fleetfile.NodePlan) -> dict[str, Any]:
    """The Node object for one simulated node, status included (kwok keeps what it finds)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": plan.name,
            "labels": labels(plan),
            "annotations": {KWOK_ANNOTATION: KWOK_MANAGED},
        },
        "spec": {},
        "status": status(plan),
    }


def status(plan: fleetfile.NodePlan) -> dict[str, Any]:
    return {
        "capacity": resources(plan),
        "allocatable": resources(plan),
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "fake",
            "kernelVersion": "6.8.0-sim",
            "osImage": "gpu-health simulated node",
            "containerRuntimeVersion": "kwok",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kubeProxyVersion": "",
        },
    }


def ensure(core: client.CoreV1Api, plan: fleetfile.NodePlan) -> None:
    """Create the Node with its status, or adopt an existing one of that name and set its capacity."""
    body = manifest(plan)
    node = client.V1Node.from_dict(body)
    assert node is not None, "from_dict returns None only for None"
    try:
        # A Node's status is kept on create (kubelets register this way): one request per node.
        core.create_node(body=node, field_manager=FIELD_MANAGER, _preload_content=False)
        return
    except client.ApiException as error:
        if error.status != 409:
            raise
    core.patch_node(
        plan.name,
        body={"metadata": {key: body["metadata"][key] for key in ("labels", "annotations")}},
        field_manager=FIELD_MANAGER,
        _preload_content=False,
    )
    core.patch_node_status(
        plan.name, body={"status": status(plan)}, field_manager=FIELD_MANAGER, _preload_content=False
    )


def delete(core: client.CoreV1Api, node_names: Iterable[str]) -> None:
    """Delete the Nodes (their GPUNodes follow by garbage collection); missing ones are fine."""
    for name in node_names:
        try:
            core.delete_node(name, _preload_content=False)
        except client.ApiException as error:
            if error.status != 404:
                raise
