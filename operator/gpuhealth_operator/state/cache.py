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
import functools
import itertools
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from gpuhealth_api import keys, status, vocabulary
from gpuhealth_operator.decisions import (
    budget,
    clocks,
    due,
    hysteresis,
    model,
    overrides,
    policies,
    signals,
    stragglers,
    times,
    trends,
)
from gpuhealth_operator.state import compaction, kept_conditions, link_cohorts


@dataclasses.dataclass(frozen=True)
class NodeCondition:
    status: str
    reason: str
    message: str
    last_transition_time: str


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """A Node as far as the operator cares."""

    view: model.NodeView
    uid: str
    resource_version: str
    taints: tuple[Mapping[str, Any], ...]
    condition: NodeCondition | None
    """Our GPUHealthy condition as the Node holds it."""
    cordon_taken_over: bool = False
    """Unschedulable, claimed by us, but the flag last set by someone else (`overrides.cordon_taken_over`)."""
    created: str = ""
    """metadata.creationTimestamp (RFC 3339): whether the node is new to a policy (`decisions.new_nodes`)."""
    condition_written: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Other tools' Node conditions by type → the later of their lastHeartbeatTime and lastTransitionTime
    (RFC 3339, their writer's clock): whether a version was written after a reboot (`reading.report`).
    Not in `reads_like`: a heartbeat of theirs asks for no pass."""

    @functools.cached_property
    def at_rest(self) -> bool:
        """`clocks.node_at_rest` of this version: asked by the timer every tick, answered once."""
        return clocks.node_at_rest(self.view)

    @functools.cached_property
    def reading(self) -> int:
        """What a pass reads of this version, as a number: a version that `reads_like` the one before it
        is given that one's by `ClusterCache.put_node`, so a kubelet's status update every few seconds
        leaves a node at rest (`resting`)."""
        return next(_READINGS)

    def reads_like(self, older: NodeRecord) -> bool:
        """Whether this version holds all `older` held but its resourceVersion: the record keeps only what
        the decisions read, so a Node update that changed anything else (a heartbeat time, another tool's
        annotation) stores an equal record."""
        return (
            self.view == older.view
            and self.uid == older.uid
            and self.taints == older.taints
            and self.condition == older.condition
            and self.cordon_taken_over == older.cordon_taken_over
            and self.created == older.created
        )


UNSET: Any = object()
"""A derived value not worked out yet (`GPUNodeRecord.held`)."""


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)  # verdicts hold it weakly
class GPUNodeRecord:
    """A GPUNode version as the decisions read it, and what was worked out of it.

    Slotted: a `__dict__` of fourteen entries cost a node 464 bytes, slots 112. The derived values
    (`conditions` to `reading`) are slots left empty by the constructor: the first reading of one
    works it out (`__getattr__`, `_DERIVATIONS`) and fills the slot, and later readings are the slot's
    own, as `functools.cached_property` does with a `__dict__`.
    """

    name: str
    uid: str
    resource_version: str
    status: status.GPUNodeStatus
    created: str | None = None
    """metadata.creationTimestamp (RFC 3339): a GPUNode with no report yet is new until 3 heartbeats old."""
    report_seen_at: datetime.datetime | None = None
    """When this operator saw `status.agent.lastHeartbeatTime` change (its own clock, not the agent's):
    staleness is timed from here. Set by `ClusterCache.put_gpunode`; the first sighting starts the clock."""
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The `gpuhealth.io/` annotations only (a fire drill's, see `decisions.drill`)."""
    conditions: Mapping[vocabulary.ConditionKey, model.ConditionState] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    """`status.conditions` parsed (`hysteresis.from_status`), once per stored version, read-only."""
    fact_signals: signals.FactSignals = dataclasses.field(init=False, repr=False, compare=False)
    """The fact signals judged from this version (`signals.raw_signals`' `known`), filled as judged."""
    memory: trends.Trends = dataclasses.field(init=False, repr=False, compare=False)
    """What the operator remembers of the node's reports up to this one (`decisions.trends`): advanced
    by `ClusterCache.put_gpunode` for each new report; a version stored otherwise starts afresh."""
    straggler_facts: tuple[stragglers.Clocks | None, stragglers.Performance] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    """The report's clocks (`stragglers.clocks_of`) and its straggler cohort and score
    (`stragglers.performance_of`), worked out together once per version: the score and the
    timer's window (`stragglers.smoothed`) read the same clocks. One entry, not two: it is kept per node."""
    at_rest: bool = dataclasses.field(init=False, repr=False, compare=False)
    """`clocks.facts_at_rest` of this version: asked by the timer every tick, answered once."""
    stale_limit: float | None = dataclasses.field(init=False, repr=False, compare=False)
    """`clocks.stale_limit` of this version."""
    reading: int = dataclasses.field(init=False, repr=False, compare=False)
    """What a verdict reads of this version, as a number: a version that reads like the one before
    it (`reads_like`) is given that one's by `ClusterCache.put_gpunode`, so "nothing a verdict
    reads has moved since" is one comparison (`resting`)."""

    if not TYPE_CHECKING:  # for mypy, every other name stays an error

        def __getattr__(self, name: str) -> Any:
            derive = _DERIVATIONS.get(name)
            if derive is None:
                raise AttributeError(name)
            value = derive(self)
            object.__setattr__(self, name, value)
            return value

    def held(self, derived: str) -> Any:
        """The derived value `derived` (`conditions`, `fact_signals`, ...) if worked out, else `UNSET`."""
        try:
            return object.__getattribute__(self, derived)  # not `__getattr__`: nothing is worked out
        except AttributeError:
            return UNSET

    def hold(self, derived: str, value: object) -> None:
        """Set the derived value `derived` (taken over from an older version), or empty it (`UNSET`)."""
        if value is not UNSET:
            object.__setattr__(self, derived, value)
        elif self.held(derived) is not UNSET:
            object.__delattr__(self, derived)

    @property
    def clocks(self) -> stragglers.Clocks | None:
        return self.straggler_facts[0]

    @property
    def performance(self) -> stragglers.Performance:
        return self.straggler_facts[1]

    def same_report(self, other: GPUNodeRecord) -> bool:
        """Whether both versions hold the same agent report (AGENT_FIELDS): ours differ, say."""
        return all(self.status.get(k) == other.status.get(k) for k in AGENT_FIELDS)

    def inherit(self, older: GPUNodeRecord) -> None:
        """Take over what was judged of `older`'s agent report, which this version holds too
        (`same_report`): fact signals and straggler performance depend on nothing else."""
        for derived in _FROM_REPORT:
            value = older.held(derived)
            if value is not UNSET:
                self.hold(derived, value)

    def inherit_healthy_signals(self, older: GPUNodeRecord) -> None:
        """Take over `older`'s fact signals, all healthy, if this report leaves them so
        (`signals.still_healthy`): judging every GPU of every report is a time per report."""
        judged = older.held("fact_signals")
        memory = self.held("memory")
        if (
            judged
            and judged is not UNSET
            and signals.still_healthy(
                judged, older.status, self.status, memory if memory is not UNSET else None
            )
        ):
            self.hold("fact_signals", dict(judged))  # its own: a key judged later is this version's

    def reads_like(self, older: GPUNodeRecord) -> bool:
        """Whether every verdict judges this version exactly as `older` (at the same instant).

        Only the agent's moving samples differ: its GPUs hold `older`'s healthy fact signals
        (taken over by `inherit_healthy_signals`, or the same report), the agent block differs in
        its heartbeat time alone (both valid), the summary in its hottest temperature alone, and
        every field the operator writes (conditions, health, action, straggler, isolation,
        repair) and the `gpuhealth.io/` annotations are as they were. A verdict reads no other
        part of a GPUNode (`verdicts.judge`: the facts through `signals.raw_signals`).
        """
        judged = self.held("fact_signals")
        if (
            not judged
            or judged is UNSET
            or judged != older.held("fact_signals")
            or self.annotations != older.annotations
        ):
            return False
        new, old = self.status, older.status
        if any(new.get(k) != old.get(k) for k in new.keys() | old.keys() if k not in _MOVING_SAMPLES):
            return False
        if self.stale_limit is None or older.stale_limit is None:
            return False
        return all(
            _without(new.get(field), moving) == _without(old.get(field), moving)
            for field, moving in _MOVING_SAMPLES.items()
            if moving is not None
        )

    def inherit_conditions(self, older: GPUNodeRecord) -> None:
        """Take over `older`'s parsed `conditions`, and its `at_rest` if health and action are as they were,
        when this version holds the same conditions: an agent's report leaves the operator's fields as
        they were, and reading fifteen conditions is a time per report."""
        if self.status.get("conditions") is not older.status.get("conditions"):
            return
        self.hold("conditions", older.held("conditions"))
        at_rest = older.held("at_rest")
        if at_rest is not UNSET and all(self.status.get(k) == older.status.get(k) for k in _AT_REST_READS):
            self.hold("at_rest", at_rest)

    def rest(self) -> None:
        """The node is at rest (`resting`): drop the parsed conditions, which only a judgement reads. A
        node at rest is not judged, and the versions after this one would carry them along; parsed
        again when it is judged next. Their states are the last verdict's too: what goes is the
        mapping, ~0.6 KiB of every node at rest (issue 29)."""
        self.hold("conditions", UNSET)

    def report_age(self, now: datetime.datetime) -> float:
        """Seconds since this operator saw the agent's last new report (0 if not yet timed)."""
        if self.report_seen_at is None:
            return 0.0
        return max(0.0, times.seconds_between(self.report_seen_at, now))


def _parsed_conditions(record: GPUNodeRecord) -> Mapping[vocabulary.ConditionKey, model.ConditionState]:
    states = hysteresis.from_status(record.status.get("conditions") or [])
    return types.MappingProxyType({k: compaction.SHARED.share(v) for k, v in states.items()})


def _straggler_facts(record: GPUNodeRecord) -> tuple[stragglers.Clocks | None, stragglers.Performance]:
    report_clocks = stragglers.clocks_of(record.status)
    return report_clocks, stragglers.performance_with(record.status, report_clocks)


_READINGS = itertools.count(1)
"""Readings of Node and GPUNode versions (`reading`): a new number is a version read anew."""
_DERIVATIONS: Mapping[str, Callable[[GPUNodeRecord], Any]] = {
    "conditions": _parsed_conditions,
    "fact_signals": lambda _: {},
    "memory": lambda r: trends.advance(
        None, r.status, r.report_seen_at or datetime.datetime.now(datetime.UTC)
    ),
    "straggler_facts": _straggler_facts,
    "at_rest": lambda r: clocks.facts_at_rest(r.status),
    "stale_limit": lambda r: clocks.stale_limit(r.status),
    "reading": lambda _: next(_READINGS),
}
"""How each derived value of a `GPUNodeRecord` is worked out, at its first reading."""


AGENT_FIELDS = ("agent", "summary", "gpus", "nics")
"""The GPUNode status fields the agent writes (`gpuhealth_api.status`); the rest are ours."""
_MOVING_SAMPLES: Mapping[str, str | None] = {
    "agent": "lastHeartbeatTime",
    "summary": "maxTemperatureCelsius",
    "gpus": None,
    "nics": None,
}
"""`reads_like`: the agent's fields and the one key of each that moves with every report and that no
verdict reads (None: the field is compared by `signals.still_healthy`, which judged it)."""


def _without(value: object, key: str) -> object:
    return {k: v for k, v in value.items() if k != key} if isinstance(value, dict) else value


_AT_REST_READS = ("health", "action")
"""What `clocks.facts_at_rest` reads besides the conditions."""
_FROM_REPORT = ("fact_signals", "straggler_facts", "memory")
"""GPUNodeRecord's derived values that read the agent's report alone (AGENT_FIELDS)."""


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _ours(annotations: object) -> Mapping[str, str]:
    """The annotations under our prefix: the only ones any decision reads."""
    if not isinstance(annotations, Mapping):
        return _NO_ANNOTATIONS
    ours = {str(k): str(v) for k, v in annotations.items() if str(k).startswith(keys.PREFIX)}
    return ours or _NO_ANNOTATIONS


_NO_ANNOTATIONS: Mapping[str, str] = types.MappingProxyType({})
"""Most GPUNodes carry none of ours: one empty mapping for them all (records are read-only)."""


_NO_KEYS: frozenset[str] = frozenset()


def node_record(body: Mapping[str, Any]) -> NodeRecord:
    """The Node as the decisions read it; label and condition strings shared across the fleet (`SHARED`)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    share = compaction.SHARED.value
    compaction.SHARED.check()
    taints = tuple(share(t) for t in spec.get("taints") or [] if isinstance(t, Mapping))
    capacity = (body.get("status") or {}).get("capacity") or {}
    condition = None
    others: dict[str, str] = {}
    written: dict[str, str] = {}
    for c in (body.get("status") or {}).get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("type") != keys.NODE_CONDITION_TYPE and isinstance(c.get("type"), str):
            others[sys.intern(c["type"])] = share(str(c.get("status", "")))
            stamps = [str(c[k]) for k in ("lastHeartbeatTime", "lastTransitionTime") if c.get(k)]
            if stamps:
                written[sys.intern(c["type"])] = max(stamps)  # RFC 3339 UTC: in order as strings
        if c.get("type") == keys.NODE_CONDITION_TYPE:
            condition = NodeCondition(
                status=share(str(c.get("status", ""))),
                reason=share(str(c.get("reason", ""))),
                message=share(str(c.get("message", ""))),
                last_transition_time=share(str(c.get("lastTransitionTime", ""))),
            )
    view = model.NodeView(
        name=str(meta.get("name", "")),
        labels={sys.intern(str(k)): share(v) for k, v in (meta.get("labels") or {}).items()},
        annotations={k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)},
        unschedulable=bool(spec.get("unschedulable", False)),
        taint_keys=frozenset(str(t.get("key", "")) for t in taints) if taints else _NO_KEYS,
        gpu_capacity=_int_or_none(capacity.get(keys.GPU_RESOURCE)),
        conditions=compaction.SHARED.mapping(
            others
        ),  # most nodes hold the same few conditions alike: one copy
    )
    return NodeRecord(
        view=view,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        taints=taints,
        condition=condition,
        cordon_taken_over=view.unschedulable and overrides.cordon_taken_over(meta),
        created=str(meta.get("creationTimestamp") or ""),
        condition_written=written,
    )


_SHARED_STATUS = ("summary", "health", "issues", "action")
"""Status fields besides `gpus` whose values repeat across nodes. Not `conditions`, `agent`, `straggler`:
every node has its own times and scores there, so sharing them would only cost a table entry."""


def _condition(raw: object) -> object:
    """A status condition as kept (`kept_conditions`): its strings shared, and the whole condition where
    another node holds the same one (nodes first judged in the same second)."""
    if type(raw) is not dict:
        return raw
    shared = compaction.SHARED.each(raw)
    condition = kept_conditions.kept(shared, compaction.SHARED.share)
    return compaction.SHARED.mapping(shared) if condition is shared else compaction.SHARED.share(condition)


def _conditions(raw: object, older: GPUNodeRecord | None) -> object:
    """`status.conditions` as kept: the older version's list when equal (an agent's report leaves the
    operator's conditions as they were), otherwise each condition shared (`_condition`). Fifteen
    conditions decoded afresh from every watch event were a third of the memory a node cost."""
    if not isinstance(raw, list):
        return raw
    if older is not None:
        kept = older.status.get("conditions")
        if kept is raw or (isinstance(kept, list) and kept_conditions.same(kept, raw)):
            return kept
    return [_condition(c) for c in raw]


def gpunode_record(
    body: Mapping[str, Any],
    report_seen_at: datetime.datetime | None = None,
    older: GPUNodeRecord | None = None,
) -> GPUNodeRecord:
    """The GPUNode as the decisions read it. `older`: the version stored before, whose equal parts the
    new one holds instead of its own copies."""
    meta = body.get("metadata") or {}
    raw_status: status.GPUNodeStatus = dict(body.get("status") or {})  # type: ignore[assignment]
    gpus = raw_status.get("gpus")
    compaction.SHARED.check()
    if isinstance(gpus, list):
        raw_status["gpus"] = [compaction.compact_gpu(g) if isinstance(g, Mapping) else g for g in gpus]  # type: ignore[misc]
    if "conditions" in raw_status:
        raw_status["conditions"] = _conditions(raw_status["conditions"], older)  # type: ignore[typeddict-item]
    agent = raw_status.get("agent")
    if type(agent) is dict:  # its own heartbeat time in every report: only its values are shared
        raw_status["agent"] = compaction.SHARED.each(agent)  # type: ignore[typeddict-item]
    for key in _SHARED_STATUS:
        if key in raw_status:
            raw_status[key] = compaction.SHARED.value(raw_status[key])  # type: ignore[literal-required]
    return GPUNodeRecord(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        status=raw_status,
        created=meta.get("creationTimestamp"),
        report_seen_at=report_seen_at,
        annotations=_ours(meta.get("annotations")),
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
        self.links = link_cohorts.LinkCohorts()
        """The NVLinks up per GPU cohort over every stored GPUNode: what a GPU's links should be."""
        """GPUNodes whose status lists isolated GPUs (`isolation_sweep.sweep` asks each pass if any does)."""
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
        record = node_record(body)
        old = self._nodes.get(record.view.name)
        if old is None or _newer(old.resource_version, record.resource_version):
            if record.view.name not in self._nodes:
                self._placed += 1
                self._node_order[record.view.name] = self._placed
            if old is not None and record.reads_like(old):
                record.__dict__["reading"] = old.reading
            self._nodes[record.view.name] = record
            self._select(record.view.name)
            self._mark(record.view)
            self.due.touch(record.view.name)
            if old is None or _marks(old.view) != _marks(record.view):
                self.marks += 1
            return record
        return old

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
        old = self._gpunodes.get(str((body.get("metadata") or {}).get("name", "")))
        record = gpunode_record(body, older=old)
        if old is None or _newer(old.resource_version, record.resource_version):
            if old is None or old.report_seen_at is None:
                seen = first_sighting(record.status, now)
            elif last_heartbeat(old.status) != last_heartbeat(record.status):
                seen = now
            else:
                seen = old.report_seen_at
            record = dataclasses.replace(record, report_seen_at=seen)
            if old is not None:
                if record.same_report(old):
                    record.inherit(old)  # the answer to our own status write: nothing to judge again
                else:
                    record.hold("memory", trends.advance(old.memory, record.status, now))
                    record.inherit_healthy_signals(old)  # judged with the memory up to this report
                record.inherit_conditions(old)
                if record.reads_like(old):
                    record.hold("reading", old.reading)
            if record.name not in self._gpunodes:
                self._placed += 1
                self._order[record.name] = self._placed
            self._gpunodes[record.name] = record
            self.links.replace(old.status.get("gpus") if old else None, record.status.get("gpus"))
            if old is None:  # an agent appeared: its node now counts in the budgets that select it
                self._select(record.name)
            self.due.touch(record.name)
            self.due.expect(record.name, stale_deadline(record))
            if old is None or _gpunode_marks(old.status) != _gpunode_marks(record.status):
                self.marks += 1
            if record.status.get("isolatedGPUs"):
                self._listing_isolated.add(record.name)
            else:
                self._listing_isolated.discard(record.name)
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
            self._select(name)
            self._order.pop(name, None)
            self.due.touch(name)
            self.due.expect(name, None)
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
