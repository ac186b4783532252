"""The operator's runtime context: passed to every kopf handler as the memo.

It holds the clients, settings, the cluster cache and the bookkeeping that
must be shared between concurrent handlers: per-node locks, the budget's
admissions (`admission`), the breakers and the latest verdicts; judging's
memory (`judging`, `state/judged.py`) and each ladder step's (`steps`,
`ladder/memories.py`: one class per step, in the step's package). Nothing
here survives a restart, and nothing needs to: the cluster holds the state
that matters (DESIGN.md, safety rule 6).

Every per-node and per-policy map is emptied of a node or a policy by
`forget_node` and `forget_policy` only, which reach every memory through its
own `forget_*` (tests/unit/operator/shared/test_forget.py walks them all). Collections are changed
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
from collections.abc import Callable, Iterator, MutableMapping

from gpuhealth_api import vocabulary
from gpuhealth_operator.client import drain, events, kube
from gpuhealth_operator.decisions import breaker, budget, model, severity, verdicts
from gpuhealth_operator.ladder import memories
from gpuhealth_operator.shared import metrics, settings
from gpuhealth_operator.state import admission, agent_pods, breakers, cache, judged, pass_queue


def wall_clock() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


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
        policy, node = key
        if verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS:
            self.wanting[policy][node] = (severity.budget_rank(verdict), verdict.detected_at)
        else:
            self.wanting[policy].pop(node, None)
        turned = breaker.turned_unhealthy(verdict)
        if turned is not None:
            self.turned_unhealthy[policy][node] = turned

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._all[key]
        self.changes += 1
        self.forgotten(key[1])
        self.wanting[key[0]].pop(key[1], None)
        self.turned_unhealthy[key[0]].pop(key[1], None)

    def forget_node(self, name: str) -> None:
        judged.drop(self, name, judged.NODE)

    def forget_policy(self, name: str) -> None:
        judged.drop(self, name, judged.POLICY)
        self.wanting.pop(name, None)
        self.turned_unhealthy.pop(name, None)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)


_ClusterCache = cache.ClusterCache
"""The cache's class under a name the `Context.cache` field does not shadow (in `create`)."""


@dataclasses.dataclass(eq=False)
class StatusMemory:
    """What the policies' status was last written as and counted from (`ticker.update_policy_statuses`)."""

    written: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    """policy → the status last written, so an unchanged status is not written again."""

    marks: tuple[object, ...] = ()
    """`ticker._status_marks` when the policies' status was last counted (a snapshot, no memory of a
    node or a policy)."""

    gpus_marks: tuple[object, ...] = ()
    """`ticker._status_marks` when every policy's GPUs were last counted (a refresh carries the gauges
    forward while they are the same)."""

    def forget_policy(self, name: str) -> None:
        self.written.pop(name, None)


@dataclasses.dataclass
class Context:
    """What every layer above passes around (issue 46: at most 15 fields). A step's own memory is
    its package's (`ladder/memories.py`, held as `steps`), judging's is `judging`."""

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

    breakers: breakers.Breakers = dataclasses.field(default_factory=breakers.Breakers)
    """policy → its fleet circuit breaker; admission asks it (the same object) under its lock."""

    verdicts: Verdicts = dataclasses.field(default_factory=Verdicts)
    """(policy, node) → the latest verdict; the budget ranks every waiting node from these."""

    judging: judged.JudgingMemory = dataclasses.field(default_factory=judged.JudgingMemory)
    """Judging's memory: straggler scores, their windows and cohorts, what passes at rest judged."""

    steps: memories.Memories = dataclasses.field(default_factory=memories.Memories)
    """Each ladder step's memory (`ctx.steps.isolate`, `.repair`, ...), and the views between them."""

    status: StatusMemory = dataclasses.field(default_factory=StatusMemory)
    """The policies' status as last written, and what it was counted from (`marks`)."""

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
            steps=memories.Memories.create(config.eviction_concurrency),
        )

    def count_drills(self) -> None:
        """Set the `drill_nodes` gauge from the drills' judged health: per policy, nodes by health."""
        for (policy, health), count in self.steps.drill.counts(self.cache.policies).items():
            self.meters.drill_nodes.labels(policy, health).set(count)

    def forget_verdicts(self, name: str) -> None:
        """No policy selects the node any more: forget what policies said about it.

        The node's own memory (its lock, a running drain and its result) stays:
        the node still exists and a drain of it still runs.
        """
        self.verdicts.forget_node(name)
        self.judging.forget_verdicts(name)
        self.steps.forget_verdicts(name)
        self.count_drills()
        self.admission.forget_node(name)
        self.breakers.forget_node(name)

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
        self.judging.forget_node(name)
        self.steps.forget_node(name)
        lock = self.node_locks.get(name)
        if lock is not None and not lock.locked():
            del self.node_locks[name]

    def forget_policy(self, name: str) -> None:
        """The policy is gone: forget its verdicts, budget, Events said and status written."""
        self.verdicts.forget_policy(name)
        self.judging.forget_policy(name)
        self.steps.forget_policy(name)
        self.admission.forget_policy(name)
        self.breakers.forget_policy(name)
        self.status.forget_policy(name)
        self.meters.forget_policy(name)
