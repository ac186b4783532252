"""The operator's runtime context: passed to every kopf handler as the memo.

It holds the clients, settings, the cluster cache and the bookkeeping that
must be shared between concurrent handlers: per-node locks, the budget's
admissions (`admission`), running drains and the latest verdicts. Nothing
here survives a restart, and nothing needs to: the cluster holds the state
that matters (DESIGN.md, safety rule 6).

Every per-node and per-policy map is emptied of a node or a policy by
`forget_node` and `forget_policy` only; a map added here must be added there
(tests/unit/operator/shared/test_forget.py fails otherwise). Collections are changed
in place, never rebound. kopf keeps a shallow copy of the memo for every
object it watches (`copy.copy`: ~0.4 KiB per Node, GPUNode and pod);
`Context.__copy__` returns the one context instead, which is all any handler
needs.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator.client import drain, drains, events, kube
from gpuhealth_operator.decisions import (
    breaker,
    budget,
    device_taints,
    isolation,
    model,
    repair,
    stragglers,
    verdicts,
)
from gpuhealth_operator.shared import metrics, settings
from gpuhealth_operator.state import (
    admission,
    agent_pods,
    breakers,
    cache,
    check_memory,
    cohorts,
    domain_states,
    pass_queue,
    recent,
)

POLICY, NODE = 0, 1
"""Positions in a (policy, node) key."""


StragglerSamples = stragglers.Samples


@dataclasses.dataclass(frozen=True, slots=True)
class Rest:
    """What a pass that ended at rest judged a node from (`resting`)."""

    node: int
    """The Node version's `reading` (`cache.NodeRecord.reads_like`: a kubelet's heartbeat keeps it)."""
    reading: int
    """The GPUNode version's `reading` (`cache.GPUNodeRecord.reads_like`)."""
    judged: tuple[tuple[model.Policy, object, object], ...]
    """Each selecting policy, in name order, with the node's straggler score under it and its agent pod."""
    repairs: object
    """The node's repair history in memory (`repair_history`: replaced, never changed in place)."""
    links: tuple[int | None, ...] = ()
    """The links up its GPUs' cohorts expected (`trends.Trends.expectations`): other nodes move them."""


def wall_clock() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _drop(mapping: MutableMapping[tuple[str, str], Any], name: str, position: int) -> None:
    """Delete, in place, every (policy, node) key whose part at `position` is `name`."""
    for key in [k for k in mapping if k[position] == name]:
        del mapping[key]


def _weakly(value: object) -> object:
    """A weak reference to `value` where it takes one (records, policies); else `value` itself."""
    try:
        return weakref.ref(value)
    except TypeError:  # str, datetime, None, tuples: small, or not worth a reference
        return value


def _strongly(value: object) -> object:
    """The object `_weakly` kept (None once a referenced object is gone: never an input's identity)."""
    return value() if isinstance(value, weakref.ref) else value


def _counted(verdict: model.NodeVerdict) -> tuple[object, ...]:
    """What the policy status and the GPU gauges count of a verdict (`ticker.policy_status`)."""
    unknown = verdicts.unknown_reason(verdict) if verdict.health is vocabulary.Health.UNKNOWN else None
    return (verdict.health, unknown, verdict.wanted_action, verdict.wanted_taint)


class Verdicts(MutableMapping[tuple[str, str], model.NodeVerdict]):
    """(policy, node) → the latest verdict, indexed by the nodes each policy wants to cordon or drain.

    The index (`wanting`) is what the budget ranks waiting nodes by; keeping it
    here, as verdicts are stored, spares every admission a pass over all verdicts.
    """

    def __init__(self) -> None:
        self._all: dict[tuple[str, str], model.NodeVerdict] = {}
        self._inputs: dict[tuple[str, str], tuple[object, ...]] = {}
        self.wanting: collections.defaultdict[str, dict[str, budget.Rank]] = collections.defaultdict(dict)
        """policy → node → rank, for verdicts whose wanted action is Cordon or Drain."""
        self.turned_unhealthy: collections.defaultdict[str, dict[str, datetime.datetime]] = (
            collections.defaultdict(dict)
        )
        """policy → node → when it turned Unhealthy, kept after it recovers (the breaker prunes old ones)."""
        self.forgotten: Callable[[str], None] = lambda name: None
        """Told the node whose verdict was deleted: the timer must look at it again (`decisions.due`)."""
        self.changes = 0
        """Counts verdicts stored with another health, Unknown reason, wanted action or wanted taint:
        what a policy's status and GPU gauges count of a verdict (`ticker`: recounted when it moved)."""

    def __getitem__(self, key: tuple[str, str]) -> model.NodeVerdict:
        return self._all[key]

    def __setitem__(self, key: tuple[str, str], verdict: model.NodeVerdict) -> None:
        old = self._all.get(key)
        if old is None or _counted(old) != _counted(verdict):
            self.changes += 1
        self._all[key] = verdict
        self._inputs.pop(key, None)
        policy, node = key
        if verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS:
            self.wanting[policy][node] = (verdicts.budget_rank(verdict), verdict.detected_at)
        else:
            self.wanting[policy].pop(node, None)
        turned = breaker.turned_unhealthy(verdict)
        if turned is not None:
            self.turned_unhealthy[policy][node] = turned

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._all[key]
        self.changes += 1
        self.forgotten(key[1])
        self._inputs.pop(key, None)
        self.wanting[key[0]].pop(key[1], None)
        self.turned_unhealthy[key[0]].pop(key[1], None)

    def remember(self, key: tuple[str, str], verdict: model.NodeVerdict, inputs: tuple[object, ...]) -> None:
        """Store a verdict with what it was judged from, so the same inputs are not judged twice.

        The inputs are held by weak reference where they can be: a GPUNode version the cache has
        already replaced can only fail the identity test, and holding it would keep a second copy
        of every node's facts in memory (issue 14).
        """
        self[key] = verdict
        self._inputs[key] = tuple(_weakly(i) for i in inputs)

    def judged_from(self, key: tuple[str, str], inputs: tuple[object, ...]) -> model.NodeVerdict | None:
        """The stored verdict if it was judged from exactly these inputs (the same objects), else None."""
        known = self._inputs.get(key)
        if (
            known is None
            or len(known) != len(inputs)
            or any(_strongly(a) is not b for a, b in zip(known, inputs, strict=True))
        ):
            return None
        return self._all.get(key)

    def forget_node(self, name: str) -> None:
        _drop(self, name, NODE)

    def forget_policy(self, name: str) -> None:
        _drop(self, name, POLICY)
        self.wanting.pop(name, None)
        self.turned_unhealthy.pop(name, None)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)


_Drains = drains.Drains
"""The drains' owner under a name the `Context.drains` field does not shadow."""

_ClusterCache = cache.ClusterCache
"""The cache's class under a name the `Context.cache` field does not shadow (in `create`)."""


@dataclasses.dataclass
class Context:
    config: settings.Settings
    client: kube.Client
    meters: metrics.Metrics
    recorder: events.Recorder
    cache: cache.ClusterCache = dataclasses.field(default_factory=cache.ClusterCache)
    clock: Callable[[], datetime.datetime] = wall_clock
    """What time it is: the wall clock, or the backtest's simulated clock."""
    agent_pods: agent_pods.AgentPods = dataclasses.field(default_factory=agent_pods.AgentPods)
    """The agents' pods as watched (`--agent-pod-selector`): liveness per node, like the cache a view of
    the cluster; a deleted Node's record goes with `on_node`, not with `forget_node`."""

    node_locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """Serialise reconciles of one node (watch handlers and the timer may race)."""

    passes: pass_queue.PassQueue = dataclasses.field(default_factory=pass_queue.PassQueue)
    """The node passes watch events asked for, waiting to run (`passes`)."""

    admission: admission.Admission = dataclasses.field(default_factory=admission.Admission)
    """The budget's locks, in-flight cordons and waiting nodes."""

    verdicts: Verdicts = dataclasses.field(default_factory=Verdicts)
    """(policy, node) → the latest verdict; the budget ranks every waiting node from these."""

    stragglers: dict[tuple[str, str], model.StragglerScore] = dataclasses.field(default_factory=dict)
    """(policy, node) → straggler score from the latest cohort pass."""

    straggler_samples: collections.defaultdict[tuple[str, str], StragglerSamples] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(stragglers.Samples)
    )
    """(policy, node) → its recent z-scores, the window a sustained Straggler is judged on."""

    straggler_cohorts: cohorts.Cohorts = dataclasses.field(default_factory=cohorts.Cohorts)
    """The straggler cohorts as the last tick left them: a tick works on the members that changed."""

    resting: dict[str, Rest] = dataclasses.field(default_factory=dict)
    """node → what the last pass over it judged it from, if that pass left it at rest (`resting`)."""

    cordons_unknown: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the resourceVersion its cordon was computed from, while that cordon's answer was lost
    (a 504, a timeout): it may have landed, so the node stays in flight in the budget (`admission`)
    until the cache holds a newer version (`remediation`)."""

    drains: _Drains = dataclasses.field(default_factory=_Drains)
    """The drains running in this process and how each ended (`drains`: their one owner)."""

    announced_cordons: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the identity (`cordoned-at`) of its cordon this process saw announced: said once."""

    dry_run_said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last DryRun message, so it is said once per change."""

    drill_said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last Drill message (policy "": the drill's start, end), said once per change."""

    drill_health: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the health a running fire drill judged; the `drill_nodes` gauge counts these."""

    policy_status_written: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    """policy → the status last written, so an unchanged status is not written again."""

    status_marks: tuple[object, ...] = ()
    """`ticker._status_marks` when the policies' status was last counted."""

    gpus_counted_marks: tuple[object, ...] = ()
    """`ticker._status_marks` when every policy's GPUs were last counted (a refresh carries the gauges
    forward while they are the same)."""

    isolation_support: dict[str, isolation.Support] = dataclasses.field(default_factory=dict)
    """policy → whether the cluster acts on DeviceTaintRules, probed for its generation (`isolating`)."""

    isolations: dict[tuple[str, str], isolation.NodeState] = dataclasses.field(default_factory=dict)
    """(policy, node) → its GPUs' isolation: the last decision, the rules in place, the overrides."""

    rules_read: recent.Recent[tuple[str, str], list[kube.JsonObject]] = dataclasses.field(
        default_factory=recent.Recent
    )
    """(policy, DeviceTaintRule API version) → the policy's rules of nodes, as last listed (`isolating`)."""

    devices_read: recent.Recent[str, dict[str, device_taints.Device]] = dataclasses.field(
        default_factory=recent.Recent
    )
    """node → its DRA devices by GPU UUID, from its ResourceSlices as last listed (`isolating`)."""

    isolation_discovery: recent.Recent[str, isolation.Support] = dataclasses.field(
        default_factory=lambda: recent.Recent(300.0)
    )
    """What discovery alone says of DeviceTaintRules (a served version changes only with an API server
    restart), for dry runs, drills and deleted policies' rules: never a probe's answer (`isolating`)."""

    isolation_locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """policy → one isolating node at a time, so the GPU budget is counted before it is spent."""

    eviction_slots: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(16))
    """Evictions in flight across all drains (sized from settings by `create`)."""

    breakers: breakers.Breakers = dataclasses.field(default_factory=breakers.Breakers)
    """policy → its fleet circuit breaker; admission asks it (the same object) under its lock."""

    domains: domain_states.DomainStates = dataclasses.field(default_factory=domain_states.DomainStates)
    """policy → its degraded topology domains, and what they last counted of each node (`domain_actions`)."""

    repair_history: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """node → its GPUNode `status.repairs[]` as this process last made it (`repairing`), written with
    the node's next status; absent: the status as stored is the history."""

    repair_finished_seen: dict[str, tuple[str, datetime.datetime]] = dataclasses.field(default_factory=dict)
    """node → (its repair Job, when this process first saw that Job finished, its own clock): a step's
    effect is judged from reports first seen after it (`repair.observe_step`), never from the Job's
    completionTime (another machine's clock). Lost on a restart: the new process's sighting counts."""

    validations_running: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose new-node validation Job this process created or saw (`new_nodes`): they hold places
    of repair maxConcurrent with the repairs (`reading.holders`). Kept when a Node is forgotten: a
    deleted node's Job is still to be deleted."""

    repair_tokens: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """node → (SHA-256, token) of the repair Job token this process made last (`repairing`): the Node holds
    only the hash; a restarted process makes a new token before it creates a Job."""
    new_nodes_in_service: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the Node UID it had when first seen new but already busy (`new_nodes`): in service, not new.
    Another UID under the name (a Node deleted and created again) is a node of its own."""

    new_nodes_said: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the Node UID whose dry-run "would validate new node" Event was posted (once per node life)."""

    repair_busy_said: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose repair waits for workload pods to go and said so (`repairing._say_busy`, once per wait)."""

    repair_waiting: set[str] = dataclasses.field(default_factory=set)
    """Nodes whose repair waits for maxConcurrent and said so (once per wait; only the policy that
    cordoned a node repairs it, so one wait per node). A wait said by an earlier process is read from
    the node's stored status (`reading.say_waiting`)."""

    repair_refused: dict[str, repair.Refused] = dataclasses.field(default_factory=dict)
    """policy → its last repair Job create the Job API refused (`repair_permission`)."""

    repair_permitted: set[str] = dataclasses.field(default_factory=set)
    """Policies whose repair Job was created since this process began (`repair_permission`)."""

    gone_nodes: set[str] = dataclasses.field(default_factory=set)
    """Nodes deleted since the timer's last tick: their step Jobs are deleted on it (`orphan_jobs`).
    Kept when a Node is forgotten: that is when it is added."""

    repair_templates: recent.Recent[str, dict[str, dict[str, Any]]] = dataclasses.field(
        default_factory=lambda: recent.Recent(30.0)
    )
    """The repair Job templates as last read (one key: the ConfigMap, or the packaged file)."""

    checks: check_memory.CheckMemory = dataclasses.field(default_factory=check_memory.CheckMemory)
    """The active-check step's memory (`ladder.check`): histories made, idleness seen, Events said."""

    def __post_init__(self) -> None:
        self.admission.breakers = self.breakers
        self.admission.turned = self.verdicts.turned_unhealthy
        self.verdicts.forgotten = self.cache.due.touch

    def __copy__(self) -> Context:
        """The context itself: kopf's per-object copy of its memo would only cost memory per object."""
        return self

    @classmethod
    def create(
        cls,
        config: settings.Settings,
        client: kube.Client,
        meters: metrics.Metrics,
        instance: str,
        cluster: _ClusterCache | None = None,
    ) -> Context:
        """A term's context; `cluster` is the cache an earlier term of this process kept, if any."""
        return cls(
            config=config,
            client=client,
            meters=meters,
            cache=cluster if cluster is not None else cache.ClusterCache(),
            recorder=events.Recorder(client=client, instance=instance),
            eviction_slots=asyncio.Semaphore(config.eviction_concurrency),
        )

    def count_drills(self) -> None:
        """Set the `drill_nodes` gauge from `drill_health`: per policy, the drilled nodes by judged health."""
        counts = collections.Counter((policy, health) for (policy, _), health in self.drill_health.items())
        for policy in {p for p, _ in self.drill_health} | set(self.cache.policies):
            for health in vocabulary.Health:
                self.meters.drill_nodes.labels(policy, health.value).set(counts[(policy, health.value)])

    def forget_verdicts(self, name: str) -> None:
        """No policy selects the node any more: forget what policies said about it.

        The node's own memory (its lock, a running drain and its result) stays:
        the node still exists and a drain of it still runs.
        """
        self.verdicts.forget_node(name)
        self.resting.pop(name, None)
        _drop(self.stragglers, name, NODE)
        _drop(self.straggler_samples, name, NODE)
        _drop(self.dry_run_said, name, NODE)
        _drop(self.drill_said, name, NODE)
        _drop(self.drill_health, name, NODE)
        self.count_drills()
        _drop(self.isolations, name, NODE)
        self.devices_read.drop(name)
        self.admission.forget_node(name)
        self.cordons_unknown.pop(name, None)  # its in-flight place went with `admission.forget_node`
        self.breakers.forget_node(name)
        self.domains.forget_node(name)

    def drain_options(self, policy: model.Policy) -> drain.Options:
        """How `policy` drains a node (and so which pods count as its evictable workload)."""
        return drain.Options(
            grace_period_seconds=policy.drain_grace_period_seconds,
            delete_empty_dir_data=policy.drain_delete_empty_dir_data,
            force=policy.drain_force,
            exclude_namespaces=policy.drain_exclude_namespaces,
            backoff_initial_seconds=self.config.eviction_backoff_initial_seconds,
            backoff_max_seconds=self.config.eviction_backoff_max_seconds,
        )

    def forget_node(self, name: str) -> None:
        """The node (its Node or GPUNode) is gone: nothing in memory refers to it any more.

        A drain of it is cancelled (there is nothing left to drain). Its lock is
        kept only while a reconcile still holds it; that reconcile finds the
        node gone from the cache and stops.
        """
        self.forget_verdicts(name)
        self.drains.forget_node(name)
        self.announced_cordons.pop(name, None)
        self.repair_history.pop(name, None)
        self.repair_finished_seen.pop(name, None)
        self.repair_waiting.discard(name)
        self.repair_tokens.pop(name, None)
        self.new_nodes_in_service.pop(name, None)
        self.new_nodes_said.pop(name, None)
        self.repair_busy_said.discard(name)
        self.checks.forget_node(name)
        lock = self.node_locks.get(name)
        if lock is not None and not lock.locked():
            del self.node_locks[name]

    def forget_policy(self, name: str) -> None:
        """The policy is gone: forget its verdicts, budget, Events said and status written."""
        self.verdicts.forget_policy(name)
        self.resting.clear()  # what passes judged under it: every node it selected is judged again
        _drop(self.stragglers, name, POLICY)
        _drop(self.straggler_samples, name, POLICY)
        _drop(self.dry_run_said, name, POLICY)
        _drop(self.drill_said, name, POLICY)
        _drop(self.drill_health, name, POLICY)
        _drop(self.isolations, name, POLICY)
        self.isolation_support.pop(name, None)
        self.rules_read.drop_where(lambda key: key[0] == name)
        lock = self.isolation_locks.get(name)
        if lock is not None and not lock.locked():
            del self.isolation_locks[name]
        self.admission.forget_policy(name)
        self.breakers.forget_policy(name)
        self.domains.forget_policy(name)
        self.policy_status_written.pop(name, None)
        self.repair_refused.pop(name, None)
        self.repair_permitted.discard(name)
        self.checks.forget_policy(name)
        self.meters.forget_policy(name)
        self.drains.forget_policy(name)
