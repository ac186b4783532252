"""Which DCGM host engine a Validation Job talks to (issue 48, Deliver 3): the node's own, if it runs one.

DCGM expects one `nv-hostengine` per node. The GPU Operator's standalone DCGM operand (`nvidia-dcgm`,
with `dcgm.enabled=true`; its DaemonSet selects `nvidia.com/gpu.deploy.dcgm=true`) runs one listening on
hostPort 5555, and points its dcgm-exporter at it (`DCGM_REMOTE_HOSTENGINE_INFO=nvidia-dcgm:5555`). Where
such a pod runs on the node, validation connects to it (`dcgmi diag --host <node IP>:<port>`) instead of
starting a second engine beside it; where none runs (no GPU Operator, or an exporter with its embedded
engine, which no `dcgmi` can reach), the template starts its own. The answer goes to the Job as
`keys.REPAIR_HOSTENGINE_ENV` (empty: none).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_operator.decisions import workload_pods

DCGM_LABEL: Final = "nvidia.com/gpu.deploy.dcgm"
"""The GPU Operator's operand label of its standalone DCGM host engine (`nvidia-dcgm`)."""
DEFAULT_PORT: Final = 5555
"""nv-hostengine's default TCP port, the hostPort of the GPU Operator's `nvidia-dcgm` DaemonSet."""


def address(pods: Iterable[Mapping[str, Any]], namespace: str) -> str | None:
    """`<host IP>:<port>` of a running standalone DCGM host engine among the node's pods, else None.

    A pod counts when it is the GPU Operator's (`operands_pod`: in `namespace`, controlled by a
    DaemonSet), runs (phase Running, not being deleted) and selects the GPU Operator's DCGM label: its
    `status.hostIP` (written by the kubelet; anything but an IP address is refused, since it becomes a
    command argument) and the hostPort of its container port 5555 (or one named `dcgm`), else 5555."""
    for pod in pods:
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if (spec.get("nodeSelector") or {}).get(DCGM_LABEL) != "true" or not operands_pod(pod, namespace):
            continue
        if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            ip = ipaddress.ip_address(str(status.get("hostIP") or ""))
        except ValueError:
            continue
        port = _host_port(spec)
        return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return None


def operands_pod(pod: Mapping[str, Any], namespace: str) -> bool:
    """Whether `pod` is one of the GPU Operator's operand pods: in its namespace, controlled by a DaemonSet.

    A pod's labels, nodeSelector, name and ports are anyone's to copy, and a tenant's pod on the node can
    listen on the host's port 5555 where no nvidia-dcgm does. A Validation Job that asked such a "host
    engine" would take the tenant's word that the GPUs are healthy and return a faulty node to service.
    Creating pods in the GPU Operator's namespace takes rights a tenant does not have."""
    return workload_pods.daemonset_pod_in(pod, namespace)


def _host_port(spec: Mapping[str, Any]) -> int:
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("containerPort") == DEFAULT_PORT or port.get("name") == "dcgm":
                host = port.get("hostPort")
                return host if isinstance(host, int) and 0 < host < 65536 else DEFAULT_PORT
    return DEFAULT_PORT
