"""Prometheus metrics of the operator, all named `gpuhealth_operator_…`, in their own registry.

Label values are bounded sets (health, action, condition/reason names, eviction
results, policy names, GPU model names): no per-GPU labels, and a `node` label
only on `node_unhealthy`, whose series exist only for nodes not Healthy, so the
series count follows the nodes in trouble, not the fleet.

The fleet SLIs (GPUs by policy and model, out of service by reason, GPU-hours
lost) are set from per-policy tallies (`GPUTally`) that the timer's pass
computes with the policies' status counts.

The fleet gauges (what the leader's passes count: nodes by health, pending,
isolated, drilled, breakers, failed drains, GPUs) are exported only while the
replica leads (`set_leading`): a replica that lost the Lease would otherwise
keep exporting its last term's numbers, and every `sum` over replicas would
count them twice, an alert on them never resolving. Counters are each
replica's own events and are always exported.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import platform
import threading
from collections.abc import Callable, Iterable, Mapping

import prometheus_client
from prometheus_client import metrics_core

from gpuhealth_api import __version__, keys, vocabulary

PREFIX = "gpuhealth_operator"

LABEL_POLICY = "policy"
LABEL_HEALTH = "health"
LABEL_ACTION = "action"
LABEL_REASON = "reason"
LABEL_RESULT = "result"
LABEL_HANDLER = "handler"
LABEL_VERB = "verb"
LABEL_MODEL = "model"
LABEL_CONDITION = "condition"
LABEL_KEY = "key"
LABEL_VALUE = "value"
LABEL_NODE = "node"
LABEL_CHECK = "check"

OUT_OF_SERVICE_REASONS = ("cordoned", "isolated", "unknown")
"""Why GPUs a policy selects are out of service: on a node the policy cordoned; on a node kept free of
new pods by the policy's `gpuhealth.io/unhealthy` taint (and, with IsolateGPU, single GPUs); on a node
whose health is Unknown (no agent heartbeat: not disrupted, but not known to be serviceable)."""
LOST_REASONS = ("cordoned", "isolated")
"""The reasons that count as GPU-hours lost to faults (Unknown is missing data, not a fault)."""
LOST_MAX_STEP_SECONDS = 30.0
"""At most this much time is counted between two passes: a gap (a lost lease, a stopped process) is
not lost GPU time this replica saw, and another replica may have counted it."""
UNKNOWN_MODEL = "unknown"
GPU_SLI_SECONDS = 10.0
"""The GPU gauges are recounted at most this often: a pass over every selected node's GPUs costs
~10 ms per 1,000 nodes, too much for every 1 s tick, and far finer than any scrape."""

HEALTHS = tuple(h.value for h in vocabulary.Health)

UNKNOWN_REASONS = tuple(
    c.value
    for c in (
        vocabulary.Condition.AGENT_STALE,
        vocabulary.Condition.AGENT_ERROR,
        vocabulary.Condition.GPU_OPERATOR_MAINTENANCE,
    )
)
"""Why a node is Unknown (the GPUHealthy Node condition's reason): only a stale agent is what
GPUHealthAgentsStale pages for; an agent in error and the GPU Operator's maintenance are not."""

HANDLERS = ("node", "gpunode", "policy", "timer")
"""The `handler` label's values: error series exist from the start, so a rate over them is 0, not empty."""

LATENCY_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DRAIN_BUCKETS_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
REPAIR_BUCKETS_SECONDS = (10.0, 30.0, 45.0, 60.0, 75.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
OWN_LATENCY_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
"""The operator's own event → write time: the target at 5,000 nodes is p99 ≤ 20 ms (issue 52), so fine."""


class FleetGauge(prometheus_client.Gauge):
    """A gauge of the fleet's state as the leader counts it: collected only while `shown()` says so.

    Still described (registered names, rule checks); a standby's scrape simply holds no samples of it.
    """

    shown: Callable[[], bool] = staticmethod(lambda: True)

    def collect(self) -> Iterable[metrics_core.Metric]:
        return super().collect() if self.shown() else []


@dataclasses.dataclass
class Metrics:
    registry: prometheus_client.CollectorRegistry
    nodes: FleetGauge
    unknown_nodes: FleetGauge
    actions: prometheus_client.Counter
    evictions: prometheus_client.Counter
    drain_duration: prometheus_client.Histogram
    budget_pending: FleetGauge
    isolated_gpus: FleetGauge
    detection_to_action: prometheus_client.Histogram
    reconcile_errors: prometheus_client.Counter
    events: prometheus_client.Counter
    event_to_write: prometheus_client.Histogram
    api_requests: prometheus_client.Counter
    leader: prometheus_client.Gauge
    passes_waiting: prometheus_client.Gauge
    drill_nodes: FleetGauge
    drill_actions: prometheus_client.Counter
    breaker_open: FleetGauge
    gpus: FleetGauge
    gpus_healthy: FleetGauge
    gpus_out_of_service: FleetGauge
    gpu_hours_lost: prometheus_client.Counter
    drain_failed_nodes: FleetGauge
    domain_degraded: FleetGauge
    domain_at_budget: FleetGauge
    repairs: prometheus_client.Counter
    nodes_retired: FleetGauge
    repair_duration: prometheus_client.Histogram
    node_unhealthy: FleetGauge
    checks: prometheus_client.Counter
    checks_in_flight: FleetGauge
    checks_overdue: FleetGauge
    check_gpu_seconds: prometheus_client.Counter
    _models: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    """Models each policy's GPU series exist for (a model gone from the policy loses its series)."""
    _counted_at: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    _tallies: dict[str, GPUTally] = dataclasses.field(default_factory=dict)
    """Each policy's last GPU tally: carried forward while nothing it counts moved (`carry_gpus`)."""
    _domains: dict[tuple[str, str], set[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    """(which gauge, policy) → the domains (key, value) its `domain_*` series exist for."""
    _troubled: dict[str, set[tuple[str, str, str]]] = dataclasses.field(default_factory=dict)
    """policy → the (node, condition, health) its `node_unhealthy` series exist for."""
    _standby: bool = False
    """The Lease was lost: fleet gauges hidden (set_leading(True) clears and shows them again)."""

    @classmethod
    def create(cls) -> Metrics:
        registry = prometheus_client.CollectorRegistry(auto_describe=True)
        # process_cpu_seconds_total & co. (Linux /proc): CPU per event is its rate over events_total's.
        prometheus_client.ProcessCollector(registry=registry)
        meters = cls(
            registry=registry,
            nodes=FleetGauge(
                f"{PREFIX}_nodes",
                "Nodes selected by a policy, by health.",
                [LABEL_POLICY, LABEL_HEALTH],
                registry=registry,
            ),
            unknown_nodes=FleetGauge(
                f"{PREFIX}_unknown_nodes",
                "Nodes selected by a policy that are Unknown, by why (AgentStale, AgentError, "
                "GPUOperatorMaintenance; one reason per node).",
                [LABEL_POLICY, LABEL_REASON],
                registry=registry,
            ),
            actions=prometheus_client.Counter(
                f"{PREFIX}_actions_total",
                "Actions taken on Nodes (or recorded in dry-run), by action and reason.",
                [LABEL_ACTION, LABEL_REASON],
                registry=registry,
            ),
            evictions=prometheus_client.Counter(
                f"{PREFIX}_evictions_total",
                "Pod eviction attempts during drains, by result (evicted, blocked, gone, error).",
                [LABEL_RESULT],
                registry=registry,
            ),
            drain_duration=prometheus_client.Histogram(
                f"{PREFIX}_drain_duration_seconds",
                "Time from drain start to the last evicted pod gone (or to the drain timeout), by result.",
                [LABEL_RESULT],
                buckets=DRAIN_BUCKETS_SECONDS,
                registry=registry,
            ),
            budget_pending=FleetGauge(
                f"{PREFIX}_budget_pending_nodes",
                "Nodes waiting for the policy's disruption budget (action Pending).",
                [LABEL_POLICY],
                registry=registry,
            ),
            isolated_gpus=FleetGauge(
                f"{PREFIX}_isolated_gpus",
                "GPUs the policy isolates with DeviceTaintRules (action IsolateGPU); 0 for other policies.",
                [LABEL_POLICY],
                registry=registry,
            ),
            detection_to_action=prometheus_client.Histogram(
                f"{PREFIX}_detection_to_action_seconds",
                "From the operator's receipt of the report that showed the fact (for sustained conditions "
                "the start of the episode) to the Node patch, by action and condition (the worst one the "
                "verdict holds).",
                [LABEL_ACTION, LABEL_CONDITION],
                buckets=LATENCY_BUCKETS_SECONDS,
                registry=registry,
            ),
            events=prometheus_client.Counter(
                f"{PREFIX}_events",
                "Node and GPUNode watch events handled, by kind: CPU per event is "
                "rate(process_cpu_seconds_total) / rate(this).",
                ["kind"],
                registry=registry,
            ),
            event_to_write=prometheus_client.Histogram(
                f"{PREFIX}_event_to_write_seconds",
                "The operator's own time from a Node or GPUNode watch event received to the first write "
                "its pass sends (API server and network excluded; passes that write nothing not observed), "
                "by the handler that received it.",
                [LABEL_HANDLER],
                buckets=OWN_LATENCY_BUCKETS_SECONDS,
                registry=registry,
            ),
            reconcile_errors=prometheus_client.Counter(
                f"{PREFIX}_reconcile_errors_total",
                "Reconciliations that failed and will be retried, by handler.",
                [LABEL_HANDLER],
                registry=registry,
            ),
            api_requests=prometheus_client.Counter(
                f"{PREFIX}_api_requests_total",
                "Requests sent to the API server by the reconciler (kopf's watches excluded), by verb.",
                [LABEL_VERB],
                registry=registry,
            ),
            leader=prometheus_client.Gauge(
                f"{PREFIX}_leader",
                "1 while this replica holds the leader Lease and acts.",
                registry=registry,
            ),
            passes_waiting=prometheus_client.Gauge(
                f"{PREFIX}_passes_waiting",
                "Nodes whose pass a watch event asked for and that has not started yet.",
                registry=registry,
            ),
            drill_nodes=FleetGauge(
                f"{PREFIX}_drill_nodes",
                f"Nodes in a fire drill (GPUNode annotation {keys.DRILL_ANNOTATION}), "
                "by the health it judged.",
                [LABEL_POLICY, LABEL_HEALTH],
                registry=registry,
            ),
            drill_actions=prometheus_client.Counter(
                f"{PREFIX}_drill_actions_total",
                "Actions a fire drill would have taken (none is taken), by action and the drilled condition.",
                [LABEL_ACTION, LABEL_REASON],
                registry=registry,
            ),
            breaker_open=FleetGauge(
                f"{PREFIX}_breaker_open",
                "1 while the policy's fleet circuit breaker holds new cordons and drains back.",
                [LABEL_POLICY],
                registry=registry,
            ),
            gpus=FleetGauge(
                f"{PREFIX}_gpus",
                "GPUs on the judged nodes a policy selects, by GPU model.",
                [LABEL_POLICY, LABEL_MODEL],
                registry=registry,
            ),
            gpus_healthy=FleetGauge(
                f"{PREFIX}_gpus_healthy",
                "GPUs on nodes judged Healthy and in service (not cordoned or isolated by the policy).",
                [LABEL_POLICY, LABEL_MODEL],
                registry=registry,
            ),
            gpus_out_of_service=FleetGauge(
                f"{PREFIX}_gpus_out_of_service",
                "GPUs a policy selects that are out of service, by reason (cordoned, isolated, unknown).",
                [LABEL_POLICY, LABEL_MODEL, LABEL_REASON],
                registry=registry,
            ),
            gpu_hours_lost=prometheus_client.Counter(
                f"{PREFIX}_gpu_hours_lost",
                "GPU-hours the policy held out of service for faults (cordoned or isolated GPUs over time).",
                [LABEL_POLICY, LABEL_MODEL],
                registry=registry,
            ),
            drain_failed_nodes=FleetGauge(
                f"{PREFIX}_drain_failed_nodes",
                "Nodes the policy cordoned whose drain timed out and that are still cordoned, waiting "
                "for a human (the blocking pods moved, or the node uncordoned or repaired).",
                [LABEL_POLICY],
                registry=registry,
            ),
            domain_degraded=FleetGauge(
                f"{PREFIX}_topology_domain_degraded",
                "1 for each topology domain (spec.topology.domains: key and value of the Node label) the "
                "policy judges degraded; no series for any other domain.",
                [LABEL_POLICY, LABEL_KEY, LABEL_VALUE],
                registry=registry,
            ),
            domain_at_budget=FleetGauge(
                f"{PREFIX}_topology_domain_at_budget",
                "1 for each topology budget domain (spec.topology.budgets: key and value of the Node "
                "label) whose unschedulable selected nodes reach its maxUnavailable; no other has a series.",
                [LABEL_POLICY, LABEL_KEY, LABEL_VALUE],
                registry=registry,
            ),
            repairs=prometheus_client.Counter(
                f"{PREFIX}_repairs_total",
                "Repair steps and validations (spec.repair), by action (ResetGPU, RebootNode, Validation) "
                "and result (Started, Succeeded, Failed, TimedOut, NoEffect, Cancelled, ValidationPassed, "
                "ValidationFailed; Retired with action none).",
                [LABEL_ACTION, LABEL_RESULT],
                registry=registry,
            ),
            nodes_retired=FleetGauge(
                f"{PREFIX}_nodes_retired",
                f"Nodes the policy selects that repair retired ({keys.NEEDS_REPAIR_LABEL}="
                f"{keys.NEEDS_REPAIR_MANUAL}): cordoned until a human returns them.",
                [LABEL_POLICY],
                registry=registry,
            ),
            repair_duration=prometheus_client.Histogram(
                f"{PREFIX}_repair_duration_seconds",
                "From a repair cycle's first step to the node back in service (result returned) or retired "
                "(result retired), or the cycle cancelled (result cancelled).",
                [LABEL_RESULT],
                buckets=REPAIR_BUCKETS_SECONDS,
                registry=registry,
            ),
            node_unhealthy=FleetGauge(
                f"{PREFIX}_node_unhealthy",
                "1 for each true condition of each node the policy judges not Healthy (for an Unknown "
                "node: why nothing is judged, e.g. AgentStale), with its health; no series for a "
                "Healthy node, so alerts can name the node at a cost that follows the nodes in trouble.",
                [LABEL_POLICY, LABEL_NODE, LABEL_CONDITION, LABEL_HEALTH],
                registry=registry,
            ),
            checks=prometheus_client.Counter(
                f"{PREFIX}_checks",
                "Active checks' runs ended (spec.activeChecks), by policy, check and result (Passed, "
                "Failed, Preempted, TimedOut).",
                [LABEL_POLICY, LABEL_CHECK, LABEL_RESULT],
                registry=registry,
            ),
            checks_in_flight=FleetGauge(
                f"{PREFIX}_checks_in_flight",
                "Active check Jobs running now, all policies together (what maxConcurrent bounds).",
                registry=registry,
            ),
            checks_overdue=FleetGauge(
                f"{PREFIX}_checks_overdue_nodes",
                "Nodes the policy selects with no pass of the check within its everySeconds.",
                [LABEL_POLICY, LABEL_CHECK],
                registry=registry,
            ),
            check_gpu_seconds=prometheus_client.Counter(
                f"{PREFIX}_check_gpu_seconds",
                "GPU-seconds spent on active checks: each check pod's GPUs times the seconds it ran.",
                [LABEL_POLICY, LABEL_CHECK],
                registry=registry,
            ),
        )
        for gauge in meters.fleet_gauges():
            gauge.shown = lambda: not meters._standby
        for handler in HANDLERS:
            meters.reconcile_errors.labels(handler)
        # Every replica's, leading or not: which release and Python each one runs.
        prometheus_client.Gauge(
            f"{PREFIX}_build_info",
            "Always 1: the operator's version and Python version, as labels.",
            ["version", "python"],
            registry=registry,
        ).labels(__version__, platform.python_version()).set(1)
        return meters

    def fleet_gauges(self) -> tuple[FleetGauge, ...]:
        return (
            self.nodes,
            self.unknown_nodes,
            self.budget_pending,
            self.isolated_gpus,
            self.drill_nodes,
            self.breaker_open,
            self.gpus,
            self.gpus_healthy,
            self.gpus_out_of_service,
            self.drain_failed_nodes,
            self.domain_degraded,
            self.nodes_retired,
            self.domain_at_budget,
            self.node_unhealthy,
            self.checks_in_flight,
            self.checks_overdue,
        )

    def follow_passes(self, waiting: Callable[[], int]) -> None:
        """`passes_waiting` reads `waiting` at each scrape (a term's pass queue; at its end, none)."""
        self.passes_waiting.set_function(waiting)

    def set_leading(self, leading: bool) -> None:
        """This replica leads (a term starts) or not (the Lease was lost, or it stops).

        Losing the lead hides the fleet gauges at once, before the term's tasks stop (a pass still
        running may set them). A new term clears what the last one left, a policy deleted meanwhile
        included, and counts GPUs at its first pass.
        """
        if leading:
            for gauge in self.fleet_gauges():
                gauge.clear()
            self._counted_at.clear()  # the time between terms is not lost GPU time this replica saw
            self._tallies.clear()
            self._domains.clear()
            self._troubled.clear()
        self._standby = not leading
        self.leader.set(1 if leading else 0)

    def forget_policy(self, name: str) -> None:
        """Drop a deleted policy's series, so its alerts resolve instead of firing on its last value."""
        for health in HEALTHS:
            with contextlib.suppress(KeyError):
                self.nodes.remove(name, health)
            with contextlib.suppress(KeyError):
                self.drill_nodes.remove(name, health)
        for reason in UNKNOWN_REASONS:
            with contextlib.suppress(KeyError):
                self.unknown_nodes.remove(name, reason)
        with contextlib.suppress(KeyError):
            self.budget_pending.remove(name)
        with contextlib.suppress(KeyError):
            self.nodes_retired.remove(name)
        with contextlib.suppress(KeyError):
            self.breaker_open.remove(name)
        with contextlib.suppress(KeyError):
            self.isolated_gpus.remove(name)
        with contextlib.suppress(KeyError):
            self.drain_failed_nodes.remove(name)
        self._forget_models(name, self._models.pop(name, set()))
        self._counted_at.pop(name, None)
        self._tallies.pop(name, None)
        self.set_degraded_domains(name, ())
        self.set_domains_at_budget(name, ())
        self.set_unhealthy_nodes(name, ())

    def set_checks_overdue(self, counts: Mapping[tuple[str, str], int]) -> None:
        """The overdue nodes per (policy, check); a pair no longer counted loses its series."""
        shown = prometheus_client.Gauge.collect(self.checks_overdue)  # a standby's series too
        for labels in {(m.labels[LABEL_POLICY], m.labels[LABEL_CHECK]) for f in shown for m in f.samples}:
            if labels not in counts:
                with contextlib.suppress(KeyError):
                    self.checks_overdue.remove(*labels)
        for (policy, check), count in counts.items():
            self.checks_overdue.labels(policy, check).set(count)

    def set_unhealthy_nodes(self, policy: str, troubled: Iterable[tuple[str, str, str]]) -> None:
        """The policy's nodes in trouble are `troubled` (node, condition, health): 1 for each, and the
        series of a node that recovered (or left the policy) removed, so only they carry a series."""
        now = set(troubled)
        for node, condition, health in self._troubled.get(policy, set()) - now:
            with contextlib.suppress(KeyError):
                self.node_unhealthy.remove(policy, node, condition, health)
        for node, condition, health in now:
            self.node_unhealthy.labels(policy, node, condition, health).set(1)
        if now:
            self._troubled[policy] = now
        else:
            self._troubled.pop(policy, None)

    def set_degraded_domains(self, policy: str, degraded: Iterable[tuple[str, str]]) -> None:
        """The policy's degraded domains are `degraded` (key, value): 1 for each, and the series of a
        domain that recovered removed, so the gauge has series only for domains in trouble."""
        self._set_domains(self.domain_degraded, "degraded", policy, degraded)

    def set_domains_at_budget(self, policy: str, full: Iterable[tuple[str, str]]) -> None:
        """The policy's topology budget domains with no free place are `full` (key, value), as above."""
        self._set_domains(self.domain_at_budget, "at_budget", policy, full)

    def _set_domains(
        self, gauge: FleetGauge, which: str, policy: str, domains: Iterable[tuple[str, str]]
    ) -> None:
        index = (which, policy)
        now = set(domains)
        for key, value in self._domains.get(index, set()) - now:
            with contextlib.suppress(KeyError):
                gauge.remove(policy, key, value)
        for key, value in now:
            gauge.labels(policy, key, value).set(1)
        if now:
            self._domains[index] = now
        else:
            self._domains.pop(index, None)

    def _forget_models(self, policy: str, models: set[str]) -> None:
        for model in models:
            for gauge in (self.gpus, self.gpus_healthy):
                with contextlib.suppress(KeyError):
                    gauge.remove(policy, model)
            for reason in OUT_OF_SERVICE_REASONS:
                with contextlib.suppress(KeyError):
                    self.gpus_out_of_service.remove(policy, model, reason)
            with contextlib.suppress(KeyError):
                self.gpu_hours_lost.remove(policy, model)

    def gpus_due(self, policy: str, now: datetime.datetime) -> bool:
        """Whether the policy's GPU gauges are due for a recount (GPU_SLI_SECONDS since the last)."""
        previous = self._counted_at.get(policy)
        return previous is None or (now - previous).total_seconds() >= GPU_SLI_SECONDS

    def record_gpus(self, policy: str, tally: GPUTally, now: datetime.datetime) -> None:
        """Set a policy's GPU gauges from one pass's tally, and count the GPU-hours lost since the last."""
        previous = self._counted_at.get(policy)
        self._counted_at[policy] = now
        self._tallies[policy] = tally
        step = 0.0 if previous is None else (now - previous).total_seconds()
        hours = min(max(step, 0.0), LOST_MAX_STEP_SECONDS) / 3600.0
        models = set(tally.total)
        self._forget_models(policy, self._models.get(policy, set()) - models)
        self._models[policy] = models
        for model in models:
            self.gpus.labels(policy, model).set(tally.total[model])
            self.gpus_healthy.labels(policy, model).set(tally.healthy[model])
            for reason in OUT_OF_SERVICE_REASONS:
                self.gpus_out_of_service.labels(policy, model, reason).set(tally.out[(model, reason)])
            lost = sum(tally.out[(model, reason)] for reason in LOST_REASONS)
            self.gpu_hours_lost.labels(policy, model).inc(lost * hours)

    def carry_gpus(self, now: datetime.datetime) -> None:
        """Each policy's last tally recorded again at `now`: what the GPU-hours lost grow by while nothing
        the tally counts moved, without counting every selected node's GPUs again."""
        for policy, tally in list(self._tallies.items()):
            self.record_gpus(policy, tally, now)

    def serve(self, port: int) -> threading.Thread | None:
        """Serve /metrics on the port in a background thread (port 0: not served)."""
        if not port:
            return None
        _server, thread = prometheus_client.start_http_server(port, registry=self.registry)
        return thread


@dataclasses.dataclass
class GPUTally:
    """GPUs of one policy's judged nodes, by model: all, healthy and in service, out of service by reason."""

    total: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    healthy: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    out: collections.Counter[tuple[str, str]] = dataclasses.field(default_factory=collections.Counter)

    def add(self, model: str, gpus: int, *, healthy: bool, out_reason: str | None) -> None:
        self.total[model] += gpus
        if out_reason is not None:
            self.out[(model, out_reason)] += gpus
        elif healthy:
            self.healthy[model] += gpus
