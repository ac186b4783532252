"""A DRA check makes way for a pending pod that waits for its node (`ladder.check.check_yield`): its pod
is evicted and remembered, to be ended Preempted; a device-plugin check is left to the scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.decisions import waiting_pods
from gpuhealth_operator.ladder.check import check_yield


class Evicting:
    def __init__(self) -> None:
        self.evicted: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any], **_: object) -> dict[str, Any]:
        self.evicted.append((path, body))
        return body


def job(node: str, *, dra: bool) -> dict[str, Any]:
    claims = [{"name": "gpus", "resourceClaimTemplateName": f"t-{node}"}] if dra else []
    return {
        "metadata": {"name": f"job-{node}", "uid": f"uid-{node}", "labels": {keys.NODE_LABEL: node}},
        "spec": {"template": {"spec": {"resourceClaims": claims}}},
    }


def pod(node: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"job-{node}-x", "namespace": "gpu-health", **meta},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30},
        "status": {"phase": "Running"},
    }


def test_only_the_pods_of_dra_checks_on_waited_for_nodes_are_evicted_with_a_short_grace() -> None:
    client = Evicting()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    listed = [job("a", dra=True), job("b", dra=False), job("c", dra=True), job("d", dra=True)]
    pods = {
        "job-a": pod("a"),
        "job-b": pod("b"),
        "job-c": pod("c"),
        "job-d": pod("d", deletionTimestamp="2026-12-02T12:00:00Z"),
    }
    waits = waiting_pods.Waits(names=frozenset({"a", "b", "d"}))
    asyncio.run(check_yield.make_way(ctx, listed, pods, waits))
    ((path, body),) = client.evicted
    assert path == "/api/v1/namespaces/gpu-health/pods/job-a-x/eviction"
    assert body["deleteOptions"] == {"gracePeriodSeconds": check_yield.YIELD_GRACE_SECONDS}
    assert ctx.steps.check.yielded == {"uid-a": "a"}
