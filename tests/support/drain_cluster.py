"""The in-memory cluster with pods, evictions and injectable API failures, for drain and cordon unit tests.

`memcluster.MemoryKube` holds no pods (a backtest's drains complete at once);
this one does: pods bound to nodes, evictions that delete a pod or are refused
by a PodDisruptionBudget (429), each counted. It can also refuse Events
(quota, admission) and lose the answer to a cordon (504 after, or instead of,
the write). `faulty_node` builds a context with a policy and GPU nodes, and
`report` writes an agent report as the watch would deliver it.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

import kopf

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers
from gpuhealth_operator.shared import context, settings
from gpuhealth_sim.backtest import memcluster

PODS = "/api/v1/pods"
EVENTS = memcluster.EVENTS


def event(kind: str, body: dict[str, Any]) -> kopf.RawEvent:
    return {"type": kind, "object": body}  # type: ignore[typeddict-item]


class DrainCluster(memcluster.MemoryKube):
    """MemoryKube plus pods and evictions, counted; Events and cordons can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[str, dict[str, Any]] = {}
        """namespace/name → pod."""
        self.guarded: set[str] = set()
        """namespace/name of pods whose eviction a PodDisruptionBudget refuses (429)."""
        self.evictions: list[tuple[float, str]] = []
        """(monotonic time, namespace/name) of every eviction request."""
        self.pod_lists = 0
        self.refuse_events = False
        """Every Event create answers 403 (a quota or an admission webhook said no)."""
        self.lose_cordon: str | None = None
        """"landed": the next cordon is written but answered 504; "lost": answered 504, not written."""

    def add_pod(self, node: str, name: str, namespace: str = "work") -> None:
        self.pods[f"{namespace}/{name}"] = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Any = None,
        body: object = None,
        content_type: str = "application/json",
        urgent: bool = False,
        exempt: bool = False,
    ) -> dict[str, Any]:
        if method == "GET" and path == PODS:
            self.requests_total += 1
            self.pod_lists += 1
            node = dict(memcluster._selector((query or {}).get("fieldSelector"))).get("spec.nodeName")
            found = [p for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
            return {"items": copy.deepcopy(found), "metadata": {}}
        if method == "POST" and path.endswith("/eviction"):
            self.requests_total += 1
            namespace, name = path.split("/")[4], path.split("/")[6]
            key = f"{namespace}/{name}"
            self.evictions.append((time.monotonic(), key))
            if key not in self.pods:
                raise kube.ApiError(404, "NotFound", f"pods {name} not found")
            if key in self.guarded:
                raise kube.ApiError(
                    429, "TooManyRequests", "Cannot evict pod as it would violate the budget."
                )
            del self.pods[key]
            return {}
        if method == "POST" and path == EVENTS and self.refuse_events:
            self.requests_total += 1
            raise kube.ApiError(403, "Forbidden", 'events is forbidden: exceeded quota: "events"')
        if method == "PATCH" and urgent and self.lose_cordon is not None:
            how, self.lose_cordon = self.lose_cordon, None
            if how == "landed":
                await super().request(method, path, query=query, body=body, content_type=content_type)
            raise kube.ApiError(504, "Gateway Timeout", "the server was unable to return a response in time")
        return await super().request(
            method, path, query=query, body=body, content_type=content_type, urgent=urgent, exempt=exempt
        )


def policy_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    }


def drain_spec(pool: str, **extra: Any) -> dict[str, Any]:
    """A policy draining `pool`'s nodes on uncorrectable ECC errors."""
    spec: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "maxUnavailable": 1,
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        "drain": {"timeoutSeconds": 600, "force": True},  # the test pods have no controller
    }
    spec.update(extra)
    return spec


def node_body(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {keys.GPU_COUNT_LABEL: "8", **labels}},
        "spec": {},
        "status": {"capacity": {keys.GPU_RESOURCE: "8"}},
    }


def make_context(cluster: DrainCluster) -> context.Context:
    config = settings.Settings(eviction_backoff_initial_seconds=0.01, eviction_backoff_max_seconds=0.01)
    return operator_context.new_context(cluster, config=config)  # type: ignore[arg-type]


async def start(
    cluster: DrainCluster, policies: dict[str, dict[str, Any]], nodes: dict[str, dict[str, str]]
) -> context.Context:
    """A context on `cluster` with these policies (name → spec) and Nodes (name → labels), all healthy."""
    ctx = make_context(cluster)
    for name, spec in policies.items():
        await handlers.on_policy(event("ADDED", policy_body(name, spec)), memo=ctx)
    for name, labels in nodes.items():
        cluster.put_node(node_body(name, labels))
        await handling.handle(handlers.on_node, event("ADDED", copy.deepcopy(cluster.nodes[name])), ctx)
        await report(cluster, ctx, name, ecc=0)
    return ctx


async def report(
    cluster: DrainCluster, ctx: context.Context, name: str, *, ecc: int, observed: str | None = None
) -> None:
    """The agent reports `ecc` uncorrectable errors on GPU 0 (0: healthy), seen at `observed` (RFC 3339,
    default now); the watch delivers it."""
    facts = gpunode_facts.agent_status(
        overrides={0: {"ecc": {"uncorrectedVolatile": ecc}}}, observed=observed
    )
    stored = cluster.put_gpunode(name, facts)
    await handling.handle(handlers.on_gpunode, event("MODIFIED", copy.deepcopy(stored)), ctx)


async def node_changed(cluster: DrainCluster, ctx: context.Context, name: str, **labels: str | None) -> None:
    """Someone relabels the Node (None removes a label); the watch delivers it."""
    node = cluster.nodes[name]
    current = node["metadata"].setdefault("labels", {})
    for key, value in labels.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    cluster.put_node(node)
    await handling.handle(handlers.on_node, event("MODIFIED", copy.deepcopy(cluster.nodes[name])), ctx)


async def deliver(cluster: DrainCluster, ctx: context.Context, name: str) -> None:
    """The watch delivers the Node as the cluster holds it now."""
    await handling.handle(handlers.on_node, event("MODIFIED", copy.deepcopy(cluster.nodes[name])), ctx)


async def until(condition: Callable[[], bool], seconds: float = 5.0, what: str = "the condition") -> None:
    """Poll `condition` on the running loop (a drain runs on it) until it holds; fail after `seconds`,
    naming `what` was awaited."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        await asyncio.sleep(0.01)
