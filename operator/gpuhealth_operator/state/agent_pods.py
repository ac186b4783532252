"""The agents' DaemonSet pods as the operator last saw them: one liveness record per node.

Fed by a watch of the pods matching `--agent-pod-selector` (a server-side
label selector, so the API server sends only agent pods, one per GPU node),
read by the verdicts (`decisions.liveness`). `AgentPods` is the only writer
of these records. Labels are anyone's to copy: only a pod that `is_agent`
(in `--agent-pod-namespace`, controlled by a DaemonSet) is the agent, so a
tenant's pod with the agent's labels can neither make a node Unknown (which
never drains) nor keep a dead agent's node live. A node no agent pod was ever seen on has no record: its
staleness falls back to the GPUNode heartbeat alone (agents run outside
Kubernetes, as in the simulator).
"""

from __future__ import annotations

import datetime
import types
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from gpuhealth_operator.decisions import liveness, times, workload_pods


def is_agent(body: Mapping[str, Any], namespace: str | None) -> bool:
    """Whether a pod the selector matched is an agent: controlled by a DaemonSet (apps), and in
    `namespace` (the chart's release namespace; None: any, for a replay of pods recorded as agents).

    Creating pods in that namespace needs rights a tenant does not have; a tenant's own DaemonSet
    lives in the tenant's namespace.
    """
    return workload_pods.daemonset_pod_in(body, namespace)


def pod_readiness(body: Mapping[str, Any]) -> tuple[str, str, bool, datetime.datetime | None] | None:
    """(node, namespace/name, Ready, when the Ready condition last changed) of a pod; None if unscheduled."""
    meta = body.get("metadata") or {}
    node = (body.get("spec") or {}).get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    for condition in (body.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            return node, name, ready, times.parse(condition.get("lastTransitionTime"))
    return node, name, False, None


class AgentPods:
    """node → `liveness.AgentPod`; `nodes` is a read-only view, `observe` and `deleted` the only writers."""

    def __init__(self) -> None:
        self._nodes: dict[str, liveness.AgentPod] = {}
        self.nodes: Mapping[str, liveness.AgentPod] = types.MappingProxyType(self._nodes)
        self._not_ready: set[str] = set()

    @property
    def not_ready_nodes(self) -> AbstractSet[str]:
        """The nodes whose agent pod is known and not Ready (`not_ready`), for the timer to look at."""
        return self._not_ready

    def _store(self, node: str, pod: liveness.AgentPod) -> None:
        self._nodes[node] = pod
        if pod.ready:
            self._not_ready.discard(node)
        else:
            self._not_ready.add(node)

    def get(self, node: str) -> liveness.AgentPod | None:
        return self._nodes.get(node)

    def observe(self, body: Mapping[str, Any], now: datetime.datetime) -> str | None:
        """Store a pod as a watch event (or a LIST) shows it; the node whose readiness changed, else None.

        The first sighting of a node's agent dates a NotReady pod from its Ready condition's
        last transition (at the latest now), so an operator restart does not restart the grace.
        """
        seen = pod_readiness(body)
        if seen is None:
            return None
        node, name, ready, transition = seen
        known = self._nodes.get(node)
        when = now if known is not None or transition is None else min(transition, now)
        self._store(node, liveness.observe(known, name, ready, when))
        return node if known is None or known.ready != ready else None

    def deleted(self, body: Mapping[str, Any], now: datetime.datetime) -> str | None:
        """A pod was deleted: its node has no Ready agent from now (until another pod turns Ready)."""
        seen = pod_readiness(body)
        if seen is None:
            return None
        node, name, _, _ = seen
        known = self._nodes.get(node)
        if known is None:
            return None
        self._store(node, liveness.observe(known, name, False, now, gone=True))
        return node if known.ready != self._nodes[node].ready else None

    def not_ready(self, node: str) -> bool:
        """Whether the node's agent pod is known and not Ready (its clock runs towards staleness)."""
        known = self._nodes.get(node)
        return known is not None and not known.ready

    def forget_node(self, node: str) -> None:
        """The Node is gone: so is its agent pod's record."""
        self._nodes.pop(node, None)
        self._not_ready.discard(node)
