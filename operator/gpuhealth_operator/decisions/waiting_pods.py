"""Which nodes a pending pod that uses GPUs waits for: where an active check must make way by itself.

kube-scheduler (1.36) preempts no pod for DRA devices (KEP-5690, "DRA: preemption", not merged): a
workload whose claim cannot be allocated because a check holds every device of the node is left Pending
("cannot allocate all claims ... Preemption is not helpful for scheduling"). So the operator ends a
DRA check itself when a pending pod that uses GPUs waits for its node, and starts none there meanwhile.

A pod waits for a node when it is not bound yet and names it: `status.nominatedNodeName`, a
`kubernetes.io/hostname` nodeSelector, or required node affinity on `metadata.name` (matchFields) or
`kubernetes.io/hostname` (matchExpressions, operator In) — each node such a term lists. A pod that
could go to any node names none: it waits until a check ends (at the latest by its timeout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
PENDING_UNBOUND: Final = "status.phase=Pending,spec.nodeName="
"""Field selector of the pods still to be scheduled."""


@dataclasses.dataclass(frozen=True)
class Waits:
    """Nodes pending pods wait for: by name, and by their `kubernetes.io/hostname` label."""

    names: frozenset[str] = frozenset()
    hostnames: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.names or self.hostnames)

    def for_node(self, name: str, labels: Mapping[str, str]) -> bool:
        return name in self.names or labels.get(HOSTNAME_LABEL, name) in self.hostnames


def waits(pods: Iterable[Mapping[str, Any]], uses_gpus: Callable[[Mapping[str, Any]], bool]) -> Waits:
    """The nodes the unbound, undeleted pods for which `uses_gpus` holds wait for."""
    names: set[str] = set()
    hostnames: set[str] = set()
    for pod in pods:
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp") or not uses_gpus(pod):
            continue
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if isinstance(nominated, str) and nominated:
            names.add(nominated)
        hostname = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
        if isinstance(hostname, str) and hostname:
            hostnames.add(hostname)
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        for term in affinity.get("nodeSelectorTerms") or []:
            names.update(_listed(term.get("matchFields"), "metadata.name"))
            hostnames.update(_listed(term.get("matchExpressions"), HOSTNAME_LABEL))
    return Waits(frozenset(names), frozenset(hostnames))


def _listed(requirements: object, key: str) -> list[str]:
    if not isinstance(requirements, list):
        return []
    return [
        str(value)
        for r in requirements
        if isinstance(r, Mapping) and r.get("key") == key and r.get("operator") == "In"
        for value in r.get("values") or []
    ]
