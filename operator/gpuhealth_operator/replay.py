"""The operator as a library for a replay: the one entry point of the simulator's backtest.

A replay (`gpuhealth_sim.backtest.replayer`) runs the live operator's own
code, not a copy of it: `Operator` is one term of the operator over any `kube.Client`
(the in-memory cluster, in a backtest) with the replay's clock instead of the
wall clock. The replay hands it the watch events kopf would have delivered
(Node, GPUNode, GPUHealthPolicy, agent Pod) and the active checks' runs a
recording saw end (`check_run`: a replay runs no check Jobs, so the check
step is off there), runs the timer's pass when its simulated clock says so,
and reads back what it reports on: which nodes a policy selects, the budget
it resolved, whether a node's agent pod is Ready. What the operator wrote, it
reads from its cluster client.

The simulator imports of the operator only this module, `kube`, `settings`
and the pure `decisions` (an import contract holds it to that), so the
handlers, the timer, the cache and the context can change shape without the
replay following them. The few names a replay needs from the operator's own
modules (an annotation it writes, the status fields it owns, how it knows an
agent pod, how it keeps a reported GPU) are re-exported here.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, cast

import kopf

from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.ladder.check import check_results
from gpuhealth_operator.ladder.isolate import isolating
from gpuhealth_operator.ladder.repair import reading
from gpuhealth_operator.runtime import handlers, passes, reconciler, ticker
from gpuhealth_operator.shared import context, metrics, settings
from gpuhealth_operator.state import agent_pods, cohort_members, compaction, pass_queue

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
"""A watch event's type, as kopf hands it to a handler."""
Clock = Callable[[], datetime.datetime]
"""What time it is for the operator: the replay's simulated clock."""

DRAIN_STARTED_ANNOTATION: Final = keys.DRAIN_STARTED_ANNOTATION
"""The Node annotation the operator sets when it starts a drain (and removes on uncordon)."""
OPERATOR_STATUS_FIELDS: Final = frozenset(
    {
        "health",
        "issues",
        "action",
        "conditions",
        "straggler",
        reconciler.POLICIES_FIELD,
        reading.STATUS_FIELD,
        "checks",  # the active checks' runs (`ladder.check.check_results.STATUS_FIELD`)
        *isolating.STATUS_FIELDS,
    }
)
"""The GPUNode status fields the operator writes (`reconciler.desired_status`), the agent's being the rest:
a cluster keeps them across an agent's report, as server-side apply keeps another manager's fields."""

StragglerObserver = cohort_members.Observer
"""Told (policy, node), a sample's time and the StragglerScore judged on it, for each sample a straggler
window takes: what the operator saw of a node's slowdown."""
is_agent_pod = agent_pods.is_agent
"""Whether a pod is an agent pod in a namespace (None: any), by the operator's own rule."""
pod_readiness = agent_pods.pod_readiness
"""(node, namespace/name, Ready, since) of a pod, as the operator reads it; None if unscheduled."""
compact_gpu = compaction.compact_gpu
"""One reported GPU as the operator keeps it (`gpu_facts.GPUFacts`)."""
recompact_gpu = compaction.recompact_gpu
"""`compact_gpu` of a GPU whose reported facts changed only in the fields given (a trace's patch)."""
share_value = compaction.SHARED.value
"""A reported value as the operator keeps it: one copy of what many GPUs hold alike (`recompact_gpu`'s
`kept` parts are made of these)."""


class Operator:
    """One term of the operator over `client`, at `clock`'s time; driven by its caller, never by kopf.

    `agent_pod_namespace`: where agent pods count (the recording's namespace; None: any namespace).
    `instance`: the reporting instance of its Events.
    `straggler_observer`: told each sample a straggler window takes ((policy, node), its time, the score).
    `straggler_window`: False judges stragglers on each sample alone (the rule before the window; a
    benchmark's comparison), not on their window.
    """

    def __init__(
        self,
        client: kube.Client,
        clock: Clock,
        *,
        agent_pod_namespace: str | None = None,
        instance: str = "replay",
        straggler_observer: StragglerObserver | None = None,
        straggler_window: bool = True,
    ) -> None:
        # No release ask: the recorded agents answered the live operator's, not the replay's (issue 48).
        # No check Jobs either: none runs in a replay; the recorded runs come through `check_run`.
        config = settings.Settings(
            agent_pod_namespace=agent_pod_namespace, release_gpus=False, run_checks=False
        )
        self._ctx = context.Context.create(config, client, metrics.Metrics.create(), instance=instance)
        self._ctx.clock = clock
        self._ctx.judging.straggler_cohorts.observer = straggler_observer
        self._ctx.judging.straggler_cohorts.window = straggler_window

    async def policy_event(self, kind: EventType, body: dict[str, Any]) -> None:
        """A GPUHealthPolicy watch event."""
        await handlers.on_policy(_event(kind, body), memo=self._ctx)

    async def node_event(self, kind: EventType, body: dict[str, Any]) -> None:
        """A Node watch event; the handler may trim `body`: pass a copy of what the cluster keeps."""
        await handlers.on_node(_event(kind, body), memo=self._ctx)
        await passes.settle(self._ctx)

    async def gpunode_event(self, kind: EventType, body: dict[str, Any]) -> None:
        """A GPUNode watch event (the agent's report, or its deletion)."""
        await handlers.on_gpunode(_event(kind, body), memo=self._ctx)
        await passes.settle(self._ctx)

    async def agent_pod_event(self, kind: EventType, body: dict[str, Any]) -> None:
        """An agent Pod watch event (its node and Ready condition): the agent's liveness."""
        await handlers.on_agent_pod(_event(kind, body), memo=self._ctx)

    async def check_run(self, node: str, entry: dict[str, Any]) -> None:
        """An active check's run the recording saw end (an entry of GPUNode `status.checks[]`): added to
        the node's history as the check step adds the end of its own Job, said in its Event, written,
        and the node judged (ActiveCheckFailed from the history, acted on by the policy's rules). An
        entry that is no run, or one the history holds, or of a node without a GPUNode, changes nothing."""
        if self._ctx.cache.gpunode(node) is None:
            return
        found = check_results.replayed(self._ctx, node, entry)
        if found is None:
            return
        result, message = found
        await check_results.say(self._ctx, node, result, message)
        await reconciler.write_history(self._ctx, node)
        # As the check step does: the answer to our own write judges nothing by itself.
        self._ctx.passes.request(node, pass_queue.Ask("timer"))
        await passes.settle(self._ctx)

    async def tick(self, *, full: bool, statuses: bool = True, refresh: bool | None = None) -> None:
        """One timer pass (`ticker.tick`): `full` judges every node, `statuses` refreshes the policies',
        `refresh` (default: `full`) recounts them and checks domain marks as the live timer's refresh does."""
        await ticker.tick(self._ctx, full=full, statuses=statuses, refresh=refresh)

    def cluster_dra_changed(self) -> None:
        """The cluster's answer on DeviceTaintRules changed: the next isolation pass probes it again."""
        self._ctx.steps.isolate.support.clear()

    def selects(self, policy: str, node: str) -> bool:
        """Whether the policy named `policy` (if known) selects `node` now (its labels, its GPUNode)."""
        known = self._ctx.cache.policies.get(policy)
        return known is not None and node in self._ctx.cache.selection(known).selected

    def max_unavailable(self, policy: str) -> int | None:
        """How many of its selected nodes the policy named `policy` may take out of service now; None if
        it is unknown."""
        known = self._ctx.cache.policies.get(policy)
        if known is None:
            return None
        return policies.resolve_max_unavailable(known, len(self._ctx.cache.selection(known).selected))

    def kept_gpunode(self, node: str) -> tuple[str, Mapping[str, Any]] | None:
        """(resourceVersion, status) of `node`'s GPUNode as the operator's cache keeps it (its own
        read-only objects: its conditions kept, its GPUs compacted); None when none is cached."""
        record = self._ctx.cache.gpunode(node)
        return None if record is None else (record.resource_version, record.status)

    def agent_ready(self, node: str) -> bool | None:
        """Whether `node`'s agent pod is Ready, as the operator knows it; None: no agent pod known."""
        known = self._ctx.agent_pods.get(node)
        return None if known is None else known.ready


def _event(kind: EventType, body: dict[str, Any]) -> kopf.RawEvent:
    """The watch event kopf would hand the operator's handler."""
    return cast(kopf.RawEvent, {"type": kind, "object": body})
