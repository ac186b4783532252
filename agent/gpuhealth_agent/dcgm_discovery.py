"""Finds the dcgm-exporter pod on this agent's node through the API (`--dcgm-exporter auto`).

The GPU Operator's exporter has no hostPort and only a ClusterIP Service, so
`http://$(HOST_IP):9400` does not reach it, and the Service would answer from
any node's exporter. The agent lists the pods with the exporter's labels
bound to its own node (fieldSelector spec.nodeName) and scrapes the Running,
Ready one at its pod IP. The answer is kept until a scrape fails (the pod was
rolled: new pod, new IP) or REDISCOVER_SECONDS pass, so a fleet of agents
adds one small LIST per node every few minutes, not one per collection.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

DEFAULT_SELECTOR: Final = "app=nvidia-dcgm-exporter"
"""The GPU Operator's exporter pods (assets/state-dcgm-exporter/0800_daemonset.yaml)."""
DEFAULT_NAMESPACE: Final = "gpu-operator"
"""The GPU Operator's namespace in NVIDIA's install docs. Labels are anyone's to copy: in any namespace, a
tenant's pod on the node labelled as the exporter would be scraped, and its counters could cordon the node
or hide a fault. Creating pods in the GPU Operator's namespace takes rights a tenant does not have."""
DEFAULT_PORT: Final = 9400
REDISCOVER_SECONDS: Final = 300.0


class NotFoundError(LookupError):
    """No exporter pod to scrape on this node (or the API would not say): the message says which."""


class PodLister(Protocol):
    def list_pods(
        self, namespace: str | None, label_selector: str, field_selector: str
    ) -> list[dict[str, Any]]: ...


def usable(pod: dict[str, Any]) -> bool:
    """Running, Ready, with an IP, and not on its way out."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return (
        st.get("phase") == "Running" and ready and bool(st.get("podIP")) and not meta.get("deletionTimestamp")
    )


def pick(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The exporter pod to scrape: a usable one, the same one each time (by name) when there are several."""
    candidates = sorted((p for p in pods if usable(p)), key=lambda p: str(p["metadata"].get("name", "")))
    return candidates[0] if candidates else None


def metrics_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"


class Locator:
    """The URL of this node's exporter, looked up through the API and kept until forgotten or old."""

    def __init__(
        self,
        pods: PodLister,
        node_name: str,
        *,
        selector: str = DEFAULT_SELECTOR,
        namespace: str | None = None,
        port: int = DEFAULT_PORT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pods = pods
        self.node_name = node_name
        self.selector = selector
        self.namespace = namespace
        self.port = port
        self.clock = clock
        self._ip: str | None = None
        self._found_at = 0.0

    def url(self) -> str:
        """Raises NotFoundError when no exporter pod can be scraped (said with selector, namespace, node)."""
        now = self.clock()
        if self._ip is None or now - self._found_at > REDISCOVER_SECONDS:
            self._ip = self._lookup()
            self._found_at = now
        return metrics_url(self._ip, self.port)

    def forget(self) -> None:
        """The last scrape failed: look again next time (the pod may have been replaced)."""
        self._ip = None

    def describe(self) -> str:
        where = f"namespace {self.namespace}" if self.namespace else "any namespace"
        return f"pods {self.selector} in {where} on node {self.node_name}"

    def _lookup(self) -> str:
        try:
            pods = self.pods.list_pods(self.namespace, self.selector, f"spec.nodeName={self.node_name}")
        except Exception as exc:  # an API error of any kind: said, retried at the next scrape
            raise NotFoundError(f"cannot list {self.describe()}: {_describe(exc)}") from exc
        chosen = pick(pods)
        if chosen is None:
            raise NotFoundError(
                f"no Running, Ready pod among {len(pods)} {self.describe()} "
                "(is the GPU Operator's dcgm-exporter enabled? see --dcgm-exporter-selector)"
            )
        return str(chosen["status"]["podIP"])


def _describe(exc: Exception) -> str:
    """One line: an API refusal as its HTTP status and the server's message (RBAC says what is missing)."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is None:
        return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    message = ""
    with contextlib.suppress(ValueError, TypeError):
        message = str(json.loads(getattr(exc, "body", None) or "{}").get("message", ""))
    return f"HTTP {status} {reason}" + (f": {message}" if message else "")


class ApiPodLister:
    """Lists pods over the agent's ApiClient as plain JSON (no CoreV1Api: see reporter._get_json)."""

    def __init__(self, api_client: Any, request_timeout_seconds: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = request_timeout_seconds

    def list_pods(
        self, namespace: str | None, label_selector: str, field_selector: str
    ) -> list[dict[str, Any]]:
        path = "/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        request = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            path_params={"namespace": namespace} if namespace else {},
            query_params=[("labelSelector", label_selector), ("fieldSelector", field_selector)],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=self.timeout)
        response.read()
        data = self.api_client.response_deserialize(response, {"200": "object"}).data
        if not isinstance(data, dict):
            raise TypeError(f"unexpected response listing pods: {type(data).__name__}")
        return list(data.get("items") or [])
