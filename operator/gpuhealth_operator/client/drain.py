"""Draining a cordoned Node: evict its pods through the Eviction API until none is left.

What is evicted follows `kubectl drain --ignore-daemonsets`: every pod bound
to the node except finished pods (Succeeded/Failed: they hold nothing),
DaemonSet-owned pods (their controller would put them straight back and they
tolerate the cordon), mirror pods (the kubelet owns them), pods in the
policy's excluded namespaces, and pods already terminating (they are waited
for, not evicted again). Pods with emptyDir volumes are evicted unless the
policy keeps their data (`--delete-emptydir-data` is the default). Pods with
no controller are evicted only with the policy's `force` (`--force`);
otherwise they stay and the drain ends failed, naming them.

Evictions go out concurrently, bounded by a semaphore shared by all drains. A
429 means a PodDisruptionBudget refuses the eviction for now, a 500 that more
than one budget covers the pod: both are retried with capped exponential
backoff until the deadline and named, with the API server's words, when it
passes. The deadline is computed by the caller from the drain's start time,
which lives on the Node (annotation), so a restarted operator resumes the
same drain with the same deadline. Evicted pods are then waited for until
they are gone, looking again after 0.5 s, then less and less often (at most
every POLL_MAX_SECONDS): a pod's grace period may be long, the deadline
still ends the wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable
from typing import Any

from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import text

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
POLL_SECONDS = 0.5
"""How soon to look again after evicting pods."""
POLL_MAX_SECONDS = 5.0
"""The longest wait between looks while evicted pods terminate (the wait doubles up to it)."""
EMPTY_DIR_DATA = "emptyDir data"
EXCLUDED_NAMESPACE = "excluded namespace"
STOPPED = "stopped"
"""An eviction not sent because the drain was told to stop (no request went out)."""

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    grace_period_seconds: int | None
    delete_empty_dir_data: bool
    backoff_initial_seconds: float
    backoff_max_seconds: float
    force: bool = False
    """Evict pods without a controller too (`kubectl drain --force`)."""
    exclude_namespaces: frozenset[str] = frozenset()
    """Namespaces whose pods are never evicted."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a drain does with the pods bound to its node (finished, DaemonSet and mirror pods: nothing)."""

    wanted: list[kube.JsonObject]
    """Pods the drain must see gone: evicted, or already terminating and waited for."""
    skipped: list[tuple[str, str]]
    """(namespace/name, why) of pods left in place on purpose."""
    unmanaged: list[str]
    """namespace/name of pods without a controller, which only `force` evicts."""


@dataclasses.dataclass(frozen=True)
class Result:
    completed: bool
    """No evictable pod is left on the node, and none was left for want of `force`."""
    blocking: tuple[str, ...]
    """`namespace/name (why)` of the pods still on the node when the deadline passed."""
    evicted: int
    skipped: tuple[tuple[str, str], ...]
    """(namespace/name, why) of pods left in place on purpose (emptyDir data, excluded namespace)."""
    unmanaged: tuple[str, ...] = ()
    """Pods without a controller left in place because the policy does not `force`."""
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


def has_controller(pod: kube.JsonObject) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return any(o.get("controller") for o in owners)


def classify(pods: list[kube.JsonObject], options: Options) -> Selection:
    """Sort the node's pods as `kubectl drain --ignore-daemonsets [--delete-emptydir-data] [--force]` does."""
    selection = Selection(wanted=[], skipped=[], unmanaged=[])
    for pod in pods:
        if is_finished(pod) or is_daemonset_pod(pod) or is_mirror_pod(pod):
            continue  # a finished pod holds no GPU; the other two would come straight back
        if pod.get("metadata", {}).get("namespace") in options.exclude_namespaces:
            selection.skipped.append((pod_key(pod), EXCLUDED_NAMESPACE))
        elif is_terminating(pod):
            selection.wanted.append(pod)
        elif has_empty_dir(pod) and not options.delete_empty_dir_data:
            selection.skipped.append((pod_key(pod), EMPTY_DIR_DATA))
        elif not has_controller(pod) and not options.force:
            selection.unmanaged.append(pod_key(pod))
        else:
            selection.wanted.append(pod)
    return selection


async def list_pods(client: kube.Client, node: str) -> list[kube.JsonObject]:
    return await client.list_all("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})


async def evict(client: kube.Client, pod: kube.JsonObject, options: Options) -> tuple[str, str]:
    """One eviction attempt: ('evicted' | 'blocked' (429) | 'gone' | 'error', what the API server said)."""
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
        if error.not_found:
            return "gone", ""
        said = refusal(error)
        if error.status == 429:
            return "blocked", said
        # 500 "more than one PodDisruptionBudget" lands here: retried like a 429, and named at the end.
        logger.warning("eviction of %s failed: %s", pod_key(pod), said)
        return "error", said
    return "evicted", ""


def refusal(error: kube.ApiError) -> str:
    """The API server's own words for a refused eviction (its Status message), short and on one line."""
    try:
        said = json.loads(error.body).get("message")
    except (ValueError, AttributeError):
        said = None
    return text.bounded(said if isinstance(said, str) and said else f"{error.status} {error.reason}", 200)


def next_poll(previous: float | None) -> float:
    """Seconds until the next look while pods terminate: POLL_SECONDS, doubling to POLL_MAX_SECONDS."""
    return POLL_SECONDS if previous is None else min(previous * 2, POLL_MAX_SECONDS)


def _blocking(pod: kube.JsonObject, refusals: dict[str, str]) -> str:
    key = pod_key(pod)
    if is_terminating(pod):
        return f"{key} (still terminating)"
    return f"{key} ({refusals[key]})" if refusals.get(key) else key


def emptied(selection: Selection, evicted: int = 0) -> Result | None:
    """How a drain ends that finds no pod left to evict (None while one is): completed unless a pod
    without a controller was left for want of `force`."""
    if selection.wanted:
        return None
    unmanaged = tuple(selection.unmanaged)
    return Result(not unmanaged, (), evicted, tuple(selection.skipped), unmanaged)


async def drain(
    client: kube.Client,
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
    poll: float | None = None
    evicted = 0
    refusals: dict[str, str] = {}
    while True:
        if should_stop():
            return Result(False, (), evicted, (), stopped=True)
        selection = classify(await list_pods(client, node), options)
        ended = emptied(selection, evicted)
        if ended is not None:
            return ended
        wanted = selection.wanted
        now = datetime.datetime.now(datetime.UTC)
        if now >= deadline:
            blocking = tuple(sorted(_blocking(p, refusals) for p in wanted))
            return Result(False, blocking, evicted, tuple(selection.skipped), tuple(selection.unmanaged))

        async def bounded(pod: kube.JsonObject) -> tuple[str, str]:
            async with semaphore:
                if should_stop():
                    return STOPPED, ""
                return await evict(client, pod, options)

        pending = [p for p in wanted if not is_terminating(p)]
        answers = await asyncio.gather(*(bounded(p) for p in pending))
        results = [outcome for outcome, _ in answers]
        for pod, (outcome, said) in zip(pending, answers, strict=True):
            if outcome != STOPPED:
                on_eviction(outcome)
                refusals[pod_key(pod)] = said
        evicted += results.count("evicted")
        if STOPPED in results:
            return Result(False, (), evicted, (), stopped=True)
        if "blocked" in results or "error" in results:
            wait = backoff
            backoff = min(backoff * 2, options.backoff_max_seconds)
        else:
            # Evicted pods are looked for again soon, then less and less often (grace periods can be long).
            poll = None if "evicted" in results else poll
            wait = poll = next_poll(poll)
            backoff = options.backoff_initial_seconds
        remaining = (deadline - datetime.datetime.now(datetime.UTC)).total_seconds()
        await asyncio.sleep(max(0.0, min(wait, remaining)))


def drained_message(policy: str, result: Result) -> str:
    """The NodeDrained Event's message."""
    return f"Node drained by policy {policy}.{_left_in_place(result)}"


def failed_message(policy: str, timeout_seconds: float, result: Result) -> str:
    """The DrainFailed Event's message: why the node is not empty and which pods are in the way."""
    parts: list[str] = []
    if result.blocking:
        parts.append(
            f"Drain by policy {policy} did not finish within {timeout_seconds:g}s; the node stays cordoned. "
            f"Blocking pods: {', '.join(result.blocking)}."
        )
    else:
        parts.append(f"Drain by policy {policy} stopped; the node stays cordoned.")
    if result.unmanaged:
        parts.append(
            "Pods with no controller are not evicted unless the policy sets spec.drain.force: "
            f"{', '.join(result.unmanaged)}."
        )
    return " ".join(parts) + _left_in_place(result)


def _left_in_place(result: Result) -> str:
    said = ""
    for why in (EMPTY_DIR_DATA, EXCLUDED_NAMESPACE):
        pods = [key for key, reason in result.skipped if reason == why]
        if pods:
            said += f" Left in place ({why}): {', '.join(pods)}."
    return said
