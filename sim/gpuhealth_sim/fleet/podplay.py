"""Playing a node's kubelet for gpu-health's Job pods: the part the repair and check executors share.

On the local control plane kwok starts the pods of gpu-health's repair and check Jobs (Running) and
leaves them; an executor ends each as the node's scenario says. What every executor needs is here:

- `Outcome`: how one pod ends (exit code, message: the termination message the operator reads);
- `terminal_status`: the pod status a kubelet writes when its (restartPolicy Never) containers exited;
- `Clock`: which pods have run their simulated time (first seen Running, each taken once);
- `Loop`: the polling thread (`start`/`stop`, a failed poll retried at the next);
- `end_pod`: the end written through the API server (pods/status, a JSON merge patch), so the Job
  controller sees it as from a kubelet, unless the pod went meanwhile (preempted, deleted): a pod being
  deleted is never ended, as a kubelet that is killing a container never reports it exited on its own.

`Outcome`, `terminal_status` and `Clock` are pure; `Loop` and `end_pod` do the I/O.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from gpuhealth_api import timestamps

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one pod ends, and (repairs) what it does to the node first."""

    succeeded: bool
    exit_code: int
    message: str
    reset: tuple[int, ...] = ()
    """GPUs (scenario indexes) to reset before the pod ends."""
    reboot: bool = False
    """Reboot the node before the pod ends (every GPU reset, a new bootId)."""

    @property
    def phase(self) -> str:
        return "Succeeded" if self.succeeded else "Failed"


def terminal_status(pod: Mapping[str, Any], outcome: Outcome, now: float) -> dict[str, Any]:
    """The pod's status as a kubelet writes it when its (restartPolicy Never) containers exited."""
    stamp = timestamps.rfc3339(now)
    status = pod.get("status") or {}
    started = {
        c.get("name"): ((c.get("state") or {}).get("running") or {}).get("startedAt")
        for c in status.get("containerStatuses") or []
    }
    reason = "Completed" if outcome.succeeded else "Error"
    containers = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": outcome.exit_code,
                    "reason": reason,
                    "message": outcome.message,
                    "startedAt": started.get(c["name"]) or status.get("startTime") or stamp,
                    "finishedAt": stamp,
                }
            },
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]
    ended = "PodCompleted" if outcome.succeeded else "PodFailed"
    conditions = [
        c for c in status.get("conditions") or [] if c.get("type") not in {"Ready", "ContainersReady"}
    ] + [
        {"type": kind, "status": "False", "reason": ended, "lastTransitionTime": stamp}
        for kind in ("Ready", "ContainersReady")
    ]
    return {"status": {"phase": outcome.phase, "conditions": conditions, "containerStatuses": containers}}


def playable(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is one a node would be running now: bound, Running, not being deleted."""
    meta = pod.get("metadata") or {}
    return (
        (pod.get("status") or {}).get("phase") == "Running"
        and bool((pod.get("spec") or {}).get("nodeName"))
        and not meta.get("deletionTimestamp")
    )


class Clock:
    """Which pods have run their simulated time: each pod (by UID) first seen Running at some time, taken
    once when its time is up. Not thread-safe on its own: the executor holds its lock around it."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._taken: set[str] = set()

    def due(self, uid: str, now: float, seconds: float) -> bool:
        """True once, the first time `seconds` have passed since the pod was first seen (this call or an
        earlier one); the caller then ends it."""
        if uid in self._taken:
            return False
        seen = self._seen.setdefault(uid, now)
        if now - seen < seconds:
            return False
        self._taken.add(uid)
        return True


class Loop:
    """A daemon thread that calls `poll` every `poll_seconds` until stopped; a poll that raises (the API
    server away a moment) is logged and the next one tries again."""

    def __init__(self, name: str, poll: Callable[[], object], poll_seconds: float) -> None:
        self.name = name
        self._poll = poll
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception as error:  # the API server may be down a moment; try again next poll
                log.warning("%s: a poll failed: %s", self.name, error)
            self._stop.wait(self._poll_seconds)


ATTEMPTS = 3
"""Writes tried before an executor gives up on a pod that keeps changing under it (an error, logged)."""


def _going(pod: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the pod is on its way out, or is another pod of the name: deleted, or marked for it (the
    scheduler sets condition DisruptionTarget on a pod it preempts before it deletes it)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or (uid and meta.get("uid") != uid):
        return True
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions)


def end_pod(core: client.CoreV1Api, pod: Mapping[str, Any], outcome: Outcome, now: float) -> bool:
    """Write the pod's end (`terminal_status`), as its kubelet would. False, and nothing written, where the
    pod is gone or going (preempted by the scheduler, evicted, its Job deleted) or is another pod of the
    name: that pod is left alone. Other API errors raise."""
    meta = pod["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid")
    for _ in range(ATTEMPTS):
        try:
            fresh = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        if _going(fresh, uid):
            return False
        # The resourceVersion read makes the write conditional: a preemption between the read and the
        # write answers 409 (read again, and leave it) instead of being overwritten by our end.
        body = {
            "metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]},
            **terminal_status(pod, outcome, now),
        }
        try:
            core.patch_namespaced_pod_status(
                name, namespace, body, _content_type="application/merge-patch+json"
            )
        except client.ApiException as error:
            if error.status == 404:
                return False
            if error.status != 409:
                raise
            continue
        return True
    raise RuntimeError(f"pod {namespace}/{name} kept changing: not ended after {ATTEMPTS} tries")
