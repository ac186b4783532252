"""The agents as the chart runs them, on kwok nodes: a DaemonSet whose controller makes one pod per node.

The operator takes only pods controlled by a DaemonSet in its agent namespace for agents
(`agent_pods.is_agent`), so tests run their agent pods the same way. The pods carry kwok's
status annotation: kwok leaves their status to the test, which writes the Ready condition
as the kubelet would after the readiness probe of the agent's /readyz.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

PAUSE = [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]


def create(
    api: client.ApiClient,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    node_selector: Mapping[str, str],
) -> None:
    """A DaemonSet `name` in `namespace` whose pods carry `labels`, on the nodes `node_selector` selects."""
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": {local.KWOK_STATUS_ANNOTATION: "custom"},
                },
                "spec": {
                    "nodeSelector": dict(node_selector),
                    "tolerations": [{"operator": "Exists"}],
                    "containers": PAUSE,
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }
    client.AppsV1Api(api).create_namespaced_daemon_set(namespace, body)


def delete(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete the DaemonSet and, in the foreground, its pods."""
    try:
        client.AppsV1Api(api).delete_namespaced_daemon_set(
            name, namespace, propagation_policy="Foreground", grace_period_seconds=0
        )
    except client.ApiException as error:
        if error.status != 404:
            raise


def pod_on(core: client.CoreV1Api, namespace: str, selector: str, node: str, timeout: float = 60) -> str:
    """The name of the DaemonSet's live pod on `node` (the controller creates it; the scheduler binds it)."""
    found: list[str] = []

    def placed() -> bool:
        pods = core.list_namespaced_pod(
            namespace, label_selector=selector, field_selector=f"spec.nodeName={node}"
        ).items
        found[:] = [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]
        return bool(found)

    waiting.wait_until(placed, timeout_seconds=timeout, message=f"the DaemonSet's pod on {node}")
    return found[0]


def set_ready(core: client.CoreV1Api, namespace: str, pod: str, ready: bool) -> None:
    """What the kubelet writes when the readiness probe of the agent's /readyz passes or fails."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = "True" if ready else "False"
    conditions = [
        {"type": kind, "status": value, "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")
    ]
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": {"phase": "Running", "conditions": conditions}}
    )
