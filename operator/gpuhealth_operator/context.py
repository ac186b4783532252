"""The operator's runtime context: passed to every kopf handler as the memo.

It holds the clients, settings, the cluster cache and the bookkeeping that
must be shared between concurrent handlers: per-node and per-policy locks,
cordons in flight (decided, not yet visible in the cache), running drains and
the latest verdicts. Nothing here survives a restart, and nothing needs to:
the cluster holds the state that matters (DESIGN.md, safety rule 6).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterator, MutableMapping

from gpuhealth_api import vocabulary
from gpuhealth_operator import cache, kube, metrics, settings
from gpuhealth_operator.actions import drain, events
from gpuhealth_operator.decisions import budget, model, verdicts


class Verdicts(MutableMapping[tuple[str, str], model.NodeVerdict]):
    """(policy, node) → the latest verdict, indexed by the nodes each policy wants to cordon or drain.

    The index (`wanting`) is what the budget ranks waiting nodes by; keeping it
    here, as verdicts are stored, spares every admission a pass over all verdicts.
    """

    def __init__(self) -> None:
        self._all: dict[tuple[str, str], model.NodeVerdict] = {}
        self.wanting: collections.defaultdict[str, dict[str, budget.Rank]] = collections.defaultdict(dict)
        """policy → node → rank, for verdicts whose wanted action is Cordon or Drain."""

    def __getitem__(self, key: tuple[str, str]) -> model.NodeVerdict:
        return self._all[key]

    def __setitem__(self, key: tuple[str, str], verdict: model.NodeVerdict) -> None:
        self._all[key] = verdict
        policy, node = key
        if verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS:
            self.wanting[policy][node] = (verdicts.budget_rank(verdict), verdict.detected_at)
        else:
            self.wanting[policy].pop(node, None)

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._all[key]
        self.wanting[key[0]].pop(key[1], None)

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

    policy_locks: collections.defaultdict[str, asyncio.Lock] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(asyncio.Lock)
    )
    """Serialise budget decisions of one policy, so concurrent cordons never exceed maxUnavailable."""

    in_flight: collections.defaultdict[str, set[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(set)
    )
    """policy → nodes admitted by the budget whose cordon is not yet in the cache."""

    verdicts: Verdicts = dataclasses.field(default_factory=Verdicts)
    """(policy, node) → the latest verdict; the budget ranks every waiting node from these."""

    stragglers: dict[tuple[str, str], model.StragglerScore] = dataclasses.field(default_factory=dict)
    """(policy, node) → straggler score from the latest cohort pass."""

    drains: dict[str, asyncio.Task[drain.Result]] = dataclasses.field(default_factory=dict)
    """node → the drain running in this process."""

    drain_results: dict[str, drain.Result] = dataclasses.field(default_factory=dict)
    """node → how its last drain in this process ended (cleared on uncordon)."""

    budget_notified: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(policy, node) already told DisruptionBudgetExceeded while it waits."""

    dry_run_said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the last DryRun message, so it is said once per change."""

    policy_status_written: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)

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
