"""The demo's GPU Operator operands (issue 48): a device plugin and a dcgm-exporter that hold the GPUs.

Each is a DaemonSet selecting the GPU Operator's own per-node label (`nvidia.com/gpu.deploy.device-plugin`,
`nvidia.com/gpu.deploy.dcgm-exporter` = "true", as the GPU Operator's DaemonSets do), on every GPU node
of the demo (the labels set as the GPU Operator would). kube-controller-manager places their pods and
deletes them when the operator turns a label off for a reset; the simulated reset fails while one runs
(`fleet.repairs`). So the demo's reset waits for them, and for the agent, then returns the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from kubernetes import client

from gpuhealth_sim import waiting
from gpuhealth_sim.demo import record
from gpuhealth_sim.fleet import fleetfile

NAMESPACE: Final = "gpu-health-demo-operands"
"""Not the GPU Operator's own namespace: on a borrowed cluster that may run the real one."""
OPERANDS: Final = {
    "nvidia-device-plugin-daemonset": "nvidia.com/gpu.deploy.device-plugin",
    "nvidia-dcgm-exporter": "nvidia.com/gpu.deploy.dcgm-exporter",
}


def daemonset(name: str, label: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {label: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "operand", "image": f"nvcr.io/nvidia/{name}:simulated"}],
                },
            },
        },
    }


def start(api: client.ApiClient, spec: fleetfile.Fleet) -> int:
    """Label the GPU nodes as the GPU Operator would, start the operand DaemonSets, wait for their pods;
    the number of operand pods Running."""
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    names = [plan.name for plan in spec.nodes if not plan.dra]
    for name in names:
        core.patch_node(name, {"metadata": {"labels": dict.fromkeys(OPERANDS.values(), "true")}})
    apps = client.AppsV1Api(api)
    for name, label in OPERANDS.items():
        apps.create_namespaced_daemon_set(NAMESPACE, daemonset(name, label))  # type: ignore[arg-type]
    wanted = len(names) * len(OPERANDS)

    def running() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE).items
        return sum(1 for p in pods if p.status and p.status.phase == "Running") >= wanted

    waiting.wait_until(running, timeout_seconds=90, interval_seconds=0.5, message="operand pods Running")
    return wanted


def coordinated(events: Iterable[record.EventLine]) -> list[str]:
    """One line per reset that waited for the operands and the agent (its RepairStarted says so)."""
    lines = []
    for event in events:
        if event.reason == "RepairStarted" and "(ResetGPU)" in event.message and ") after " in event.message:
            waited = event.message.split(") after ", 1)[1].rstrip(".")
            lines.append(f"{event.node}: the GPU reset started after {waited}")
    return lines
