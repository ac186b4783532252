"""The lean diff base keeps exactly the essence kopf's stock one builds."""

from __future__ import annotations

import copy
from typing import Any, cast

import kopf
import pytest

from gpuhealth_operator.handlers import EssenceDiffBaseStorage
from gpunode_facts import agent_status

GPUNODE: dict[str, Any] = {
    "apiVersion": "gpuhealth.io/v1alpha1",
    "kind": "GPUNode",
    "metadata": {
        "name": "gpu-001",
        "uid": "u",
        "resourceVersion": "42",
        "labels": {"team": "a"},
        "annotations": {
            "gpuhealth.io/cordoned-by": "p",
            "kopf.gpuhealth.io/last-handled-configuration": "{}",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        },
        "managedFields": [{"manager": "gpuhealth-agent", "fieldsV1": {"f:status": {}}}],
    },
    "status": dict(agent_status()),
}
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-001", "labels": {"nvidia.com/gpu.present": "true"}},
    "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]},
    "status": {"capacity": {"nvidia.com/gpu": "8"}},
}
BARE: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}


@pytest.mark.parametrize("raw", [GPUNODE, NODE, BARE], ids=["gpunode", "node", "bare"])
def test_essence_matches_kopf(raw: dict[str, Any]) -> None:
    body = kopf.Body(cast(kopf.RawBody, copy.deepcopy(raw)))
    stock = kopf.AnnotationsDiffBaseStorage(prefix="kopf.gpuhealth.io").build(body=body)
    lean = EssenceDiffBaseStorage(prefix="kopf.gpuhealth.io").build(body=body)
    assert lean == stock


def test_extra_fields_still_come_from_the_whole_body() -> None:
    body = kopf.Body(cast(kopf.RawBody, copy.deepcopy(GPUNODE)))
    fields = [("status", "summary", "gpuCount")]
    stock = kopf.AnnotationsDiffBaseStorage(prefix="kopf.gpuhealth.io").build(body=body, extra_fields=fields)
    lean = EssenceDiffBaseStorage(prefix="kopf.gpuhealth.io").build(body=body, extra_fields=fields)
    assert lean == stock
    assert lean["status"] == {"summary": {"gpuCount": 8}}


def test_essence_is_a_copy() -> None:
    raw = copy.deepcopy(NODE)
    lean = EssenceDiffBaseStorage(prefix="kopf.gpuhealth.io").build(body=kopf.Body(cast(kopf.RawBody, raw)))
    lean["metadata"]["labels"]["changed"] = "yes"
    assert "changed" not in raw["metadata"]["labels"]
