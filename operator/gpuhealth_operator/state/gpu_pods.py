"""The pods that use GPUs, by node, as a watch of pods shows them: which nodes the active checks find busy.

The check step (`ladder/check/checking.py`) must never start a check on a node where a pod uses GPUs,
and counts a node idle only from when none is there. It used to LIST every pod of the cluster on each
timer pass (about every second): on a fleet of 40,000 pods, tens of MB decoded per second by the
operator and by the API server. Instead a watch of the pods not ended (`runtime/gpu_pod_watch.py`,
while a policy wants checks) feeds this index, and a pass reads it without a request.

It keeps what the step needs and nothing of the pods' bodies: each pod that `uses_gpus`, by key (its
UID), with the nodes it holds (bound there, `spec.nodeName`, or nominated there, where the scheduler
preempts for it: `status.nominatedNodeName`), and per node since when no GPU pod has been there
(`freed_at`, so a pod that came and went between two passes still restarts the node's idle clock).

It also keeps, for each pending pod that uses GPUs and is not bound yet, the nodes it waits for
(`decisions.waiting_pods`: kube-scheduler preempts nothing for DRA devices, so a DRA check makes way for
such a pod itself, `ladder/check/check_yield.py`): the watch of pods not ended brings those pods too, so
that needs no LIST of the pending pods per pass either.

Until the watch's LIST has been applied (`synced`) nothing here may be read as "idle": the operator
never acts on data it has not seen. A LIST (the first, and each one after the API server lost the
history to resume from) replaces everything: the pods deleted meanwhile go with it.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from gpuhealth_api import keys
from gpuhealth_operator.decisions import waiting_pods

Pod = Mapping[str, Any]
DELETED = "DELETED"


def uses_gpus(pod: Pod) -> bool:
    """The pod requests GPUs (the device plugin's resource, or any DRA claim) and is not a check's."""
    meta = pod.get("metadata") or {}
    if keys.CHECK_LABEL in (meta.get("labels") or {}):
        return False
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            value = (resources.get(part) or {}).get(keys.GPU_RESOURCE)
            if value is not None and str(value) not in ("0", ""):
                return True
    return False


def _answered(pod: Pod) -> bool:
    return True


def held_nodes(pod: Pod) -> tuple[str, ...]:
    """The nodes a pod holds: bound to, or nominated on (the scheduler binds it once the victims are gone)."""
    found: list[str] = []
    for where in (
        (pod.get("spec") or {}).get("nodeName"),
        (pod.get("status") or {}).get("nominatedNodeName"),
    ):
        if isinstance(where, str) and where and where not in found:
            found.append(sys.intern(where))  # one string per node name, however many pods name it
    return tuple(found)


def pod_key(pod: Pod) -> str:
    """A pod's UID (a pod deleted and created again under its name is another pod), else namespace/name."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class GpuPods:
    """node → the keys of the GPU pods there; `observe`, `listing`/`listed`, `forget_node`, `clear` write."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, ...]] = {}
        """pod key → the nodes it holds (only pods that use GPUs and hold a node)."""
        self._by_node: dict[str, set[str]] = {}
        self.freed_at: dict[str, datetime.datetime] = {}
        """node → when a GPU pod last left it (absent: none left it since the index was filled)."""
        self._waiting: dict[str, waiting_pods.Waits] = {}
        """pod key → the nodes it waits for (only unbound pending pods that use GPUs and name one)."""
        self._listing: dict[str, tuple[str, ...]] | None = None
        """The pods a LIST in progress brought so far: they replace `_pods` once it is complete."""
        self._listing_waits: dict[str, waiting_pods.Waits] = {}
        self.synced = False
        """The watch's LIST has been applied, and no LIST that replaces it is under way."""

    @property
    def busy(self) -> AbstractSet[str]:
        """The nodes where a pod uses GPUs, as of the last event (meaningful only while `synced`)."""
        return self._by_node.keys()

    @property
    def waits(self) -> waiting_pods.Waits:
        """The nodes the pending GPU pods wait for, as of the last event (meaningful only while `synced`)."""
        if not self._waiting:
            return waiting_pods.Waits()
        found = self._waiting.values()
        return waiting_pods.Waits(
            frozenset().union(*(w.names for w in found)), frozenset().union(*(w.hostnames for w in found))
        )

    def __len__(self) -> int:
        return len(self._pods)

    def observe(self, kind: str | None, pod: Pod, now: datetime.datetime) -> None:
        """A watch event (`kind` ADDED, MODIFIED, DELETED) or, with `kind` None, an object of a LIST."""
        key = pod_key(pod)
        gpus = kind != DELETED and uses_gpus(pod)
        held = held_nodes(pod) if gpus else ()
        # `uses_gpus` is answered already: every pod event of the cluster comes here, most of them bound.
        unbound = gpus and not (pod.get("spec") or {}).get("nodeName")
        wait = waiting_pods.waits([pod], _answered) if unbound else waiting_pods.Waits()
        if kind is None and self._listing is not None:
            if held:
                self._listing[key] = held
            if wait:
                self._listing_waits[key] = wait
            return
        self._put(key, held, now)
        if wait:
            self._waiting[key] = wait
        else:
            self._waiting.pop(key, None)

    def listing(self) -> None:
        """A LIST begins: until it is complete (`listed`) nothing here is current."""
        self.synced = False
        self._listing = {}
        self._listing_waits = {}

    def listed(self, now: datetime.datetime) -> None:
        """The LIST is complete and every object of it observed: it replaces what was known."""
        fresh, self._listing = self._listing or {}, None
        for key in [k for k in self._pods if k not in fresh]:
            self._put(key, (), now)
        for key, held in fresh.items():
            self._put(key, held, now)
        self._waiting, self._listing_waits = self._listing_waits, {}
        self.synced = True

    def forget_node(self, node: str) -> None:
        """The Node is gone: so are the records of the pods on it (their deletions follow)."""
        for key in self._by_node.pop(node, set()):
            rest = tuple(n for n in self._pods.get(key, ()) if n != node)
            if rest:
                self._pods[key] = rest
            else:
                self._pods.pop(key, None)
        self.freed_at.pop(node, None)

    def clear(self) -> None:
        """The watch stopped (no policy wants checks): nothing is known, nothing kept."""
        self._pods.clear()
        self._by_node.clear()
        self.freed_at.clear()
        self._waiting.clear()
        self._listing = None
        self._listing_waits = {}
        self.synced = False

    def _put(self, key: str, held: tuple[str, ...], now: datetime.datetime) -> None:
        before = self._pods.get(key, ())
        if before == held:
            return
        self._leave(key, (n for n in before if n not in held), now)
        for node in held:
            self._by_node.setdefault(node, set()).add(key)
        if held:
            self._pods[key] = held
        else:
            self._pods.pop(key, None)

    def _leave(self, key: str, nodes: Iterable[str], now: datetime.datetime) -> None:
        for node in nodes:
            keys_there = self._by_node.get(node)
            if keys_there is None:
                continue
            keys_there.discard(key)
            if not keys_there:
                del self._by_node[node]
            self.freed_at[node] = now
