"""A GPU fleet and the operator against a real API server, for integration tests, e2e tests and benchmarks.

Tests drive the API server the way production does: kwok-managed Nodes,
GPUNode status written by server-side apply under the agent's field manager
(exactly the fields the agent owns), and the operator running as its own
process. Built on the simulator's `processes` and `ports`; tests wait with
`gpuhealth_sim.waiting.wait_until`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from kubernetes import client

import gpunode_facts
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import ports, processes
from gpuhealth_sim.fleet import nodes


@dataclasses.dataclass
class Fleet:
    """Creates kwok GPU Nodes with GPUNodes, reports facts as the agent would, and cleans up."""

    api: client.ApiClient
    label: str
    """Value of the `gpuhealth.io/test` label every node of this fleet carries (for policy selectors)."""
    names: list[str] = dataclasses.field(default_factory=list)
    policies: list[str] = dataclasses.field(default_factory=list)

    LABEL_KEY = "gpuhealth.io/test"

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def add_node(
        self, name: str, *, gpus: int = 8, labels: Mapping[str, str] | None = None, report: bool = True
    ) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    keys.GPU_PRESENT_LABEL: "true",
                    self.LABEL_KEY: self.label,
                    **(labels or {}),
                },
                "annotations": {nodes.KWOK_ANNOTATION: nodes.KWOK_MANAGED},
            },
        }
        node = _json(self.core.create_node(body=client.V1Node.from_dict(body), _preload_content=False))  # type: ignore[arg-type]
        self.names.append(name)
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", keys.GPU_RESOURCE: str(gpus)}
        self.core.patch_node_status(name, body={"status": {"capacity": capacity, "allocatable": capacity}})
        gpunode = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
                ],
            },
        }
        self.custom.create_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, gpunode
        )
        if report:
            self.report(name, gpunode_facts.agent_status(gpus=gpus))

    def report(self, name: str, status: Mapping[str, Any]) -> None:
        """Apply the agent's status fields under the agent's field manager."""
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {"name": name},
            "status": dict(status),
        }
        self.custom.patch_cluster_custom_object_status(
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            name,
            body,
            field_manager=resources.AGENT_FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def node(self, name: str) -> dict[str, Any]:
        return _json(self.core.read_node(name, _preload_content=False))

    def annotate_gpunode(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """What `kubectl annotate gpunode` does (None removes the annotation)."""
        self.custom.patch_cluster_custom_object(
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            name,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json",
        )

    def gpunode(self, name: str) -> dict[str, Any]:
        return _json(
            self.custom.get_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name, _preload_content=False
            )
        )

    def policy(self, name: str, spec: Mapping[str, Any]) -> None:
        """Create or update a policy; it selects only this fleet's nodes unless `spec` says otherwise.

        Its fleet circuit breaker never trips unless `spec` sets `breaker`: most tests fault many
        of a few nodes at once to test something else (tests/integration/test_operator_breaker.py
        tests the breaker).
        """
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.POLICY_KIND,
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"matchLabels": {self.LABEL_KEY: self.label}},
                "breaker": {"maxNewUnhealthy": "100%"},
                **spec,
            },
        }
        self.custom.patch_cluster_custom_object(
            resources.GROUP,
            resources.VERSION,
            resources.POLICY_PLURAL,
            name,
            body,
            field_manager="gpu-health-tests",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        if name not in self.policies:
            self.policies.append(name)

    def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        """Events about node `name` (optionally of one reason), as stored."""
        selector = f"involvedObject.name={name},involvedObject.kind=Node"
        if reason:
            selector += f",reason={reason}"
        response = self.core.list_event_for_all_namespaces(field_selector=selector, _preload_content=False)
        items: list[dict[str, Any]] = _json(response)["items"]
        return items

    def messages(self, name: str, reason: str) -> list[str]:
        """The messages of the Events of one reason about node `name`, as stored."""
        return [e["message"] for e in self.events(name, reason)]

    def said(self, name: str, reason: str, part: str = "", timeout_seconds: float = 30) -> list[str]:
        """Wait for an Event of `reason` about node `name` whose message contains `part`; its messages.

        An Event is posted after the action it reports, so it may land a moment after the state a test
        waited on: wait for it too rather than assert it at once.
        """
        return waiting.wait_until(
            lambda: [m for m in self.messages(name, reason) if part in m],
            timeout_seconds=timeout_seconds,
            message=f"a {reason} Event on {name}" + (f" saying {part!r}" if part else ""),
        )

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        for name in self.policies:
            with contextlib.suppress(client.ApiException):
                self.custom.delete_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name
                )
        for name in self.names:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(name)
        self.names.clear()
        self.policies.clear()


def _json(response: object) -> dict[str, Any]:
    """The body of a response read with `_preload_content=False`."""
    result: dict[str, Any] = json.loads(response.data)  # type: ignore[attr-defined]
    return result


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        body = client.V1Namespace.from_dict({"metadata": {"name": name}})
        assert body is not None
        client.CoreV1Api(api).create_namespace(body=body)
    except client.ApiException as error:
        if error.status != 409:
            raise


def _free_port() -> int:
    (port,) = ports.free_ports(1)
    return port


@dataclasses.dataclass
class OperatorProcess:
    """`python -m gpuhealth_operator` against a kubeconfig, with its log in a file."""

    kubeconfig: pathlib.Path
    log_path: pathlib.Path
    lease_namespace: str = "gpu-health"
    lease_name: str = "gpu-health-operator"
    identity: str = "operator"
    extra_args: Sequence[str] = ()
    metrics_port: int = dataclasses.field(default_factory=_free_port)
    health_port: int = dataclasses.field(default_factory=_free_port)
    process: processes.ManagedProcess | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gpuhealth_operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-port={self.metrics_port}",
            f"--health-port={self.health_port}",
            f"--lease-namespace={self.lease_namespace}",
            f"--lease-name={self.lease_name}",
            f"--identity={self.identity}",
            *self.extra_args,
        ]

    def start(self) -> OperatorProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = processes.ManagedProcess(self.identity, self.command(), self.log_path, env=env)
        self.process.start()
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def healthz(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=1
            ) as response:
                result: dict[str, Any] = json.loads(response.read())
                return result
        except OSError:
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
            text: str = response.read().decode()
            return text

    def is_leading(self) -> bool:
        health = self.healthz()
        return bool(health and health.get("leader"))

    def alive(self) -> bool:
        return self.process is not None and self.process.running()

    def stop(self, timeout_seconds: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after the timeout; the exit code."""
        if self.process is None:
            return None
        self.process.stop(grace_seconds=timeout_seconds)
        return self.process.returncode()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release (a crash)."""
        if self.process is not None:
            self.process.signal(signal.SIGKILL)
            self.process.wait_stopped(grace_seconds=15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


QUICK_TIMER: Final = ("--tick-seconds=0.5", "--lease-duration-seconds=5", "--lease-renew-seconds=1")
"""A timer pass every 0.5 s, a Lease another replica takes within 5 s: tests wait seconds, not minutes."""


@contextlib.contextmanager
def leading_operator(
    kubeconfig: str | pathlib.Path,
    api: client.ApiClient,
    log_path: pathlib.Path,
    name: str,
    extra_args: Sequence[str] = QUICK_TIMER,
) -> Iterator[OperatorProcess]:
    """One operator process, leading its own Lease `gpu-health-operator-<name>`, for the block;
    stopped at its end, and the tail of its log printed (pytest shows it for a failed test)."""
    ensure_namespace(api, "gpu-health")
    process = OperatorProcess(
        kubeconfig=pathlib.Path(kubeconfig),
        log_path=log_path,
        lease_name=f"gpu-health-operator-{name}",
        identity=f"{name}-operator",
        extra_args=list(extra_args),
    ).start()
    try:
        waiting.wait_until(process.is_leading, timeout_seconds=30, message="operator leads")
        yield process
    finally:
        process.stop()
        print(process.log()[-20000:])
