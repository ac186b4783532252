"""Writes the node's GPU facts to its GPUNode: on change at once, otherwise on the heartbeat.

`GPUNodeClient` is the only Kubernetes I/O: read the Node (uid, physical
GPU count), create the GPUNode owned by it, and server-side apply the
agent's status fields (field manager `gpu-health-agent`, forced, status
subresource). `Reporter` decides when to write (`changes.write_reason`) and
survives API outages: a failed write is retried with capped, jittered
exponential backoff while collection goes on, and the retry always sends
the latest state, never a queue of stale ones. Nothing here ever raises to
the loop: an API server that is down is a normal day.

Each quiet period before a heartbeat write is drawn anew, up to HEARTBEAT_JITTER
shorter than the heartbeat: agents a rollout or an outage started together
drift apart instead of writing together every heartbeat for good, and none is
ever later than the heartbeat the operator times staleness by.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any, Final, Protocol

from kubernetes import client as k8s
from kubernetes.client import exceptions as k8s_exceptions

from gpuhealth_agent import backoff, changes
from gpuhealth_api import faults, keys, resources, status, timestamps

log = logging.getLogger(__name__)

APPLY_PATCH: Final = "application/apply-patch+yaml"
NOT_FOUND: Final = 404
CONFLICT: Final = 409
HEARTBEAT_JITTER: Final = 0.1
"""The most a quiet period before a heartbeat write is shortened by, as a fraction of the heartbeat."""


def physical_gpus(node: dict[str, Any]) -> int | None:
    """The GPUs a Node (as JSON) physically has, as far as its GFD labels and capacity tell.

    Not the `nvidia.com/gpu` capacity: time-slicing, MPS and MIG multiply it
    (a time-sliced node advertises 32 for 8 GPUs), and padding the status with
    "lost" GPUs up to it turned shared nodes GPULost, beyond 64 even past the
    CRD's limit. None when the labels cannot tell: then the GPUs the agent sees.
    """
    labels = node.get("metadata", {}).get("labels") or {}
    advertised = node.get("status", {}).get("capacity", {}).get(keys.GPU_RESOURCE)
    capacity = int(str(advertised)) if advertised is not None and str(advertised).isdigit() else None
    return faults.expected_gpu_count(labels, capacity, None)


class NodeMissingError(RuntimeError):
    """The Node this agent reports for does not exist (yet): nothing can own the GPUNode."""


class Client(Protocol):
    """What the Reporter needs from the cluster (GPUNodeClient, or a fake in unit tests)."""

    def read_node(self) -> tuple[str, int | None]: ...
    def read_status(self) -> status.GPUNodeStatus | None: ...
    def ensure_gpunode(self, node_uid: str) -> None: ...
    def apply_status(self, node_status: status.GPUNodeStatus) -> None: ...


class GPUNodeClient:
    """Kubernetes calls for one node's GPUNode, over a (possibly shared) ApiClient."""

    def __init__(
        self, api_client: k8s.ApiClient, node_name: str, request_timeout_seconds: float = 10.0
    ) -> None:
        self.node_name = node_name
        self.timeout = request_timeout_seconds
        self.api_client = api_client
        self.custom = k8s.CustomObjectsApi(api_client)

    def read_node(self) -> tuple[str, int | None]:
        """The Node's uid and the GPUs it physically has as far as its labels tell (`physical_gpus`)."""
        try:
            node = self._get_json("/api/v1/nodes/{name}", {"name": self.node_name})
        except k8s_exceptions.ApiException as exc:
            if exc.status == NOT_FOUND:
                raise NodeMissingError(f"Node {self.node_name} not found") from exc
            raise
        uid = node.get("metadata", {}).get("uid")
        if not uid:
            raise NodeMissingError(f"Node {self.node_name} has no uid")
        return str(uid), physical_gpus(node)

    def _get_json(self, path: str, path_params: dict[str, str]) -> dict[str, Any]:
        """GET a core API object as plain JSON.

        Why not CoreV1Api: importing it loads ~250 generated model modules
        (+20 MiB RSS) for one call; the agent's budget is 64 MiB.
        """
        request = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            path_params=path_params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=self.timeout)
        response.read()  # type: ignore[no-untyped-call]
        data: Any = self.api_client.response_deserialize(response, {"200": "object"}).data
        if not isinstance(data, dict):
            raise k8s_exceptions.ApiException(status=0, reason=f"unexpected response for {path}")
        return data

    def read_status(self) -> status.GPUNodeStatus | None:
        """The GPUNode's current status ({} if it has none), or None when there is no GPUNode."""
        try:
            found: Any = self.custom.get_cluster_custom_object(
                resources.GROUP,
                resources.VERSION,
                resources.GPUNODE_PLURAL,
                self.node_name,
                _request_timeout=self.timeout,
            )
        except k8s_exceptions.ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise
        previous: status.GPUNodeStatus = (found.get("status") if isinstance(found, dict) else None) or {}
        return previous

    def ensure_gpunode(self, node_uid: str) -> None:
        body: dict[str, Any] = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {
                "name": self.node_name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node_uid}
                ],
            },
        }
        try:
            self.custom.create_cluster_custom_object(
                resources.GROUP,
                resources.VERSION,
                resources.GPUNODE_PLURAL,
                body,
                field_manager=resources.AGENT_FIELD_MANAGER,
                _request_timeout=self.timeout,
            )
            log.info("created GPUNode %s owned by Node uid %s", self.node_name, node_uid)
        except k8s_exceptions.ApiException as exc:
            if exc.status != CONFLICT:  # already there: fine
                raise

    def apply_status(self, node_status: status.GPUNodeStatus) -> None:
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {"name": self.node_name},
            "status": node_status,
        }
        self.custom.patch_cluster_custom_object_status(
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            self.node_name,
            body,
            field_manager=resources.AGENT_FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
            _request_timeout=self.timeout,
        )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one `Reporter.report` call did."""

    reason: changes.WriteReason | None
    """Why a write was wanted (None: nothing to write)."""
    written: bool = False
    error: str | None = None
    retry_in_seconds: float | None = None


class Reporter:
    """Decides when to write and keeps writing through API outages (see module docstring)."""

    def __init__(
        self,
        cluster: Client,
        *,
        heartbeat_seconds: float,
        retry: backoff.Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.cluster = cluster
        self.heartbeat_seconds = heartbeat_seconds
        self.retry = retry or backoff.Backoff()
        self._rng = rng or random.Random()
        self._quiet_seconds = self._draw_quiet_period()
        self.state = changes.WriteState()
        self.ensured = False
        self.expected_gpus: int | None = None
        """GPUs the Node physically has as its labels tell (`physical_gpus`), once the Node was read."""
        self._previous: status.GPUNodeStatus | None = None

    def prepare(self) -> None:
        """Read the Node, and the GPUNode's earlier status, or create the GPUNode (raises on failure)."""
        uid, self.expected_gpus = self.cluster.read_node()
        existing = self.cluster.read_status()
        if existing is None:
            self.cluster.ensure_gpunode(uid)
        else:
            self._previous = existing
        self.ensured = True

    def try_prepare(self, now: float) -> bool:
        """prepare(), unless backing off; a failure is logged and backs off like a failed write."""
        if self.ensured:
            return True
        if not self.retry.ready(now):
            return False
        try:
            self.prepare()
        except Exception as exc:  # the API may be down at start: the first report retries
            delay = self.retry.failed(now)
            log.warning("reading Node/GPUNode failed (%s); retrying in %.1fs", _describe(exc), delay)
            return False
        return True

    def take_previous(self) -> status.GPUNodeStatus | None:
        """The status an earlier agent left on the GPUNode, once (None if none or already taken)."""
        previous, self._previous = self._previous, None
        return previous

    def report(self, now: float, node_status: status.GPUNodeStatus) -> Outcome:
        current = changes.fingerprint(node_status)
        reason = changes.write_reason(self.state, current, now, self._quiet_seconds)
        if reason is None:
            return Outcome(None)
        if not self.retry.ready(now):
            self.state = dataclasses.replace(self.state, pending=True)
            return Outcome(reason, retry_in_seconds=self.retry.next_attempt_at - now)
        node_status.setdefault("agent", {})["lastHeartbeatTime"] = timestamps.rfc3339(now)
        try:
            if not self.ensured:
                self.prepare()
            self.cluster.apply_status(node_status)
        except Exception as exc:  # any failure is retried with backoff: the agent must not die of it
            if isinstance(exc, k8s_exceptions.ApiException) and exc.status == NOT_FOUND:
                self.ensured = False  # someone deleted the GPUNode: recreate it on the next attempt
            delay = self.retry.failed(now)
            self.state = dataclasses.replace(self.state, pending=True)
            summary = _describe(exc)
            log.warning(
                "writing GPUNode status failed (%s); retrying in %.1fs with the latest state", summary, delay
            )
            return Outcome(reason, error=summary, retry_in_seconds=delay)
        if self.retry.failures:
            log.info("GPUNode status written again after %d failed attempts", self.retry.failures)
        self.retry.succeeded()
        self.state = changes.WriteState(fingerprint=current, written_at=now, pending=False)
        self._quiet_seconds = self._draw_quiet_period()
        return Outcome(reason, written=True)

    def _draw_quiet_period(self) -> float:
        return self.heartbeat_seconds * (1 - HEARTBEAT_JITTER * self._rng.random())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, k8s_exceptions.ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:300]
