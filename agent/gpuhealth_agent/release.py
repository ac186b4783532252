"""The operator's ask to let go of the GPUs for a reset (issue 48, Deliver 1).

`nvidia-smi --gpu-reset` refuses while any process has the device open, and the agent holds NVML open
for as long as it runs. Before a ResetGPU repair step the operator sets the GPUNode annotation
`gpuhealth.io/release-gpus` (the repair cycle's start stamp); the agent shuts NVML down, answers with
`status.agent.released` (the same value), keeps heartbeating with the facts it had, and initialises NVML
again and reports at once when the annotation goes (`runner.Agent`).

`Source` says what is asked; `GPUNodeWatch` is the production one: a watch of the agent's own GPUNode
(`fieldSelector=metadata.name=<node>`, verbs list/watch on gpunodes), one long-lived request per node as
the kubelet keeps for its Node, re-established after `timeoutSeconds` or an error. It wakes the agent's
loop on a change, so the answer takes one turn, not an interval.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes import client as k8s

from gpuhealth_api import keys, resources

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
"""How long one watch request lasts before it is made again (the API server's own limit is longer)."""
RETRY_SECONDS = 5.0


class Source(Protocol):
    def wanted(self) -> str | None:
        """The value of the release annotation on the agent's GPUNode now (None: none)."""
        ...


class Fixed:
    """A source a test (or the simulated fleet) sets by hand."""

    def __init__(self, value: str | None = None) -> None:
        self.value = value

    def wanted(self) -> str | None:
        return self.value


def annotation(body: Any) -> str | None:
    """The release annotation of a GPUNode body (None: none, or not a GPUNode)."""
    if not isinstance(body, dict):
        return None
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(keys.RELEASE_GPUS_ANNOTATION)
    return value if isinstance(value, str) and value else None


class GPUNodeWatch:
    """The release annotation of the agent's own GPUNode, kept current by a watch thread."""

    def __init__(
        self, api_client: k8s.ApiClient, node_name: str, wake: Callable[[], None], stop: threading.Event
    ) -> None:
        self.api_client = api_client
        self.node_name = node_name
        self.wake = wake
        self.stop = stop
        self._value: str | None = None
        self._lock = threading.Lock()

    def wanted(self) -> str | None:
        with self._lock:
            return self._value

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="release-watch", daemon=True)
        thread.start()
        return thread

    def _set(self, value: str | None) -> None:
        with self._lock:
            changed, self._value = value != self._value, value
        if changed:
            log.info("GPU release %s", f"asked ({value})" if value else "no longer asked")
            self.wake()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch_once()
            except Exception as exc:  # the API server restarted, a timeout, RBAC: try again shortly
                log.warning("watching GPUNode %s for a release failed: %s", self.node_name, exc)
                self.stop.wait(RETRY_SECONDS)

    def _watch_once(self) -> None:
        """One list (the current value) then one watch from its resourceVersion, until it ends."""
        path = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}"
        selector = f"metadata.name={self.node_name}"
        listed = self._request(path, {"fieldSelector": selector}, stream=False)
        if listed.status != 200:
            raise RuntimeError(
                f"listing GPUNode {self.node_name}: HTTP {listed.status} {listed.data[:200]!r}"
            )
        body = json.loads(listed.data or b"{}")
        items = body.get("items") or []
        self._set(annotation(items[0]) if items else None)
        version = (body.get("metadata") or {}).get("resourceVersion") or ""
        response = self._request(
            path,
            {
                "fieldSelector": selector,
                "watch": "true",
                "resourceVersion": version,
                "timeoutSeconds": str(WATCH_SECONDS),
                "allowWatchBookmarks": "false",
            },
            stream=True,
        )
        if response.status != 200:
            response.release_conn()
            raise RuntimeError(f"watching GPUNode {self.node_name}: HTTP {response.status}")
        pending = b""
        try:
            for chunk in response.stream(amt=None, decode_content=True):
                if self.stop.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")  # one JSON event a line
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = event.get("type")
                    if kind == "ERROR":
                        return  # too old a version: list again
                    self._set(None if kind == "DELETED" else annotation(event.get("object")))
        finally:
            response.release_conn()

    def _request(self, path: str, query: dict[str, str], *, stream: bool) -> Any:
        request = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        timeout = WATCH_SECONDS + 30 if stream else 10.0
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not stream:
            response.read()  # type: ignore[no-untyped-call]
        return response.response if stream else response
