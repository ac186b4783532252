"""A handled watch event gives back what the cache took from it; the decision is made all the same.

kopf holds every event until its handler returns, and a handler waits for the API
server while it acts; so once a GPUNode or Node is cached, the handler drops the
event's status and managedFields (the bulk of it). Measured in bench/RESULTS.md
(issue 14): at start-up thousands of handlers wait at once.
"""

import asyncio
import copy
from typing import Any

import kopf

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.runtime import handlers
from gpuhealth_sim.backtest import memcluster

POLICY = {
    "apiVersion": resources.API_VERSION,
    "kind": resources.POLICY_KIND,
    "metadata": {"name": "ecc", "generation": 1},
    "spec": {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]},
}
MANAGED = [{"manager": "gpu-health-agent", "operation": "Apply", "fieldsV1": {"f:status": {}}}]


def event(kind: str, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": body}  # type: ignore[typeddict-item]


def test_a_faulty_gpunode_event_is_acted_on_and_released() -> None:
    async def scenario() -> None:
        client = memcluster.MemoryKube()
        ctx = operator_context.new_context(client)
        await handlers.on_policy(event("ADDED", copy.deepcopy(POLICY)), memo=ctx)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "uid": "u1",
                "labels": {"nvidia.com/gpu.count": "8"},
                "managedFields": MANAGED,
            },
            "spec": {},
            "status": {"capacity": {keys.GPU_RESOURCE: "8"}},
        }
        client.put_node(copy.deepcopy(node))
        node_event = copy.deepcopy(node)
        await handling.handle(handlers.on_node, event("ADDED", node_event), ctx)
        assert "status" not in node_event and "managedFields" not in node_event["metadata"]
        assert ctx.cache.node("n1") is not None and ctx.cache.node("n1").view.gpu_capacity == 8  # type: ignore[union-attr]

        faulty = gpunode_facts.agent_status(overrides={1: {"ecc": {"uncorrectedVolatile": 2}}})
        stored = client.put_gpunode("n1", faulty)
        body = {**copy.deepcopy(stored), "metadata": {**stored["metadata"], "managedFields": MANAGED}}
        await handling.handle(handlers.on_gpunode, event("MODIFIED", body), ctx)

        assert client.nodes["n1"]["spec"].get("unschedulable") is True  # cordoned from the cached facts
        assert "status" not in body and "managedFields" not in body["metadata"]
        assert body["kind"] == resources.GPUNODE_KIND and body["metadata"]["uid"] == stored["metadata"]["uid"]

    asyncio.run(scenario())
