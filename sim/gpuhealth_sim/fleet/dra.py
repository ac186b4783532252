"""A fake NVIDIA DRA driver: the ResourceSlices and DeviceClass a DRA GPU node would have.

On a cluster that allocates GPUs through Dynamic Resource Allocation, the
NVIDIA DRA driver's kubelet plugin publishes one `ResourceSlice` per node
(driver `gpu.nvidia.com`, pool = the node's name) listing each GPU as a
device named `gpu-<minor>` with attributes such as `uuid`, `productName` and
(in the driver's earlier releases) `index` and `minor`; the driver's chart
installs a `DeviceClass` `gpu.nvidia.com` selecting its devices. The
simulator publishes the same for nodes of pools marked `dra: true`, with the
UUIDs the node's simulated agent reports, so the real kube-scheduler
allocates GPUs to `ResourceClaim`s on kwok nodes and a `DeviceTaintRule` can
quarantine one GPU. Nothing prepares the devices (kwok runs the pods), which
is all a control-plane test needs.

Only the attributes below are published; the real driver adds more
(`brand`, `architecture`, `cudaComputeCapability`, ...), none of which
gpu-health reads. gpu-health finds a GPU's device by `uuid`, never by name
or index: names and indices differ between driver releases.

The manifests are pure; `ensure` and `delete` talk to the API server.
"""

from collections.abc import Iterable
from typing import Any, Final

from kubernetes import client

from gpuhealth_agent import simulated
from gpuhealth_sim.fleet import fleetfile

DRIVER: Final = "gpu.nvidia.com"
"""The NVIDIA DRA driver's name (ResourceSlice spec.driver)."""
DEVICE_CLASS: Final = "gpu.nvidia.com"
"""The DeviceClass the NVIDIA driver's chart installs for whole GPUs."""
GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
"""ResourceSlice and DeviceClass are GA (resource.k8s.io/v1) since Kubernetes 1.34."""
FIELD_MANAGER: Final = "gpu-health-sim"
SLICE_LABEL: Final = "sim.gpuhealth.io/dra-node"
"""On each published ResourceSlice: the node it describes (simulator bookkeeping)."""


def device_name(index: int) -> str:
    """The driver's name for a whole GPU: `gpu-<minor>`; the simulator's minor is the GPU's index."""
    return f"gpu-{index}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def device_class() -> dict[str, Any]:
    """The DeviceClass selecting every device of the driver, as the driver's chart installs it."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def devices(plan: fleetfile.NodePlan) -> list[dict[str, Any]]:
    """One device per GPU of the node, with the UUID its simulated agent reports."""
    return [
        {
            "name": device_name(index),
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": simulated.gpu_uuid(plan.name, index)},
                "index": {"int": index},
                "minor": {"int": index},
                "productName": {"string": plan.gpu_model},
            },
        }
        for index in range(plan.gpu_count)
    ]


def resource_slice(plan: fleetfile.NodePlan, node_uid: str | None = None) -> dict[str, Any]:
    """The node's ResourceSlice (pool = node name, one slice); owned by the Node when its uid is given."""
    metadata: dict[str, Any] = {"name": slice_name(plan.name), "labels": {SLICE_LABEL: plan.name}}
    if node_uid is not None:
        # As the kubelet publishes it: deleting the Node deletes its slice.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": plan.name, "uid": node_uid}
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": plan.name,
            "pool": {"name": plan.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(plan),
        },
    }


def _apply(objects: client.CustomObjectsApi, plural: str, body: dict[str, Any]) -> None:
    objects.patch_cluster_custom_object(
        GROUP,
        VERSION,
        plural,
        body["metadata"]["name"],
        body,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def ensure(api_client: client.ApiClient, plans: Iterable[fleetfile.NodePlan]) -> int:
    """Publish the DeviceClass and a ResourceSlice per DRA node (Nodes must exist); returns how many."""
    dra_plans = [plan for plan in plans if plan.dra]
    if not dra_plans:
        return 0
    objects = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    _apply(objects, "deviceclasses", device_class())
    for plan in dra_plans:
        metadata = core.read_node(plan.name).metadata
        _apply(objects, "resourceslices", resource_slice(plan, metadata.uid if metadata else None))
    return len(dra_plans)


def delete(api_client: client.ApiClient, node_names: Iterable[str]) -> None:
    """Delete the nodes' ResourceSlices (garbage collection would, later); missing ones are fine."""
    objects = client.CustomObjectsApi(api_client)
    for name in node_names:
        try:
            objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_name(name))
        except client.ApiException as error:
            if error.status != 404:
                raise
