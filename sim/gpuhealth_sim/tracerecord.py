"""`gpu-health-sim record`: follow a live cluster's Nodes and GPUNodes into a trace (format v1).

Two parts, kept apart. `Compactor` is pure: given each version of a Node or
GPUNode as it arrives, it returns the trace record to append, or None when
nothing the operator reads changed. A Node keeps only what the operator reads
(labels, annotations, taints, unschedulable, GPU capacity); a GPUNode keeps
only the agent's part of its status (`agent`, `summary`, `gpus`, not the
operator's verdicts), in full the first time and as a compact `patch`
(traces.status_patch) after that. `Recorder` is the I/O: two
`watches.Follower`s (list, then watch; resume from the last resourceVersion
on a cut stream; list again on 410 Gone) feed the compactor under a lock,
and every record is written and flushed at once, with the time it arrived,
until `stop()` or a bound (seconds, bytes of file) is reached. Closing the
writer ends a gzip stream properly, so an interrupted recording is a valid
trace. Deleted objects are not recorded (format v1 has no deletion).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from kubernetes import client

from gpuhealth_api import keys, resources
from gpuhealth_sim import traces, watches

AGENT_STATUS_FIELDS: Final = ("agent", "summary", "gpus")
"""The agent's part of a GPUNode status; the rest (health, issues, conditions...) is the operator's."""


def node_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Node the operator reads, in the trace's `node` record shape."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    capacity = (obj.get("status") or {}).get("capacity") or {}
    view: dict[str, Any] = {
        "metadata": {
            "name": metadata.get("name"),
            "labels": dict(metadata.get("labels") or {}),
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": list(spec.get("taints") or [])},
        "status": {"capacity": {keys.GPU_RESOURCE: capacity[keys.GPU_RESOURCE]}}
        if keys.GPU_RESOURCE in capacity
        else {"capacity": {}},
    }
    return view


def agent_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's part of a GPUNode's status (empty before the agent's first report)."""
    status = obj.get("status") or {}
    return {key: status[key] for key in AGENT_STATUS_FIELDS if key in status}


class Compactor:
    """Turns object versions into trace records; None for a version that changed nothing recorded."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._nodes: dict[str, dict[str, Any]] = {}
        self._gpunodes: dict[str, dict[str, Any]] = {}
        self._last_t = 0.0

    def _t(self, at: float) -> float:
        # Two followers hand over concurrently: keep the records in time order.
        self._last_t = max(self._last_t, round(at - self.start, 3))
        return self._last_t

    def node(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        view = node_view(obj)
        name = view["metadata"]["name"]
        if not name or self._nodes.get(name) == view:
            return None
        self._nodes[name] = view
        return {"kind": "node", "t": self._t(at), "object": view}

    def gpunode(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return None
        status = agent_status(obj)
        before = self._gpunodes.get(name)
        if before == status:
            return None
        self._gpunodes[name] = status
        if before is not None:
            patch = traces.status_patch(before, status)
            # A merge patch cannot set a value to null (null removes): then the whole status.
            if traces.apply_status_patch(before, patch) == status:
                return {"kind": "gpunode", "t": self._t(at), "name": name, "patch": patch}
        return {"kind": "gpunode", "t": self._t(at), "name": name, "status": status}


class Recorder:
    """Follows a cluster's Nodes and GPUNodes into a trace file until stopped or a bound is reached."""

    def __init__(
        self,
        api: client.ApiClient,
        out: Path,
        *,
        max_seconds: float | None = None,
        max_bytes: int | None = None,
        generator: Mapping[str, Any] | None = None,
    ) -> None:
        self.out = out
        self.started_at = time.time()
        self.max_seconds = max_seconds
        self.max_bytes = max_bytes
        self.records = 0
        self.reason = ""
        """Why the recording ended: stopped, max-seconds or max-bytes."""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._compactor = Compactor(self.started_at)
        tool = {"tool": "gpu-health-sim record", **(generator or {})}
        header = {"start": self.started_at, "generator": tool}
        self._writer: traces.Writer | None = traces.Writer(out, header)
        self._writer.flush()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)

        def gpunodes(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, **kwargs
            )

        self._followers = [
            watches.Follower("record-nodes", core.list_node, self._on_node),
            watches.Follower("record-gpunodes", gpunodes, self._on_gpunode),
        ]

    def start(self, sync_timeout_seconds: float = 30) -> Recorder:
        """Start following; returns once both first lists are written (or the timeout passed)."""
        for follower in self._followers:
            follower.start()
        for follower in self._followers:
            follower.wait_synced(sync_timeout_seconds)
        return self

    def _on_node(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind != "DELETED":
            self._append(lambda: self._compactor.node(obj, at))

    def _on_gpunode(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind != "DELETED":
            self._append(lambda: self._compactor.gpunode(obj, at))

    def write(self, record: dict[str, Any]) -> None:
        """Append a record of the caller's (the demo's `truth`), in turn with the recorded ones."""
        self._append(lambda: record)

    def _append(self, make: Callable[[], dict[str, Any] | None]) -> None:
        with self._lock:
            if self._writer is None:
                return
            record = make()
            if record is None:
                return
            self._writer.write(record)
            self._writer.flush()
            self.records += 1
            if self.max_bytes is not None and self.out.stat().st_size >= self.max_bytes:
                self._end("max-bytes")

    def _end(self, reason: str) -> None:
        """Close the file (under the lock): later versions are dropped."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self.reason = reason
            self.done.set()

    def wait(self, stop: threading.Event) -> None:
        """Block until `stop` is set or a bound is reached, then stop."""
        while not self.done.is_set() and not stop.is_set():
            if self.max_seconds is not None and time.time() - self.started_at >= self.max_seconds:
                with self._lock:
                    self._end("max-seconds")
                break
            stop.wait(0.2)
        self.stop()

    def stop(self) -> None:
        """Stop following and close the trace (a complete file, gzip stream ended)."""
        for follower in self._followers:
            follower.request_stop()
        for follower in self._followers:
            follower.stop()
        with self._lock:
            self._end(self.reason or "stopped")
