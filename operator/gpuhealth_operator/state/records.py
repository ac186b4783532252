"""The records of a Node and a GPUNode as the cache keeps them: only what the decisions read, strings
and equal parts shared across the fleet (`compaction`), derived values worked out at their first reading.

Split from `cache` (issue 46: one concern a module); `cache` files these records and indexes them.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import sys
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuhealth_api import keys, status, vocabulary
from gpuhealth_operator.decisions import (
    clocks,
    healthy_reports,
    model,
    overrides,
    signals,
    straggler_scores,
    trends,
)
from gpuhealth_operator.state import compaction, kept_conditions


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
    straggler_facts: tuple[straggler_scores.Clocks | None, straggler_scores.Performance] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    """The report's clocks (`straggler_scores.clocks_of`) and its straggler cohort and score
    (`straggler_scores.performance_of`), worked out together once per version: the score and the
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
    def clocks(self) -> straggler_scores.Clocks | None:
        return self.straggler_facts[0]

    @property
    def performance(self) -> straggler_scores.Performance:
        return self.straggler_facts[1]

    def same_report(self, other: GPUNodeRecord) -> bool:
        """Whether both versions hold the same agent report (AGENT_FIELDS): ours differ, say."""
        return all(self.status.get(k) == other.status.get(k) for k in AGENT_FIELDS)

    def inherit(self, older: GPUNodeRecord) -> None:
        """Take over what was judged of `older`'s agent report, which this version holds too
        (`same_report`): fact signals, straggler performance and the stale limit (`clocks.stale_limit`,
        the agent block's) depend on nothing else."""
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
            and healthy_reports.still_healthy(
                judged, older.status, self.status, memory if memory is not UNSET else None
            )
        ):
            self.hold("fact_signals", dict(judged))  # its own: a key judged later is this version's

    def follow(self, older: GPUNodeRecord, now: datetime.datetime) -> None:
        """Take over what was worked out of `older`, the version stored before this one, and still holds:
        all it judged of the same report (`inherit`), else its memory advanced by this report (at
        `now`) and its healthy signals where they stay so; its parsed conditions; its `reading`."""
        if self.same_report(older):
            self.inherit(older)  # the answer to our own status write: nothing to judge again
        else:
            self.hold("memory", trends.advance(older.memory, self.status, now))
            self.inherit_healthy_signals(older)  # judged with the memory up to this report
        self.inherit_conditions(older)
        if self.reads_like(older):
            self.hold("reading", older.reading)

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
        if not _same_but_samples(new, old) or self.stale_limit is None or older.stale_limit is None:
            return False
        return all(
            _same_without(new.get(field), old.get(field), moving)
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
        # Subtracted here, not through `times.seconds_between`: every judgement and resting check asks it.
        return max(0.0, (now - self.report_seen_at).total_seconds())


def _straggler_facts(
    record: GPUNodeRecord,
) -> tuple[straggler_scores.Clocks | None, straggler_scores.Performance]:
    report_clocks = straggler_scores.clocks_of(record.status)
    return report_clocks, straggler_scores.performance_with(record.status, report_clocks)


_READINGS = itertools.count(1)
"""Readings of Node and GPUNode versions (`reading`): a new number is a version read anew."""
_DERIVATIONS: Mapping[str, Callable[[GPUNodeRecord], Any]] = {
    "conditions": lambda r: kept_conditions.parsed(r.status.get("conditions") or [], compaction.SHARED),
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


def _same_but_samples(new: Mapping[str, object], old: Mapping[str, object]) -> bool:
    """Whether two statuses hold equal values under every key but `_MOVING_SAMPLES`' (a key one lacks
    reads None, as `get` does). Identity first: most values are the older version's very objects (the
    operator's fields, kept by the cluster across an agent's report; a replay's conditions)."""
    for key, value in new.items():
        if key not in _MOVING_SAMPLES:
            held = old.get(key)
            if value is not held and value != held:
                return False
    return all(
        new.get(key) == value for key, value in old.items() if key not in new and key not in _MOVING_SAMPLES
    )


def _same_without(new: object, old: object, key: str) -> bool:
    """`_without(new, key) == _without(old, key)`, without building either: the agent block and the
    summary of every report, which differ in their moving sample alone."""
    if type(new) is not dict or type(old) is not dict:
        return _without(new, key) == _without(old, key)
    if len(new) - (key in new) != len(old) - (key in old):
        return False
    missing = _ABSENT_KEY
    for k, value in new.items():
        if k != key:
            held = old.get(k, missing)
            if value is not held and (held is missing or value != held):
                return False
    return True


_ABSENT_KEY: Any = object()


_AT_REST_READS = ("health", "action")
"""What `clocks.facts_at_rest` reads besides the conditions."""
_FROM_REPORT = ("fact_signals", "straggler_facts", "memory", "stale_limit")
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


def node_record(body: Mapping[str, Any], older: NodeRecord | None = None) -> NodeRecord:
    """The Node as the decisions read it; label and condition strings shared across the fleet (`SHARED`),
    all its lists of them in one call rather than one call per string or list (issue 46). `older`: the
    version stored before, whose `reading` this one takes over if it `reads_like` it."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    raw_taints = [t for t in spec.get("taints") or [] if isinstance(t, Mapping)]
    capacity = (body.get("status") or {}).get("capacity") or {}
    ours: list[str] = []
    others: dict[str, str] = {}
    written: dict[str, str] = {}
    for c in (body.get("status") or {}).get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("type") != keys.NODE_CONDITION_TYPE and isinstance(c.get("type"), str):
            others[sys.intern(c["type"])] = str(c.get("status", ""))  # a repeated type: the last counts
            stamps = [str(c[k]) for k in ("lastHeartbeatTime", "lastTransitionTime") if c.get(k)]
            if stamps:
                written[sys.intern(c["type"])] = max(stamps)  # RFC 3339 UTC: in order as strings
        if c.get("type") == keys.NODE_CONDITION_TYPE:  # the last one counts, as its record did
            ours = [str(c.get(k, "")) for k in ("status", "reason", "message", "lastTransitionTime")]
    labels = meta.get("labels") or {}
    # Taints, ours (four strings, if any), label values and the other tools' conditions: one call.
    (taints_list, strings, label_values), conditions = compaction.SHARED.batch(
        (raw_taints, ours, list(labels.values())), others
    )
    taints = tuple(taints_list)
    view = model.NodeView(
        name=str(meta.get("name", "")),
        labels=dict(zip([sys.intern(str(k)) for k in labels], label_values, strict=True)),
        annotations={k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)},
        unschedulable=bool(spec.get("unschedulable", False)),
        taint_keys=frozenset(str(t.get("key", "")) for t in taints) if taints else _NO_KEYS,
        gpu_capacity=_int_or_none(capacity.get(keys.GPU_RESOURCE)),
        conditions=conditions,  # most nodes hold the same few conditions alike: one copy
    )
    record = NodeRecord(
        view=view,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        taints=taints,
        condition=NodeCondition(*strings) if ours else None,
        cordon_taken_over=view.unschedulable and overrides.cordon_taken_over(meta),
        created=str(meta.get("creationTimestamp") or ""),
        condition_written=written,
    )
    if older is not None and record.reads_like(older):
        record.__dict__["reading"] = older.reading  # a version read as the one before: its number
    return record


def gpunode_record(
    body: Mapping[str, Any],
    report_seen_at: datetime.datetime | None = None,
    older: GPUNodeRecord | None = None,
    now: datetime.datetime | None = None,
) -> GPUNodeRecord:
    """The GPUNode as the decisions read it. `older`: the version stored before, whose equal parts the
    new one holds instead of its own copies; with `now` (the decision clock), what it worked out that
    still holds too (`follow`)."""
    meta = body.get("metadata") or {}
    raw_status: status.GPUNodeStatus = compaction.compact_status(body.get("status") or {})  # type: ignore[assignment]
    if "conditions" in raw_status:
        held = older.status.get("conditions") if older is not None else None
        raw_status["conditions"] = kept_conditions.kept_list(
            raw_status["conditions"], held, compaction.SHARED
        )  # type: ignore[typeddict-item]
    record = GPUNodeRecord(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        status=raw_status,
        created=meta.get("creationTimestamp"),
        report_seen_at=report_seen_at,
        annotations=_ours(meta.get("annotations")),
    )
    if older is not None and now is not None:
        record.follow(older, now)
    return record
