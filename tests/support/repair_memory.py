"""A repair on the in-memory cluster (issue 48): a policy that resets then reboots, one node, and the
test playing the agent (released on the GPUNode ask, `confirms`) and the GPU Operator's operand
DaemonSets (a pod per operand label that is "true", gone when it is not: `operands_follow_labels`)."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import gpunode_facts
import handling
import operator_context
from gpuhealth_api import keys, resources
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import handlers, ticker
from gpuhealth_operator.shared import context, settings
from gpuhealth_sim.backtest import memcluster

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
NODE = "gpu-node-1"
OPERATOR_NAMESPACE = "gpu-operator"
HOST_IP = "10.0.0.7"
"""The node's IP, as the kubelet writes it in its pods' `status.hostIP`."""


class Cluster(memcluster.MemoryKube):
    """The in-memory cluster, also serving merge patches of a GPUNode's annotations."""

    async def request(self, method: str, path: str, **kwargs: Any) -> kube.JsonObject:
        name = path.removeprefix(memcluster.GPUNODES)
        if method == "PATCH" and path.startswith(memcluster.GPUNODES) and "/" not in name:
            current = self.gpunodes.get(name)
            if current is None:
                raise kube.ApiError(404, "NotFound", path)
            body = kwargs.get("body")
            assert isinstance(body, dict) and set(body) == {"metadata"}, body
            self.gpunodes[name] = self.bump(memcluster.merge_patch(copy.deepcopy(current), body))
            return copy.deepcopy(self.gpunodes[name])
        return await super().request(method, path, **kwargs)


def operand_pod(label: str) -> dict[str, Any]:
    """The GPU Operator's DaemonSet pod of one operand on the node (it selects `<label>=true`)."""
    operand = label.rsplit(".", 1)[1]
    container: dict[str, Any] = {"name": operand, "image": f"nvcr.io/nvidia/{operand}:fake"}
    if operand == "dcgm":  # the standalone host engine, as the GPU Operator's nvidia-dcgm: hostPort 5555
        container["ports"] = [{"name": "dcgm", "containerPort": 5555, "hostPort": 5555}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"nvidia-{operand}-{NODE}",
            "namespace": OPERATOR_NAMESPACE,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": f"nvidia-{operand}",
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": NODE, "nodeSelector": {label: "true"}, "containers": [container]},
        "status": {"phase": "Running", "hostIP": HOST_IP},
    }


class Fleet:
    def __init__(
        self,
        *,
        confirms: bool = True,
        labels: dict[str, str] | None = None,
        cluster: Cluster | None = None,
        can_release: bool = True,
        gpu_operator_namespace: str = OPERATOR_NAMESPACE,
    ) -> None:
        self.cluster = cluster or Cluster()
        self.gpu_operator_namespace = gpu_operator_namespace
        self.cluster.clock = self.epoch
        self.now = T0
        self.confirms = confirms
        self.can_release = can_release
        """The agent says it can release (`status.agent.canRelease`, issue 48); an older agent cannot."""
        self.faulty = True
        self.labels = {"pool": "gpu", **(labels or {})}
        self.gpu_facts: dict[int, dict[str, Any]] = {}
        """More facts per GPU index, merged into every report (e.g. NVSwitch fabric info)."""
        self.operands_follow_labels = True
        """The DaemonSet controller: a pod for each operand label that is "true", none otherwise."""
        self.ctx = self.operator()

    def epoch(self) -> float:
        return self.now.timestamp()

    def operator(self) -> context.Context:
        config = settings.Settings(gpu_operator_namespace=self.gpu_operator_namespace)
        return operator_context.new_context(self.cluster, config=config, clock=lambda: self.now)

    def policy(self) -> dict[str, Any]:
        spec = {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "maxUnavailable": "100%",
            "recovery": {"healthyForSeconds": 3600, "uncordon": True},
            "repair": {
                "steps": [
                    {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300},
                    {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 600},
                ],
                "validation": {"timeoutSeconds": 300},
                "maxConcurrent": 1,
            },
        }
        body: dict[str, Any] = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND}
        return body | {"metadata": {"name": "p", "generation": 1}, "spec": spec}

    async def start(self) -> None:
        await handlers.on_policy({"type": "ADDED", "object": self.policy()}, memo=self.ctx)  # type: ignore[typeddict-item]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "uid": "uid-1",
                "labels": dict(self.labels),
                "creationTimestamp": gpunode_facts.rfc3339(self.now),
            },
            "spec": {},
        }
        stored = self.cluster.put_node(node)
        self.daemonsets(placing=True)
        await handling.handle(handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(stored)}, self.ctx)
        await self.report()

    async def restart(self) -> None:
        """kill -9 and a new process (or a new leader): it lists the policy (as stored, with its status),
        the Node and the GPUNode."""
        self.ctx = self.operator()
        stored = {**self.policy(), "status": (self.cluster.policies.get("p") or {}).get("status") or {}}
        await handlers.on_policy({"type": "ADDED", "object": stored}, memo=self.ctx)  # type: ignore[typeddict-item]
        for node in self.cluster.nodes.values():
            await handling.handle(
                handlers.on_node, {"type": "ADDED", "object": copy.deepcopy(node)}, self.ctx
            )
        for gpunode in self.cluster.gpunodes.values():
            event = {"type": "ADDED", "object": copy.deepcopy(gpunode)}
            await handling.handle(handlers.on_gpunode, event, self.ctx)

    def node_labels(self) -> dict[str, str]:
        return dict(self.cluster.nodes[NODE]["metadata"].get("labels") or {})

    def node_annotations(self) -> dict[str, str]:
        return dict(self.cluster.nodes[NODE]["metadata"].get("annotations") or {})

    async def human_label(self, key: str, value: str | None) -> None:
        """`kubectl label node` by a human (None: remove)."""

        def edit(node: dict[str, Any]) -> None:
            labels = node["metadata"].setdefault("labels", {})
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value

        node = copy.deepcopy(self.cluster.nodes[NODE])
        edit(node)
        stored = self.cluster.put_node(node)
        await handling.handle(
            handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    def daemonsets(self, *, placing: bool = False) -> None:
        if not (self.operands_follow_labels or placing):
            return
        labels = self.node_labels()
        for label in keys.GPU_OPERATOR_OPERAND_LABELS:
            pod = operand_pod(label)
            key = f"{OPERATOR_NAMESPACE}/{pod['metadata']['name']}"
            if labels.get(label) == "true" and key not in self.cluster.pods:
                self.cluster.put_pod(pod)
            elif labels.get(label) != "true":
                self.cluster.pods.pop(key, None)

    def operand_pods(self) -> list[str]:
        return sorted(k for k in self.cluster.pods if k.startswith(OPERATOR_NAMESPACE + "/"))

    def asked(self) -> str | None:
        gpunode = self.cluster.gpunodes.get(NODE) or {}
        return ((gpunode.get("metadata") or {}).get("annotations") or {}).get(keys.RELEASE_GPUS_ANNOTATION)

    async def report(self) -> None:
        overrides: dict[int, dict[str, Any]] = {0: {"ecc": {"uncorrectedVolatile": 2}}} if self.faulty else {}
        for index, facts in self.gpu_facts.items():
            overrides[index] = {**overrides.get(index, {}), **facts}
        status = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(self.now),
            observed=gpunode_facts.rfc3339(self.now),
            overrides=overrides,
        )
        if self.can_release:
            status["agent"]["canRelease"] = True
        asked = self.asked()
        if asked is not None and self.confirms:
            status["agent"]["released"] = asked
        stored = self.cluster.put_gpunode(NODE, status)
        await handling.handle(
            handlers.on_gpunode, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, self.ctx
        )

    async def tick(self, seconds: float = 1.0, times: int = 1) -> None:
        for _ in range(times):
            self.now += datetime.timedelta(seconds=seconds)
            self.daemonsets()
            await self.report()
            await ticker.tick(self.ctx, full=True)
            self.daemonsets()

    def action(self) -> str:
        """The GPUNode's `status.action`."""
        return str(self.cluster.gpunodes[NODE]["status"].get("action"))

    def jobs(self, action: str) -> list[dict[str, Any]]:
        return [
            j
            for j in self.cluster.job_log
            if (j["metadata"].get("labels") or {}).get(keys.REPAIR_ACTION_LABEL) == action
        ]

    def messages(self, reason: str) -> list[str]:
        return [str(e.get("message")) for e in self.cluster.event_log if e.get("reason") == reason]
