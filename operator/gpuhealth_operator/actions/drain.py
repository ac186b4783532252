"""Draining a cordoned Node: evict its pods through the Eviction API until none is left.

What is evicted: every pod bound to the node except DaemonSet-owned pods
(their controller would put them straight back and they tolerate the
cordon), mirror pods (the kubelet owns them) and pods already terminating
(they are waited for, not evicted again). Pods with emptyDir volumes are left
in place unless the policy allows deleting their data.

Evictions go out concurrently, bounded by a semaphore shared by all drains. A
429 means a PodDisruptionBudget refuses the eviction for now: it is retried
with capped exponential backoff until the deadline. The deadline is computed
by the caller from the drain's start time, which lives on the Node
(annotation), so a restarted operator resumes the same drain with the same
deadline. Evicted pods are then waited for until they are gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any

from gpuhealth_operator import kube

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
POLL_SECONDS = 0.5
"""How often to look again while evicted pods are terminating."""
STOPPED = "stopped"
"""An eviction not sent because the drain was told to stop (no request went out)."""

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    grace_period_seconds: int | None
    delete_empty_dir_data: bool
    backoff_initial_seconds: float
    backoff_max_seconds: float


@dataclasses.dataclass(frozen=True)
class Result:
    completed: bool
    """No evictable pod is left on the node."""
    blocking: tuple[str, ...]
    """namespace/name of the pods still on the node when the deadline passed."""
    evicted: int
    skipped: tuple[str, ...]
    """Pods left in place on purpose (emptyDir data without deleteEmptyDirData)."""
    stopped: bool = False
    """The caller's `should_stop` ended the drain (exclude label, dry run, policy deleted)."""


def is_daemonset_pod(pod: kube.JsonObject) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners)


def is_mirror_pod(pod: kube.JsonObject) -> bool:
    return MIRROR_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {})


def has_empty_dir(pod: kube.JsonObject) -> bool:
    volumes = pod.get("spec", {}).get("volumes") or []
    return any("emptyDir" in v for v in volumes)


def is_terminating(pod: kube.JsonObject) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def is_finished(pod: kube.JsonObject) -> bool:
    return pod.get("status", {}).get("phase") in {"Succeeded", "Failed"}


def pod_key(pod: kube.JsonObject) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"


def classify(pods: list[kube.JsonObject], options: Options) -> tuple[list[kube.JsonObject], list[str]]:
    """Pods the drain must see gone, and pods it leaves in place on purpose."""
    wanted: list[kube.JsonObject] = []
    skipped: list[str] = []
    for pod in pods:
        if is_daemonset_pod(pod) or is_mirror_pod(pod):
            continue
        if has_empty_dir(pod) and not options.delete_empty_dir_data and not is_terminating(pod):
            skipped.append(pod_key(pod))
            continue
        wanted.append(pod)
    return wanted, skipped


async def list_pods(client: kube.Kube, node: str) -> list[kube.JsonObject]:
    return await client.list_all("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})


async def evict(client: kube.Kube, pod: kube.JsonObject, options: Options) -> str:
    """One eviction attempt: 'evicted', 'blocked' (429: a PDB says not now), 'gone' or 'error'."""
    meta = pod["metadata"]
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    if options.grace_period_seconds is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": options.grace_period_seconds}
    try:
        await client.create(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", body)
    except kube.ApiError as error:
        if error.status == 429:
            return "blocked"
        if error.not_found:
            return "gone"
        logger.warning("eviction of %s failed: %s", pod_key(pod), error)
        return "error"
    return "evicted"


async def drain(
    client: kube.Kube,
    node: str,
    *,
    options: Options,
    deadline: datetime.datetime,
    semaphore: asyncio.Semaphore,
    on_eviction: Callable[[str], None] = lambda result: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Result:
    """Evict until no evictable pod is left on `node`, or `deadline` (aware UTC) passes.

    `should_stop` is asked right before every eviction request: once it says True no
    request goes out any more (an emergency stop), and the drain returns `stopped`.
    """
    backoff = options.backoff_initial_seconds
    evicted = 0
    while True:
        if should_stop():
            return Result(completed=False, blocking=(), evicted=evicted, skipped=(), stopped=True)
        wanted, skipped = classify(await list_pods(client, node), options)
        if not wanted:
            return Result(completed=True, blocking=(), evicted=evicted, skipped=tuple(skipped))
        now = datetime.datetime.now(datetime.UTC)
        if now >= deadline:
            return Result(
                completed=False,
                blocking=tuple(sorted(pod_key(p) for p in wanted)),
                evicted=evicted,
                skipped=tuple(skipped),
            )

        async def bounded(pod: kube.JsonObject) -> str:
            async with semaphore:
                if should_stop():
                    return STOPPED
                return await evict(client, pod, options)

        results = await asyncio.gather(*(bounded(p) for p in wanted if not is_terminating(p)))
        for result in results:
            if result != STOPPED:
                on_eviction(result)
        evicted += results.count("evicted")
        if STOPPED in results:
            return Result(completed=False, blocking=(), evicted=evicted, skipped=(), stopped=True)
        refused = "blocked" in results or "error" in results
        if refused:
            wait = backoff
            backoff = min(backoff * 2, options.backoff_max_seconds)
        else:
            wait = POLL_SECONDS
            backoff = options.backoff_initial_seconds
        remaining = (deadline - datetime.datetime.now(datetime.UTC)).total_seconds()
        await asyncio.sleep(max(0.0, min(wait, remaining)))
