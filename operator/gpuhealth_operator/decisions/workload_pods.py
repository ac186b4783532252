"""Which pods make a node busy, and what a repair phase does about it (issue 45 items 2, 3).

No I/O: the callers list the node's pods and pass them in.

The drain's skip rules (emptyDir data kept, excluded namespaces, no controller without `force`) say
which pods the drain may evict; they say nothing about what a GPU reset, a reboot or a DCGM diagnostic
may run beside. Each of those takes the GPUs from under whatever runs there. So a node is *busy* while
any pod bound to it is

- unfinished: not Succeeded or Failed (a terminating pod still runs until it is gone),
- not a DaemonSet's: the GPU stack's own (device plugin, our agent, dcgm-exporter) tolerate
  everything and would come straight back,
- not a mirror pod (the kubelet's static pods),
- not one of repair's own Jobs' pods (`is_repair_pod`): a step's pod that outlived its reboot, the
  validation's.

Whatever the policy's drain options. A busy node gets no repair step, no validation and no new-node
validation; `while_busy` says what a repair phase that meets one does.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.decisions import times

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
NAMED: Final = 5
"""`words` names at most this many pods."""

Pod = Mapping[str, Any]


def _meta(pod: Pod) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _controller_kind(pod: Pod) -> str | None:
    for owner in _meta(pod).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller"):
            kind = owner.get("kind")
            return kind if isinstance(kind, str) else None
    return None


def daemonset_pod_in(pod: Pod, namespace: str | None) -> bool:
    """Whether `pod` is controlled by a DaemonSet (apps) and in `namespace` (None: any). Labels, names,
    nodeSelectors and ports are anyone's to copy; creating pods in an installer's namespace (ours, the
    GPU Operator's) takes rights a tenant does not have, and a tenant's own DaemonSet lives in the
    tenant's namespace: what makes a pod the agent (`state.agent_pods`) or the GPU Operator's operand
    (`decisions.hostengine`)."""
    meta = _meta(pod)
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(owner, Mapping)
        and owner.get("controller") is True
        and owner.get("kind") == "DaemonSet"
        and str(owner.get("apiVersion", "")).startswith("apps/")
        for owner in owners
    )


def is_repair_pod(pod: Pod, repair_namespace: str) -> bool:
    """A pod of one of repair's own Jobs: in the repair namespace, controlled by a Job, with our
    repair-action label. All three: a label alone is anyone's to set, and a pod elsewhere is not ours."""
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    return (
        meta.get("namespace") == repair_namespace
        and _controller_kind(pod) == "Job"
        and keys.REPAIR_ACTION_LABEL in labels
    )


def makes_busy(pod: Pod, repair_namespace: str) -> bool:
    """Whether this pod, bound to the node, makes it busy (module docstring)."""
    status = pod.get("status") or {}
    if status.get("phase") in {"Succeeded", "Failed"}:
        return False
    if _controller_kind(pod) == "DaemonSet":
        return False
    if MIRROR_ANNOTATION in (_meta(pod).get("annotations") or {}):
        return False
    return not is_repair_pod(pod, repair_namespace)


def busy(pods: Sequence[Pod], repair_namespace: str) -> list[Pod]:
    """The node's pods that make it busy, in the order listed."""
    return [pod for pod in pods if makes_busy(pod, repair_namespace)]


def key(pod: Pod) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def words(pods: Sequence[Pod]) -> str:
    """`2 workload pod(s) on the node (team/a, team/b)`: the first NAMED named."""
    named = ", ".join(key(p) for p in pods[:NAMED])
    more = f" and {len(pods) - NAMED} more" if len(pods) > NAMED else ""
    return f"{len(pods)} workload pod(s) on the node ({named}{more})"


class BusyStep(enum.StrEnum):
    """What a repair phase (a step, or validation) that finds the node busy does before its Job."""

    DRAIN = "drain"
    """The policy's drain may evict a busy pod: drain the node again; the Job follows once it is empty."""
    WAIT = "wait"
    """The pods are none the drain evicts (kept on purpose, or not yet evictable): wait for them to go."""
    FAIL = "fail"
    """The phase's deadline passed with the node still busy: the phase fails (its place is not held for
    ever); the next step, or retire."""


def while_busy(
    since: datetime.datetime,
    timeout_seconds: float,
    now: datetime.datetime,
    *,
    evictable: bool,
) -> BusyStep:
    """A busy node in a phase begun at `since` with `timeout_seconds` to finish: its deadline counts from
    the phase's start, Job or no Job, so a pod that never goes cannot hold the node (and a maxConcurrent
    place) in the phase for ever."""
    if times.seconds_between(since, now) >= timeout_seconds:
        return BusyStep.FAIL
    return BusyStep.DRAIN if evictable else BusyStep.WAIT
