"""What the demo has seen of the cluster: GPUNode rows, Node changes and gpu-health Events, timed.

Three followers (GPUNodes, Nodes, Events) feed a `Record`; the live view
reads it to draw the screen and the summary reads it at the end. Every
change keeps the wall-clock time it arrived, and every GPUNode version
keeps the newest `observedTime` of its GPUs, so "detected at" (the agent
read the fact) and "acted at" (the Node changed) come from the cluster
itself, not from the script that injected the fault. Pure apart from a
lock: no Kubernetes client here, so it is unit-testable with dicts.
"""

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys, timestamps, vocabulary

OUR_REASONS: frozenset[str] = frozenset(vocabulary.Condition) | frozenset(vocabulary.EventReason)
"""Event reasons gpu-health emits (condition names and its own reasons)."""
ISOLATED: Final = "GPU isolated"
RESTORED: Final = "GPU restored"
ISOLATION_HAPPENINGS: Mapping[str, str] = {
    vocabulary.EventReason.GPU_ISOLATED: ISOLATED,
    vocabulary.EventReason.GPU_RESTORED: RESTORED,
}
"""IsolateGPU's Events, as happenings on the node (detail: which GPU)."""
REPAIR_HAPPENINGS: Mapping[str, str] = {
    vocabulary.EventReason.REPAIR_STARTED: "repair started",
    vocabulary.EventReason.REPAIR_FAILED: "repair step failed",
    vocabulary.EventReason.VALIDATION_PASSED: "validation passed",
    vocabulary.EventReason.VALIDATION_FAILED: "validation failed",
    vocabulary.EventReason.NODE_RETIRED: "retired",
}
"""Repair's Events, as happenings on the node (detail: the Event's message)."""
CHECK_HAPPENINGS: Mapping[str, str] = {
    vocabulary.EventReason.CHECK_PASSED: "check passed",
    vocabulary.EventReason.CHECK_FAILED: "check failed",
    vocabulary.EventReason.CHECK_PREEMPTED: "check preempted",
}
"""Active checks' Events, as happenings on the node (detail: the Event's message)."""
WATCHED_LABELS: Mapping[str, str] = {
    keys.THERMAL_LABEL: "thermal-throttled",
    keys.STRAGGLER_LABEL: "straggler",
    keys.NEEDS_REPAIR_LABEL: "needs-repair",
}
WATCHED_TAINTS: Mapping[str, str] = {keys.UNHEALTHY_TAINT: "taint unhealthy"}


def parse_time(text: Any) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp, or None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return timestamps.parse(text)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Row:
    """One GPUNode as `kubectl get gpunodes` prints it."""

    name: str
    gpus: str
    model: str
    health: str
    issues: str
    action: str
    max_temp: str
    created: float | None
    reported: bool = True
    """The agent has reported facts (before that the operator can only say Unknown)."""


@dataclasses.dataclass(frozen=True)
class NodeState:
    unschedulable: bool
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: frozenset[str] = frozenset()
    """Taint keys (any effect)."""


@dataclasses.dataclass(frozen=True)
class Happening:
    """A change the demo saw on a Node or GPUNode: cordoned, drained, label set or removed."""

    at: float
    node: str
    what: str
    """cordoned | uncordoned | drained | `<label or taint> set` | `<label or taint> removed`."""
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class EventLine:
    at: float
    reason: str
    node: str
    message: str
    warning: bool


def row_of(obj: Mapping[str, Any]) -> Row:
    status = obj.get("status") or {}
    summary = status.get("summary") or {}

    def text(value: Any) -> str:
        return "" if value is None else str(value)

    return Row(
        name=str(obj.get("metadata", {}).get("name", "")),
        gpus=text(summary.get("gpuCount")),
        model=text(summary.get("model")),
        health=text(status.get("health")),
        issues=text(status.get("issues")),
        action=text(status.get("action")),
        max_temp=text(summary.get("maxTemperatureCelsius")),
        created=parse_time(obj.get("metadata", {}).get("creationTimestamp")),
        reported=bool(status.get("agent") or status.get("gpus")),
    )


def newest_observed(obj: Mapping[str, Any]) -> float | None:
    """The newest `status.gpus[].observedTime`: when the agent last read a changed fact."""
    times = [parse_time(gpu.get("observedTime")) for gpu in (obj.get("status") or {}).get("gpus") or []]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def node_state_of(obj: Mapping[str, Any]) -> NodeState:
    metadata = obj.get("metadata") or {}
    return NodeState(
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        taints=frozenset(str(t.get("key", "")) for t in (obj.get("spec") or {}).get("taints") or []),
    )


class Record:
    """Everything seen so far; handlers are safe to call from several follower threads."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._lock = threading.Lock()
        self._rows: dict[str, Row] = {}
        self._observed: dict[str, set[float]] = {}
        self._first_seen: dict[str, float] = {}
        self._nodes: dict[str, NodeState] = {}
        self._events: list[EventLine] = []
        self._event_counts: dict[str, int] = {}
        self._happenings: list[Happening] = []
        self._row_changes: list[tuple[float, Row]] = []

    # -- handlers (watches.Handler) --------------------------------------------------------------

    def on_gpunode(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = str(obj.get("metadata", {}).get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self._rows.pop(name, None)
                return
            row = row_of(obj)
            before = self._rows.get(name)
            self._rows[name] = row
            self._first_seen.setdefault(name, at)
            observed = newest_observed(obj)
            if observed is not None:
                self._observed.setdefault(name, set()).add(observed)
            if before is None or (before.health, before.issues, before.action) != (
                row.health,
                row.issues,
                row.action,
            ):
                self._row_changes.append((at, row))
            if row.action == vocabulary.NodeAction.DRAINED and (
                before is None or before.action != row.action
            ):
                self._happen(Happening(at, name, "drained", "status.action Drained"))

    def on_node(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = str(obj.get("metadata", {}).get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(name, None)
                return
            state = node_state_of(obj)
            before = self._nodes.get(name)
            self._nodes[name] = state
            if before is None:
                return
            if state.unschedulable != before.unschedulable:
                by = state.annotations.get(keys.CORDONED_BY_ANNOTATION) or before.annotations.get(
                    keys.CORDONED_BY_ANNOTATION
                )
                detail = f"by policy {by}" if by else "not by gpu-health"
                self._happen(Happening(at, name, "cordoned" if state.unschedulable else "uncordoned", detail))
            for watched, now, then in (
                (WATCHED_LABELS, state.labels.keys(), before.labels.keys()),
                (WATCHED_TAINTS, state.taints, before.taints),
            ):
                for key, short in watched.items():
                    if (key in now) != (key in then):
                        self._happen(Happening(at, name, f"{short} {'set' if key in now else 'removed'}"))

    def on_event(self, kind: str, obj: dict[str, Any], at: float) -> EventLine | None:
        """Record a gpu-health Event; returns it when it is new (repeats only bump a count)."""
        reason = str(obj.get("reason", ""))
        involved = obj.get("involvedObject") or obj.get("regarding") or {}
        if kind == "DELETED" or reason not in OUR_REASONS or involved.get("kind") not in ("Node", "GPUNode"):
            return None
        uid = str(obj.get("metadata", {}).get("uid", ""))
        count = int(obj.get("count") or (obj.get("series") or {}).get("count") or 1)
        line = EventLine(
            at=at,
            reason=reason,
            node=str(involved.get("name", "")),
            message=" ".join(str(obj.get("message") or obj.get("note") or "").split()),
            warning=obj.get("type") == "Warning",
        )
        with self._lock:
            seen = self._event_counts.get(uid)
            self._event_counts[uid] = count
            if seen is not None:
                return None
            self._events.append(line)
            if reason == vocabulary.EventReason.NODE_DRAINED:
                self._happen(Happening(at, line.node, "drained", "Event NodeDrained"))
            elif reason in ISOLATION_HAPPENINGS:
                gpu = line.message.split(" (", 1)[0]  # "GPU 3 (GPU-…) isolated by …"
                self._happen(Happening(at, line.node, ISOLATION_HAPPENINGS[reason], gpu))
            elif reason in REPAIR_HAPPENINGS:
                self._happen(Happening(at, line.node, REPAIR_HAPPENINGS[reason], line.message))
            elif reason in CHECK_HAPPENINGS:
                self._happen(Happening(at, line.node, CHECK_HAPPENINGS[reason], line.message))
            return line

    def _happen(self, happening: Happening) -> None:
        # One "drained" per node and time: the Event and status.action both report it.
        if happening.what == "drained" and any(
            h.node == happening.node and h.what == "drained" for h in self._happenings
        ):
            return
        self._happenings.append(happening)

    # -- readers ---------------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        with self._lock:
            return [self._rows[name] for name in sorted(self._rows, key=natural_order)]

    def nodes(self) -> dict[str, NodeState]:
        with self._lock:
            return dict(self._nodes)

    def events(self) -> list[EventLine]:
        with self._lock:
            return list(self._events)

    def happenings(self) -> list[Happening]:
        """In the order they arrived (which is their time order, up to thread scheduling)."""
        with self._lock:
            return list(self._happenings)

    def row_changes(self) -> list[tuple[float, Row]]:
        with self._lock:
            return list(self._row_changes)

    def detected_before(self, node: str, at: float) -> float | None:
        """When the agent read the newest changed fact of `node` that the operator could act on by `at`."""
        with self._lock:
            earlier = [t for t in self._observed.get(node, ()) if t <= at]
        return max(earlier) if earlier else None

    def first_seen(self, node: str) -> float | None:
        with self._lock:
            return self._first_seen.get(node)


def natural_order(name: str) -> tuple[str, int, str]:
    """gpu-node-2 before gpu-node-10."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)
