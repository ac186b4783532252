"""The operator's replay entry point (`gpuhealth_operator.replay.Operator`) over the in-memory cluster:
what a replay feeds it (watch events, the timer's pass) and what it reads back, at the replay's clock."""

from __future__ import annotations

import asyncio
import datetime
import pathlib

from gpuhealth_api import keys
from gpuhealth_operator import replay
from gpuhealth_sim.backtest import memcluster, replayer
from gpunode_facts import agent_status

START = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
POLICY = pathlib.Path(__file__).parents[3] / "examples" / "default-policy.yaml"


def _node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def _agent_pod(node: str, ready: bool) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "gpu-health",
            "name": f"agent-{node}",
            "ownerReferences": [replayer.AGENT_OWNER],
        },
        "spec": {"nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_replay_feeds_the_operator_events_and_reads_back_its_selection_budget_and_labels() -> None:
    client = memcluster.MemoryKube()
    now = [START]
    operator = replay.Operator(client, lambda: now[0], agent_pod_namespace="gpu-health", instance="test")

    async def scene() -> None:
        await operator.policy_event("ADDED", replayer.load_policy(POLICY))
        for name in ("n1", "n2"):
            body = client.put_node(_node(name))
            await operator.node_event("ADDED", dict(body))
            client.put_gpunode(name, {})
            stored = client.put_gpunode(name, agent_status(heartbeat=now[0].strftime("%Y-%m-%dT%H:%M:%SZ")))
            await operator.gpunode_event("MODIFIED", dict(stored))
        await operator.agent_pod_event("MODIFIED", _agent_pod("n1", ready=True))
        await operator.agent_pod_event("MODIFIED", _agent_pod("n2", ready=False))
        now[0] += datetime.timedelta(seconds=30)
        await operator.tick(full=True, statuses=True)

    asyncio.run(scene())
    assert operator.selects("default", "n1") and operator.selects("default", "n2")
    assert not operator.selects("default", "n3") and not operator.selects("other", "n1")
    assert operator.max_unavailable("default") == 1  # 10 % of two nodes, at least one
    assert operator.max_unavailable("other") is None
    assert operator.agent_ready("n1") is True and operator.agent_ready("n2") is False
    assert operator.agent_ready("n3") is None
    # What it wrote went to the client it was given: healthy nodes, labelled so.
    assert client.nodes["n1"]["metadata"]["labels"][keys.HEALTH_LABEL] == "healthy"
    assert replay.DRAIN_STARTED_ANNOTATION.startswith(keys.PREFIX + "/")
    assert {"health", "conditions"} <= replay.OPERATOR_STATUS_FIELDS
