"""Status writes by server-side apply: the operator's fields of GPUNode and GPUHealthPolicy.

The agent owns `status.agent`, `status.summary` and `status.gpus` of a GPUNode
under its own field manager; applying only our fields under ours leaves
those untouched, and the API server merges `status.conditions` by `type`.
"""

from __future__ import annotations

from typing import Any

from gpuhealth_api import resources
from gpuhealth_operator.client import kube


def gpunode_status_path(name: str) -> str:
    return f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}/{name}/status"


def policy_path(name: str) -> str:
    return f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.POLICY_PLURAL}/{name}"


def policy_status_path(name: str) -> str:
    return f"{policy_path(name)}/status"


async def apply_gpunode(client: kube.Client, name: str, status: dict[str, Any]) -> kube.JsonObject:
    """Apply the operator's part of a GPUNode status (health, issues, action, conditions, straggler)."""
    body = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.GPUNODE_KIND,
        "metadata": {"name": name},
        "status": status,
    }
    return await client.apply(gpunode_status_path(name), body, resources.OPERATOR_FIELD_MANAGER)


async def apply_policy(client: kube.Client, name: str, status: dict[str, Any]) -> kube.JsonObject:
    body = {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name},
        "status": status,
    }
    return await client.apply(policy_status_path(name), body, resources.OPERATOR_FIELD_MANAGER)
