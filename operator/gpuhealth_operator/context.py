"""The operator's runtime context: passed to every kopf handler as the memo.

It holds the clients, settings, the cluster cache and the bookkeeping that
must be shared between concurrent handlers: per-node locks, the budget's
admissions (`admission`), running drains and the latest verdicts. Nothing
here survives a restart, and nothing needs to: the cluster holds the state
that matters (DESIGN.md, safety rule 6).

Every per-node and per-policy map is emptied of a node or a policy by
`forget_node` and `forget_policy` only; a map added here must be added there
(tests/unit/operator/test_forget.py fails otherwise). Collections are changed
in place, never rebound: kopf hands each handler a shallow copy of the memo.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterator, MutableMapping
from typing import Any

from gpuhealth_api import vocabulary
from gpuhealth_operator import admission, cache, kube, metrics, settings
from gpuhealth_operator.actions import drain, events
from gpuhealth_operator.decisions import budget, model, verdicts

POLICY, NODE = 0, 1
"""Positions in a (policy, node) key."""


def _drop(mapping: MutableMapping[tuple[str, str], Any], name: str, position: int) -> None:
    """Delete, in place, every (policy, node) key whose part at `position` is `name`."""
    for key in [k for k in mapping if k[position] == name]:
        del mapping[key]


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

    def __getitem__(self, key: tuple[str, str]) -> model.NodeVerdict:
        return self._all[key]

    def __setitem__(self, key: tuple[str, str], verdict: model.NodeVerdict) -> None:
        self._all[key] = verdict
        self._inputs.pop(key, None)
        policy, node = key
        if verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS:
            self.wanting[policy][node] = (verdicts.budget_rank(verdict), verdict.detected_at)
        else:
            self.wanting[policy].pop(node, None)

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._all[key]
        self._inputs.pop(key, None)
        self.wanting[key[0]].pop(key[1], None)

    def remember(self, key: tuple[str, str], verdict: model.NodeVerdict, inputs: tuple[object, ...]) -> None:
        """Store a verdict with what it was judged from, so the same inputs are not judged twice."""
        self[key] = verdict
        self._inputs[key] = inputs

    def judged_from(self, key: tuple[str, str], inputs: tuple[object, ...]) -> model.NodeVerdict | None:
        """The stored verdict if it was judged from exactly these inputs (the same objects), else None."""
        known = self._inputs.get(key)
        if (
            known is None
            or len(known) != len(inputs)
            or any(a is not b for a, b in zip(known, inputs, strict=True))
        ):
            return None
        return self._all.get(key)

    def forget_node(self, name: str) -> None:
        _drop(self, name, NODE)

    def forget_policy(self, name: str) -> None:
        _drop(self, name, POLICY)
        self.wanting.pop(name, None)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)


@dataclasses.dataclass
class Context:
    config: settings.Settings
    client: kube.Kube
    meters: metrics.Metrics
    recorder: events.Recorder
    cache: cache.ClusterCache = dataclasses.field(default_factory=cache.ClusterCache)

    node_locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """Serialise reconciles of one node (watch handlers and the timer may race)."""

    admission: admission.Admission = dataclasses.field(default_factory=admission.Admission)
    """The budget's locks, in-flight cordons and waiting nodes."""

    verdicts: Verdicts = dataclasses.field(default_factory=Verdicts)
    """(policy, node) → the latest verdict; the budget ranks every waiting node from these."""

    stragglers: dict[tuple[str, str], model.StragglerScore] = dataclasses.field(default_factory=dict)
    """(policy, node) → straggler score from the latest cohort pass."""

    drains: dict[str, asyncio.Task[drain.Result]] = dataclasses.field(default_factory=dict)
    """node → the drain running in this process."""

    drain_results: dict[str, drain.Result] = dataclasses.field(default_factory=dict)
    """node → how its last drain in this process ended (cleared whenever the node is schedulable)."""

    drain_checked: dict[str, float] = dataclasses.field(default_factory=dict)
    """node → when (monotonic) its pods were last looked at while Drained, so new ones are drained too."""

    drain_policies: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the policy whose drain runs (or ran) there: what `stopping` asks whether to stop it."""

    announced_cordons: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the identity (`cordoned-at`) of its cordon this process saw announced: said once."""

    dry_run_said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last DryRun message, so it is said once per change."""

    policy_status_written: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    """policy → the status last written, so an unchanged status is not written again."""

    eviction_slots: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(16))
    """Evictions in flight across all drains (sized from settings by `create`)."""

    @classmethod
    def create(
        cls, config: settings.Settings, client: kube.Kube, meters: metrics.Metrics, instance: str
    ) -> Context:
        return cls(
            config=config,
            client=client,
            meters=meters,
            recorder=events.Recorder(client=client, instance=instance),
            eviction_slots=asyncio.Semaphore(config.eviction_concurrency),
        )

    def forget_verdicts(self, name: str) -> None:
        """No policy selects the node any more: forget what policies said about it.

        The node's own memory (its lock, a running drain and its result) stays:
        the node still exists and a drain of it still runs.
        """
        self.verdicts.forget_node(name)
        _drop(self.stragglers, name, NODE)
        _drop(self.dry_run_said, name, NODE)
        self.admission.forget_node(name)

    def forget_node(self, name: str) -> None:
        """The node (its Node or GPUNode) is gone: nothing in memory refers to it any more.

        A drain of it is cancelled (there is nothing left to drain). Its lock is
        kept only while a reconcile still holds it; that reconcile finds the
        node gone from the cache and stops.
        """
        self.forget_verdicts(name)
        task = self.drains.pop(name, None)
        if task is not None:
            task.cancel()
        self.drain_results.pop(name, None)
        self.drain_checked.pop(name, None)
        self.drain_policies.pop(name, None)
        self.announced_cordons.pop(name, None)
        lock = self.node_locks.get(name)
        if lock is not None and not lock.locked():
            del self.node_locks[name]

    def forget_policy(self, name: str) -> None:
        """The policy is gone: forget its verdicts, budget, Events said and status written."""
        self.verdicts.forget_policy(name)
        _drop(self.stragglers, name, POLICY)
        _drop(self.dry_run_said, name, POLICY)
        self.admission.forget_policy(name)
        self.policy_status_written.pop(name, None)
        self.meters.forget_policy(name)
        for node in [n for n, policy in self.drain_policies.items() if policy == name]:
            del self.drain_policies[node]  # its drains were stopped (`stopping.stop_drains`)
