"""The demo's training job: a Deployment with one 8-GPU pod per node and its PodDisruptionBudget.

A real synchronous training job occupies whole GPU nodes; asking for all of
a node's GPUs (`nvidia.com/gpu: 8`) puts one pod on each node through the
scheduler's own resource accounting, no affinity rules needed. The PDB is
what a careful team sets so that maintenance never takes out more than a
couple of workers at once; the operator's drains go through the Eviction
API and must respect it.
"""

from typing import Any

from gpuhealth_api import keys

NAMESPACE = "training"
NAME = "llm-pretrain"
DRA_NAME = "finetune"
"""One-GPU pods on the DRA nodes, each GPU allocated by a ResourceClaim (DeviceClass gpu.nvidia.com)."""
IMAGE = "registry.example.com/ml/llm-pretrain:2026.11"


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def deployment(replicas: int, gpus_per_pod: int, node_selector: dict[str, str]) -> dict[str, Any]:
    labels = {"app": NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {keys.GPU_PRESENT_LABEL: "true", **node_selector},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": IMAGE,
                            "resources": {
                                "requests": {
                                    keys.GPU_RESOURCE: str(gpus_per_pod),
                                    "cpu": "32",
                                    "memory": "256Gi",
                                },
                                "limits": {keys.GPU_RESOURCE: str(gpus_per_pod)},
                            },
                        }
                    ],
                },
            },
        },
    }


def disruption_budget(max_unavailable: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": NAME}}},
    }


def manifests(replicas: int, gpus_per_pod: int, node_selector: dict[str, str]) -> list[dict[str, Any]]:
    return [
        namespace(),
        deployment(replicas, gpus_per_pod, node_selector),
        disruption_budget(max_unavailable=2),
    ]


def dra_manifests(replicas: int, device_class: str) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate of one GPU and a Deployment of `replicas` one-GPU pods using it."""
    labels = {"app": DRA_NAME}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}
        },
    }
    deployment_ = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DRA_NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {"name": "trainer", "image": IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                },
            },
        },
    }
    return [template, deployment_]
