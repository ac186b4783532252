"""The operator's view of the cluster, fed by the watch streams (`watching` for Nodes and GPUNodes, kopf's
for policies).

Reconciling reads only this cache, never the API server, so a pass over the
whole fleet costs no requests; only changes are written. Of a GPUNode only
the facts the decisions read are kept (`compaction.GPU_FIELDS`), to keep the memory
per node small. Writes refresh the
cache from the API server's answer at once, so the next decision never works
on a view older than our own last write.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from gpuhealth_api import keys, status, vocabulary
from gpuhealth_operator.decisions import (
    budget,
    due,
    model,
    policies,
    signals,
    times,
    trends,
)
from gpuhealth_operator.state import link_cohorts
from gpuhealth_operator.state.records import (
    AGENT_FIELDS,
    UNSET,
    GPUNodeRecord,
    NodeCondition,
    NodeRecord,
    gpunode_record,
    node_record,
)

__all__ = (  # what moved to `records`, re-exported for one wave: many callers name cache.X
    "AGENT_FIELDS",
    "UNSET",
    "ClusterCache",
    "GPUNodeRecord",
    "NodeCondition",
    "NodeRecord",
    "Selection",
    "first_sighting",
    "gpu_count_and_model",
    "gpunode_record",
    "last_heartbeat",
    "node_record",
    "stale_deadline",
)


def last_heartbeat(facts: status.GPUNodeStatus) -> object:
    """The agent's `lastHeartbeatTime` as reported (None if absent): a new value is a new report."""
    agent = facts.get("agent")
    return agent.get("lastHeartbeatTime") if isinstance(agent, Mapping) else None


def first_sighting(facts: status.GPUNodeStatus, now: datetime.datetime) -> datetime.datetime:
    """When to time a GPUNode's report from, the first time this operator sees it: now.

    Except where an operator before us (a restart) already judged the agent stale: its
    AgentStale condition, stamped by that operator's clock, says since when, so a silent
    agent's old facts do not turn fresh (and disruptive) because we restarted.
    """
    for condition in facts.get("conditions") or []:
        if condition.get("type") == vocabulary.Condition.AGENT_STALE and condition.get("status") == "True":
            since = times.parse(condition.get("lastTransitionTime"))
            agent = facts.get("agent")
            if since is not None and isinstance(agent, Mapping):
                limit = signals.STALE_HEARTBEATS * signals.heartbeat_seconds(agent)
                return min(since, now) - datetime.timedelta(seconds=limit)
    return now


def stale_deadline(record: GPUNodeRecord) -> float | None:
    """Epoch seconds at which the record's agent turns stale by the operator's clock (`report_age` reaches
    `stale_limit`); None when time alone never makes it so (not yet timed) or it is stale already."""
    limit = record.stale_limit
    if limit is None or record.report_seen_at is None:
        return None
    return record.report_seen_at.timestamp() + limit


def _marks(view: model.NodeView) -> tuple[object, ...]:
    """What of a Node a policy's status and GPU gauges count (besides verdicts): cordon, claims, labels,
    taints, GPU capacity."""
    return (view.unschedulable, view.annotations, view.labels, view.taint_keys, view.gpu_capacity)


def gpu_count_and_model(status: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """A GPUNode's GPUs as the fleet gauges count them: the summary's count, else how many it lists (None:
    neither), and the summary's model, else the first GPU's that names one."""
    summary = status.get("summary")
    summary = summary if isinstance(summary, Mapping) else {}
    gpus = status.get("gpus") or []
    count = summary.get("gpuCount")
    if not isinstance(count, int) or isinstance(count, bool):
        count = len(gpus) or None
    model = summary.get("model") or next((g.get("model") for g in gpus if g.get("model")), None)
    return count, model


def _gpunode_marks(status: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a GPUNode a policy's status and GPU gauges count: its `status.action`, and its GPUs' count
    and model (not the whole summary: its temperature moves with every report)."""
    return (status.get("action"), *gpu_count_and_model(status))


def _ordered(order: Mapping[str, int], names: Iterable[str]) -> list[str]:
    """The names `order` places, by their place."""
    return sorted((n for n in names if n in order), key=order.__getitem__)


def _newer(old: str, new: str) -> bool:
    """resourceVersions are opaque but, on etcd, monotonically increasing integers."""
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


@dataclasses.dataclass
class Selection:
    """The GPU nodes a policy selects, and those of them that count against its budget.

    Kept current as Node and GPUNode records come and go, so that admitting a
    node to the budget needs no pass over the fleet (see `budget.admits`). A
    Node without a GPUNode is not selected (`policies.selects_gpu_node`).
    """

    policy: model.Policy
    selected: set[str] = dataclasses.field(default_factory=set)
    unavailable: set[str] = dataclasses.field(default_factory=set)
    """Selected nodes that `budget.holds` (what `budget.counted` returns, in-flight cordons aside), and
    unschedulable opted-out nodes the selector matches: an emergency stop keeps the cordon's slot
    until someone makes the node schedulable."""

    def update(self, view: model.NodeView, has_agent: bool) -> None:
        if not policies.selects_gpu_node(self.policy, view, has_agent):
            self.discard(view.name)
            opted_out = view.unschedulable and policies.excluded(view)
            if has_agent and opted_out and policies.matches(self.policy, view):
                self.unavailable.add(view.name)  # opted out, but while cordoned it still takes the budget
            return
        self.selected.add(view.name)
        if budget.holds(self.policy, view):
            self.unavailable.add(view.name)
        else:
            self.unavailable.discard(view.name)

    def discard(self, name: str) -> None:
        self.selected.discard(name)
        self.unavailable.discard(name)


class ClusterCache:
    """Nodes, GPUNodes and policies as last seen; only these methods change them.

    Readers get read-only views (`nodes`, `gpunodes`, `policies`,
    `policy_errors`) or one record by name (`node`, `gpunode`), which is None
    once the object is gone: a reconcile that resumes after an `await` finds
    out that way that nothing is left to do. Answers to our own writes go
    through `refresh_*`, which never brings a deleted object back.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}
        self._gpunodes: dict[str, GPUNodeRecord] = {}
        self._policies: dict[str, model.Policy] = {}
        self._policy_errors: dict[str, tuple[int, str]] = {}
        """Policies whose spec did not parse: name → (generation, the message naming the field)."""
        self._selections: dict[str, Selection] = {}
        self._order: dict[str, int] = {}
        """GPUNode name → its place in `gpunodes` (insertion order), to order a few names as a scan would."""
        self._node_order: dict[str, int] = {}
        """The same for `nodes`."""
        self._placed = 0
        self.due = due.DueIndex()
        """The nodes the timer must look at (`decisions.due`): every change stored here touches its node."""
        self._repairing: set[str] = set()
        self._unvalidated: set[str] = set()
        self.repairing: AbstractSet[str] = self._repairing
        """Nodes whose Node carries the repair annotation (`repairing.sweep` visits only these)."""
        self.unvalidated: AbstractSet[str] = self._unvalidated
        """Nodes whose Node carries the unvalidated taint (`new_nodes.sweep` visits these)."""
        self._listing_isolated: set[str] = set()
        self.listing_isolated: AbstractSet[str] = self._listing_isolated
        """GPUNodes whose status lists isolated GPUs (`isolation_sweep.sweep` asks each pass if any does)."""
        self._check_requested: set[str] = set()
        self.check_requested: AbstractSet[str] = self._check_requested
        """GPUNodes carrying an on-demand check request (`keys.CHECK_NOW_ANNOTATION`): what
        `check_requests.take` visits each pass, not every GPUNode of the fleet."""
        self.links = link_cohorts.LinkCohorts()
        """The NVLinks up per GPU cohort over every stored GPUNode: what a GPU's links should be."""
        self.marks = 0
        """Counts changes to what a policy's status and GPU gauges count from a Node (cordon, labels,
        annotations, taints, GPU capacity) or a GPUNode (its `status.action`, its GPUs' count and model):
        the timer recounts the status when it moved."""
        self.nodes: Mapping[str, NodeRecord] = types.MappingProxyType(self._nodes)
        self.gpunodes: Mapping[str, GPUNodeRecord] = types.MappingProxyType(self._gpunodes)
        self.policies: Mapping[str, model.Policy] = types.MappingProxyType(self._policies)
        self.policy_errors: Mapping[str, tuple[int, str]] = types.MappingProxyType(self._policy_errors)

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def gpunode(self, name: str) -> GPUNodeRecord | None:
        return self._gpunodes.get(name)

    def put_node(self, body: Mapping[str, Any]) -> NodeRecord:
        """Store a Node as a watch event shows it (an older resourceVersion is ignored)."""
        meta = body.get("metadata") or {}
        name = str(meta.get("name", ""))
        old = self._nodes.get(name)
        if old is not None and not _newer(old.resource_version, str(meta.get("resourceVersion", ""))):
            return old
        record = node_record(body, older=old)  # built only when stored; its `reading` taken over
        if name not in self._nodes:
            self._placed += 1
            self._node_order[name] = self._placed
        self._nodes[name] = record
        if old is None or old.view != record.view:
            # What a selection reads of a node is its view and whether it has a GPUNode, which
            # `put_gpunode` and `remove_gpunode` select on: an equal view leaves every selection as is.
            self._select(name)
        self._mark(record.view)
        self.due.touch(name)
        if old is None or _marks(old.view) != _marks(record.view):
            self.marks += 1
        return record

    def refresh_node(self, body: Mapping[str, Any]) -> NodeRecord | None:
        """Store the API server's answer to our write; None (and nothing stored) if the Node is gone."""
        name = str((body.get("metadata") or {}).get("name", ""))
        return self.put_node(body) if name in self._nodes else None

    def _mark(self, view: model.NodeView) -> None:
        for held, present in (
            (self._repairing, keys.REPAIR_ANNOTATION in view.annotations),
            (self._unvalidated, keys.UNVALIDATED_TAINT in view.taint_keys),
        ):
            if present:
                held.add(view.name)
            else:
                held.discard(view.name)

    def remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._node_order.pop(name, None)
        self._repairing.discard(name)
        self._unvalidated.discard(name)
        for selection in self._selections.values():
            selection.discard(name)
        self.due.touch(name)
        self.marks += 1

    def _select(self, name: str) -> None:
        """Bring every selection up to date with the node's Node and GPUNode as now stored."""
        record = self._nodes.get(name)
        for selection in self._selections.values():
            if record is None:
                selection.discard(name)
            else:
                selection.update(record.view, name in self._gpunodes)

    def selection(self, policy: model.Policy) -> Selection:
        """The policy's selection; built from the whole cache the first time and when the policy changed."""
        current = self._selections.get(policy.name)
        if current is None or current.policy != policy:
            for stale in [n for n in self._selections if n not in self._policies]:
                del self._selections[stale]  # deleted policies
            current = Selection(policy)
            for record in self._nodes.values():
                current.update(record.view, record.view.name in self._gpunodes)
            self._selections[policy.name] = current
        return current

    def put_gpunode(self, body: Mapping[str, Any], now: datetime.datetime) -> GPUNodeRecord:
        """Store a GPUNode as a watch event shows it (an older resourceVersion is ignored).

        The time the agent's report was seen (`report_seen_at`) moves to `now` only when
        `lastHeartbeatTime` changed, so our own status writes do not make a silent agent look
        alive. `now` is the decision clock (`Context.clock`): a backtest's is the trace's, and the
        machine's would leave a replayed silent agent fresh for ever.
        """
        meta = body.get("metadata") or {}
        old = self._gpunodes.get(str(meta.get("name", "")))
        if old is None or _newer(old.resource_version, str(meta.get("resourceVersion", ""))):
            # The report's time is read off the body as sent (the record holds the same values): the
            # record is built once, with it, not built and then copied (a put per report).
            facts: status.GPUNodeStatus = body.get("status") or {}  # type: ignore[assignment]
            if old is None or old.report_seen_at is None:
                seen = first_sighting(facts, now)
            elif last_heartbeat(old.status) != last_heartbeat(facts):
                seen = now
            else:
                seen = old.report_seen_at
            record = gpunode_record(body, seen, older=old, now=now)  # what still holds of `old` kept
            if record.name not in self._gpunodes:
                self._placed += 1
                self._order[record.name] = self._placed
            self._gpunodes[record.name] = record
            self.links.replace(old.status.get("gpus") if old else None, record.status.get("gpus"))
            if old is None:  # an agent appeared: its node now counts in the budgets that select it
                self._select(record.name)
            self.due.changed(record.name, stale_deadline(record))
            if old is None or _gpunode_marks(old.status) != _gpunode_marks(record.status):
                self.marks += 1
            for held, present in (
                (self._listing_isolated, bool(record.status.get("isolatedGPUs"))),
                (self._check_requested, keys.CHECK_NOW_ANNOTATION in record.annotations),
            ):
                if present:
                    held.add(record.name)
                else:
                    held.discard(record.name)
            return record
        return old

    def refresh_gpunode(self, body: Mapping[str, Any], now: datetime.datetime) -> GPUNodeRecord | None:
        """Store the API server's answer to our write; None (and nothing stored) if the GPUNode is gone."""
        name = str((body.get("metadata") or {}).get("name", ""))
        return self.put_gpunode(body, now) if name in self._gpunodes else None

    def memory(self, record: GPUNodeRecord) -> trends.Trends:
        """What the node's GPUs are judged against: its reports as remembered (`record.memory`) and what
        their cohorts across the fleet have up (`links`), both read from the cluster."""
        return trends.with_cohorts(record.memory, self.links.expected)

    def remove_gpunode(self, name: str) -> None:
        gone = self._gpunodes.get(name)
        if gone is not None:
            self.links.replace(gone.status.get("gpus"), None)
        if self._gpunodes.pop(name, None) is not None:
            self._listing_isolated.discard(name)
            self._check_requested.discard(name)
            self._select(name)
            self._order.pop(name, None)
            self.due.changed(name, None)
            self.marks += 1

    def in_order(self, names: Iterable[str]) -> list[str]:
        """The names that have a GPUNode, in the order `gpunodes` iterates them (as a scan meets them)."""
        return _ordered(self._order, names)

    def in_node_order(self, names: Iterable[str]) -> list[str]:
        """The names that have a Node, in the order `nodes` iterates them."""
        return _ordered(self._node_order, names)

    def _policies_changed(self) -> None:
        """Every node's due answer and every policy's status may have moved."""
        self.due.touch_all()
        self.marks += 1

    def put_policy(self, policy: model.Policy) -> bool:
        """Store a valid policy (clearing any error it had); whether it is new or changed."""
        self._policy_errors.pop(policy.name, None)
        if self._policies.get(policy.name) == policy:
            return False
        self._policies[policy.name] = policy
        self._policies_changed()
        return True

    def reject_policy(self, name: str, generation: int, error: str) -> None:
        """A policy whose spec does not parse: not applied, its error kept for its status."""
        self._policies.pop(name, None)
        self._policy_errors[name] = (generation, error)
        self._policies_changed()

    def remove_policy(self, name: str) -> None:
        self._policies.pop(name, None)
        self._policy_errors.pop(name, None)
        self._selections.pop(name, None)
        self._policies_changed()
