"""Test and bench support: simulated GPU Nodes with GPUNode facts, and the operator as a subprocess.

Integration tests and `bench/operator_latency.py` drive a real API server the
way production does: kwok-managed Nodes, GPUNode status written by server-side
apply under the agent's field manager (exactly the fields the agent owns), and
the operator running as its own process. This module imports the synchronous
Kubernetes client only; the operator proper never imports it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import IO, Any

from kubernetes import client

from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_operator.decisions.model import NodeVerdict

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "570.124.06"


def rfc3339(moment: datetime.datetime | None = None) -> str:
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def healthy_gpu(index: int, *, model: str = MODEL, observed: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "model": model,
        "pciBusId": f"00000000:{index + 0x10:02X}:00.0",
        "temperatureCelsius": 42,
        "slowdownTemperatureCelsius": 90,
        "powerWatts": 300.0,
        "smClockMHz": 1980,
        "maxSmClockMHz": 1980,
        "utilizationPercent": 95,
        "ecc": {
            "correctedVolatile": 0,
            "uncorrectedVolatile": 0,
            "correctedAggregate": 0,
            "uncorrectedAggregate": 0,
        },
        "retiredPages": {"doubleBit": 0, "pending": False},
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "xids": [],
        "clockEventReasons": [],
        "recoveryAction": "None",
        "pcie": {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16, "replayCounter": 0},
        "lost": False,
        "observedTime": observed or rfc3339(),
    }


def verdict(
    labels: Mapping[str, str | None] | None = None, taint: str | None = None, *, node: str = "n"
) -> NodeVerdict:
    """A verdict on which no rule fired: healthy, wanting only the given labels and taint."""
    return NodeVerdict(
        node=node,
        conditions={},
        health=vocabulary.Health.HEALTHY,
        issues=(),
        fired_rules=(),
        wanted_action=None,
        wanted_labels=dict(labels or {}),
        wanted_taint=taint,
        recovered=False,
        detected_at=None,
    )


def merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `overrides` into a copy of `base` (nested dicts merge, anything else replaces)."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def agent_status(
    *,
    gpus: int = 8,
    model: str = MODEL,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
    heartbeat: str | None = None,
    heartbeat_seconds: int = 60,
    observed: str | None = None,
) -> dict[str, Any]:
    """The agent's part of a GPUNode status: healthy GPUs, with per-GPU `overrides` merged in."""
    now = rfc3339()
    items = [
        merge(healthy_gpu(i, model=model, observed=observed or now), (overrides or {}).get(i, {}))
        for i in range(gpus)
    ]
    return {
        "agent": {
            "version": "test",
            "backend": "sim",
            "driverVersion": DRIVER,
            "lastHeartbeatTime": heartbeat or now,
            "heartbeatSeconds": heartbeat_seconds,
            "expectedGpuCount": gpus,
        },
        "summary": {
            "gpuCount": gpus,
            "model": model,
            "maxTemperatureCelsius": max((g.get("temperatureCelsius", 0) for g in items), default=0),
        },
        "gpus": items,
    }


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
                "annotations": {KWOK_ANNOTATION: "fake"},
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
            self.report(name, agent_status(gpus=gpus))

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

    def gpunode(self, name: str) -> dict[str, Any]:
        return _json(
            self.custom.get_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name, _preload_content=False
            )
        )

    def policy(self, name: str, spec: Mapping[str, Any]) -> None:
        """Create or update a policy; it selects only this fleet's nodes unless `spec` says otherwise."""
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.POLICY_KIND,
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {self.LABEL_KEY: self.label}}, **spec},
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        body = client.V1Namespace.from_dict({"metadata": {"name": name}})
        assert body is not None
        client.CoreV1Api(api).create_namespace(body=body)
    except client.ApiException as error:
        if error.status != 409:
            raise


@dataclasses.dataclass
class OperatorProcess:
    """`python -m gpuhealth_operator` against a kubeconfig, with its log in a file."""

    kubeconfig: pathlib.Path
    log_path: pathlib.Path
    lease_namespace: str = "gpu-health"
    lease_name: str = "gpu-health-operator"
    identity: str = "operator"
    extra_args: Sequence[str] = ()
    metrics_port: int = dataclasses.field(default_factory=free_port)
    health_port: int = dataclasses.field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

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
        self._log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env)
        return self

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
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_seconds: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after the timeout; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release (a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._log is not None:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_for(predicate: Any, timeout_seconds: float, message: str, interval_seconds: float = 0.05) -> Any:
    """Poll until `predicate()` is truthy; TimeoutError with the message and last value otherwise."""
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{message} (last: {last!r})")
        time.sleep(interval_seconds)
