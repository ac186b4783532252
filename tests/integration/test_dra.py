"""Per-GPU quarantine machinery on the real control plane: DRA allocation and a DeviceTaintRule.

A simulated DRA node (fake NVIDIA DRA driver, module `gpuhealth_sim.fleet.dra`)
with 8 GPUs takes 8 one-GPU pods through the real kube-scheduler; a 9th
waits. A DeviceTaintRule with effect NoExecute on the device of GPU 3 —
found, as the operator will find it, by the UUID the node's agent reports in
its GPUNode — makes the real kube-controller-manager evict only the pod that
holds it (kwok completes the deletion), the other 7 keep running, the node
stays schedulable, and no claim is given that device while the rule stands;
deleting the rule makes it allocatable again. The rule is built by the
operator's pure `decisions.device_taints`, in the version discovery says is
served. This is what `IsolateGPU` will rely on; the test prints the
taint → pod-gone latency.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import sim_fleets
from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_operator.decisions import device_taints
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import agentpool, dra, fleetfile

pytestmark = pytest.mark.integration

NODE_POOL = "itdra"
NODE = f"{NODE_POOL}-0"
GPUS = 8
FAULTY = 3
RULE = device_taints.rule_name(NODE, FAULTY)
FLEET = {
    "agent": {"intervalSeconds": 0.5, "heartbeatSeconds": 5},
    "pools": [
        {"name": NODE_POOL, "count": 1, "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": GPUS}, "dra": True}
    ],
}


@pytest.fixture
def dra_node(crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[agentpool.Fleet]:
    with sim_fleets.running(k8s, fleetfile.parse(FLEET, source="test fleet"), workers=1) as sim:
        yield sim


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {"name": "train", "image": "trainer:1", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
    }


def _devices_by_pod(objects: client.CustomObjectsApi, namespace: str) -> dict[str, str | None]:
    """Pod name → the device its generated claim was allocated (None: not allocated)."""
    claims = objects.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")
    found: dict[str, str | None] = {}
    for claim in claims["items"]:
        owner = next(ref["name"] for ref in claim["metadata"]["ownerReferences"] if ref["kind"] == "Pod")
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        found[owner] = results[0]["device"] if results else None
    return found


def _phases(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    return {
        pod.metadata.name: pod.status.phase
        for pod in core.list_namespaced_pod(namespace).items
        if pod.metadata.deletion_timestamp is None
    }


def _served_taint_rule_version(objects: client.CustomObjectsApi) -> str | None:
    """Discovery, as the operator will read it: the resource.k8s.io versions that list devicetaintrules."""
    serving = []
    for version in device_taints.KNOWN_VERSIONS:
        try:
            found = objects.get_api_resources(device_taints.GROUP, version)
        except client.ApiException as error:
            if error.status == 404:
                continue
            raise
        if any(r.name == device_taints.PLURAL for r in found.resources):
            serving.append(version)
    return device_taints.served_version(serving)


def _assert_rules_are_acted_on(objects: client.CustomObjectsApi, api_version: str) -> None:
    """The probe the operator will run: a harmless rule the controller manager gives a status."""
    probe = device_taints.probe_rule(api_version, "itdra")
    name = probe["metadata"]["name"]
    objects.create_cluster_custom_object(device_taints.GROUP, api_version, device_taints.PLURAL, probe)
    try:
        waiting.wait_until(
            lambda: device_taints.acknowledged(
                objects.get_cluster_custom_object(
                    device_taints.GROUP, api_version, device_taints.PLURAL, name
                )
            ),
            timeout_seconds=30,
            message="the controller manager acknowledging the probe DeviceTaintRule",
        )
    finally:
        objects.delete_cluster_custom_object(device_taints.GROUP, api_version, device_taints.PLURAL, name)


def test_device_taint_evicts_only_the_pod_on_that_gpu(
    dra_node: agentpool.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    objects = client.CustomObjectsApi(k8s)
    objects.create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]
                    }
                }
            },
        },
    )
    names = [f"train-{i}" for i in range(GPUS + 1)]
    for name in names:
        core.create_namespaced_pod(namespace, _pod(name))

    def placed() -> dict[str, str | None] | None:
        phases, devices = _phases(core, namespace), _devices_by_pod(objects, namespace)
        running = [name for name, phase in phases.items() if phase == "Running"]
        return devices if len(running) == GPUS and len(devices) == GPUS + 1 else None

    devices = waiting.wait_until(placed, timeout_seconds=60, message=f"{GPUS} of {GPUS + 1} pods running")
    allocated = {pod: device for pod, device in devices.items() if device is not None}
    assert sorted(allocated.values()) == sorted(dra.device_name(i) for i in range(GPUS)), (
        "one distinct GPU each"
    )
    (waiting_pod,) = set(names) - set(allocated)
    assert _phases(core, namespace)[waiting_pod] == "Pending"

    # The operator's path: the GPU's UUID from the agent's report, then its device in the slices.
    def reported() -> list[dict[str, Any]] | None:
        gpunode = objects.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, NODE
        )
        gpus: list[dict[str, Any]] = gpunode.get("status", {}).get("gpus", [])
        return gpus if len(gpus) == GPUS else None

    gpus = waiting.wait_until(
        reported, timeout_seconds=30, message=f"the agent of {NODE} reporting {GPUS} GPUs"
    )
    uuid = next(gpu["uuid"] for gpu in gpus if gpu["index"] == FAULTY)
    slices = objects.list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={NODE}"
    )
    found = device_taints.devices_by_uuid(slices["items"])
    assert set(found) == {gpu["uuid"] for gpu in gpus}, "every GPU the agent reports is a DRA device"
    device = found[uuid]
    assert (device.driver, device.pool) == (dra.DRIVER, NODE)
    api_version = _served_taint_rule_version(objects)
    assert api_version == "v1beta2", "Kubernetes 1.36 serves DeviceTaintRule in resource.k8s.io/v1beta2"
    _assert_rules_are_acted_on(objects, api_version)
    (victim,) = [pod for pod, name in allocated.items() if name == device.name]
    survivors = {
        pod: core.read_namespaced_pod(pod, namespace).metadata.uid for pod in allocated if pod != victim
    }

    tainted_at = time.monotonic()
    rule = device_taints.device_taint_rule(
        api_version=api_version,
        policy="itdra",
        node=NODE,
        gpu_index=FAULTY,
        gpu_uuid=uuid,
        device=device,
        condition=vocabulary.Condition.ECC_UNCORRECTABLE,
        effect=vocabulary.IsolationEffect.NO_EXECUTE,
    )
    objects.create_cluster_custom_object(device_taints.GROUP, api_version, device_taints.PLURAL, rule)
    try:

        def gone() -> bool:
            try:
                core.read_namespaced_pod(victim, namespace)
            except client.ApiException as error:
                if error.status == 404:
                    return True
                raise
            return False

        waiting.wait_until(
            gone, timeout_seconds=60, message=f"{victim} (on {device.name}) evicted and deleted"
        )
        latency = time.monotonic() - tainted_at
        print(f"\nDeviceTaintRule NoExecute on {device.name} -> pod {victim} gone: {latency:.2f} s")
        ours = objects.list_cluster_custom_object(
            device_taints.GROUP,
            api_version,
            device_taints.PLURAL,
            label_selector=f"{keys.POLICY_LABEL}=itdra",
        )
        assert [item["metadata"]["name"] for item in ours["items"]] == [RULE]

        # A new claim, too, must never get the tainted device.
        core.create_namespaced_pod(namespace, _pod("train-late"))

        def still_isolated() -> bool:
            phases, devices = _phases(core, namespace), _devices_by_pod(objects, namespace)
            uids = {pod: core.read_namespaced_pod(pod, namespace).metadata.uid for pod in survivors}
            return (
                uids == survivors
                and all(phases[pod] == "Running" for pod in survivors)
                and phases[waiting_pod] == "Pending"
                and phases.get("train-late") == "Pending"
                and device.name not in {d for pod, d in devices.items() if pod not in survivors}
            )

        waiting.holds(still_isolated, seconds=8, message="7 pods keep running, no claim gets the tainted GPU")
        assert not core.read_node(NODE).spec.unschedulable, "the node stays schedulable"
        assert latency < 30
    finally:
        objects.delete_cluster_custom_object(device_taints.GROUP, api_version, device_taints.PLURAL, RULE)

    # Recovery: with the rule gone the GPU is allocatable again; one of the two waiting pods gets it.
    def restored() -> str | None:
        phases, devices = _phases(core, namespace), _devices_by_pod(objects, namespace)
        return next(
            (
                pod
                for pod in (waiting_pod, "train-late")
                if phases[pod] == "Running" and devices[pod] == device.name
            ),
            None,
        )

    waiting.wait_until(
        restored, timeout_seconds=60, message=f"a waiting pod scheduled onto {device.name} again"
    )
