"""Prometheus metrics of the operator, all named `gpuhealth_operator_…`, in their own registry.

Label values are bounded sets (`metric_labels`): no per-GPU labels, and a `node` label only on
`node_unhealthy`, whose series exist only for nodes not Healthy, so the series count follows the
nodes in trouble, not the fleet (`fleet_series.SeriesSet`).

The fleet SLIs (GPUs by policy and model, out of service by reason, GPU-hours lost) are set from
per-policy tallies (`gpu_meters`) that the timer's pass computes with the policies' status counts.

The fleet gauges (what the leader's passes count: nodes by health, pending, isolated, drilled,
breakers, failed drains, GPUs) are exported only while the replica leads (`set_leading`): a replica
that lost the Lease would otherwise keep exporting its last term's numbers, and every `sum` over
replicas would count them twice, an alert on them never resolving. Counters are each replica's own
events and are always exported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import platform
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import prometheus_client

from gpuhealth_api import __version__, keys
from gpuhealth_operator.shared import gpu_meters
from gpuhealth_operator.shared.fleet_series import FleetGauge, SeriesSet, replace_counts
from gpuhealth_operator.shared.metric_labels import (
    DRAIN_BUCKETS_SECONDS,
    HANDLERS,
    HEALTHS,
    LABEL_ACTION,
    LABEL_CHECK,
    LABEL_CONDITION,
    LABEL_HANDLER,
    LABEL_HEALTH,
    LABEL_KEY,
    LABEL_MODEL,
    LABEL_NODE,
    LABEL_POLICY,
    LABEL_REASON,
    LABEL_RESULT,
    LABEL_VALUE,
    LABEL_VERB,
    LATENCY_BUCKETS_SECONDS,
    OWN_LATENCY_BUCKETS_SECONDS,
    PREFIX,
    REPAIR_BUCKETS_SECONDS,
    UNKNOWN_REASONS,
)


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
    _gpus: gpu_meters.GPUMeters = dataclasses.field(init=False)
    _troubled: SeriesSet = dataclasses.field(init=False)
    """The `node_unhealthy` series: each policy's (node, condition, health) in trouble."""
    _degraded: SeriesSet = dataclasses.field(init=False)
    _at_budget: SeriesSet = dataclasses.field(init=False)
    _standby: bool = False
    """The Lease was lost: fleet gauges hidden (set_leading(True) clears and shows them again)."""

    def __post_init__(self) -> None:
        self._gpus = gpu_meters.GPUMeters(
            self.gpus, self.gpus_healthy, self.gpus_out_of_service, self.gpu_hours_lost
        )
        self._troubled = SeriesSet(self.node_unhealthy)
        self._degraded = SeriesSet(self.domain_degraded)
        self._at_budget = SeriesSet(self.domain_at_budget)

    @classmethod
    def create(cls) -> Metrics:
        registry = prometheus_client.CollectorRegistry(auto_describe=True)
        # process_cpu_seconds_total & co. (Linux /proc): CPU per event is its rate over events_total's.
        prometheus_client.ProcessCollector(registry=registry)
        fleet, counter, histogram, gauge = _definers(registry)
        meters = cls(
            registry=registry,
            nodes=fleet("nodes", [LABEL_POLICY, LABEL_HEALTH], "Nodes selected by a policy, by health."),
            unknown_nodes=fleet(
                "unknown_nodes",
                [LABEL_POLICY, LABEL_REASON],
                "Nodes selected by a policy that are Unknown, by why (AgentStale, AgentError, "
                "GPUOperatorMaintenance; one reason per node).",
            ),
            actions=counter(
                "actions_total",
                [LABEL_ACTION, LABEL_REASON],
                "Actions taken on Nodes (or recorded in dry-run), by action and reason.",
            ),
            evictions=counter(
                "evictions_total",
                [LABEL_RESULT],
                "Pod eviction attempts during drains, by result (evicted, blocked, gone, error).",
            ),
            drain_duration=histogram(
                "drain_duration_seconds",
                [LABEL_RESULT],
                "Time from drain start to the last evicted pod gone (or to the drain timeout), by result.",
                DRAIN_BUCKETS_SECONDS,
            ),
            budget_pending=fleet(
                "budget_pending_nodes",
                [LABEL_POLICY],
                "Nodes waiting for the policy's disruption budget (action Pending).",
            ),
            isolated_gpus=fleet(
                "isolated_gpus",
                [LABEL_POLICY],
                "GPUs the policy isolates with DeviceTaintRules (action IsolateGPU); 0 for other policies.",
            ),
            detection_to_action=histogram(
                "detection_to_action_seconds",
                [LABEL_ACTION, LABEL_CONDITION],
                "From the operator's receipt of the report that showed the fact (for sustained conditions "
                "the start of the episode) to the Node patch, by action and condition (the worst one the "
                "verdict holds).",
                LATENCY_BUCKETS_SECONDS,
            ),
            events=counter(
                "events",
                ["kind"],
                "Node and GPUNode watch events handled, by kind: CPU per event is "
                "rate(process_cpu_seconds_total) / rate(this).",
            ),
            event_to_write=histogram(
                "event_to_write_seconds",
                [LABEL_HANDLER],
                "The operator's own time from a Node or GPUNode watch event received to the first write "
                "its pass sends (API server and network excluded; passes that write nothing not observed), "
                "by the handler that received it.",
                OWN_LATENCY_BUCKETS_SECONDS,
            ),
            reconcile_errors=counter(
                "reconcile_errors_total",
                [LABEL_HANDLER],
                "Reconciliations that failed and will be retried, by handler.",
            ),
            api_requests=counter(
                "api_requests_total",
                [LABEL_VERB],
                "Requests sent to the API server by the reconciler (kopf's watches excluded), by verb.",
            ),
            leader=gauge("leader", "1 while this replica holds the leader Lease and acts."),
            passes_waiting=gauge(
                "passes_waiting", "Nodes whose pass a watch event asked for and that has not started yet."
            ),
            drill_nodes=fleet(
                "drill_nodes",
                [LABEL_POLICY, LABEL_HEALTH],
                f"Nodes in a fire drill (GPUNode annotation {keys.DRILL_ANNOTATION}), "
                "by the health it judged.",
            ),
            drill_actions=counter(
                "drill_actions_total",
                [LABEL_ACTION, LABEL_REASON],
                "Actions a fire drill would have taken (none is taken), by action and the drilled condition.",
            ),
            breaker_open=fleet(
                "breaker_open",
                [LABEL_POLICY],
                "1 while the policy's fleet circuit breaker holds new cordons and drains back.",
            ),
            gpus=fleet(
                "gpus",
                [LABEL_POLICY, LABEL_MODEL],
                "GPUs on the judged nodes a policy selects, by GPU model.",
            ),
            gpus_healthy=fleet(
                "gpus_healthy",
                [LABEL_POLICY, LABEL_MODEL],
                "GPUs on nodes judged Healthy and in service (not cordoned or isolated by the policy).",
            ),
            gpus_out_of_service=fleet(
                "gpus_out_of_service",
                [LABEL_POLICY, LABEL_MODEL, LABEL_REASON],
                "GPUs a policy selects that are out of service, by reason (cordoned, isolated, unknown).",
            ),
            gpu_hours_lost=counter(
                "gpu_hours_lost",
                [LABEL_POLICY, LABEL_MODEL],
                "GPU-hours the policy held out of service for faults (cordoned or isolated GPUs over time).",
            ),
            drain_failed_nodes=fleet(
                "drain_failed_nodes",
                [LABEL_POLICY],
                "Nodes the policy cordoned whose drain timed out and that are still cordoned, waiting "
                "for a human (the blocking pods moved, or the node uncordoned or repaired).",
            ),
            domain_degraded=fleet(
                "topology_domain_degraded",
                [LABEL_POLICY, LABEL_KEY, LABEL_VALUE],
                "1 for each topology domain (spec.topology.domains: key and value of the Node label) the "
                "policy judges degraded; no series for any other domain.",
            ),
            domain_at_budget=fleet(
                "topology_domain_at_budget",
                [LABEL_POLICY, LABEL_KEY, LABEL_VALUE],
                "1 for each topology budget domain (spec.topology.budgets: key and value of the Node "
                "label) whose unschedulable selected nodes reach its maxUnavailable; no other has a series.",
            ),
            repairs=counter(
                "repairs_total",
                [LABEL_ACTION, LABEL_RESULT],
                "Repair steps and validations (spec.repair), by action (ResetGPU, RebootNode, Validation) "
                "and result (Started, Succeeded, Failed, TimedOut, NoEffect, Cancelled, ValidationPassed, "
                "ValidationFailed; Retired with action none).",
            ),
            nodes_retired=fleet(
                "nodes_retired",
                [LABEL_POLICY],
                f"Nodes the policy selects that repair retired ({keys.NEEDS_REPAIR_LABEL}="
                f"{keys.NEEDS_REPAIR_MANUAL}): cordoned until a human returns them.",
            ),
            repair_duration=histogram(
                "repair_duration_seconds",
                [LABEL_RESULT],
                "From a repair cycle's first step to the node back in service (result returned) or retired "
                "(result retired), or the cycle cancelled (result cancelled).",
                REPAIR_BUCKETS_SECONDS,
            ),
            node_unhealthy=fleet(
                "node_unhealthy",
                [LABEL_POLICY, LABEL_NODE, LABEL_CONDITION, LABEL_HEALTH],
                "1 for each true condition of each node the policy judges not Healthy (for an Unknown "
                "node: why nothing is judged, e.g. AgentStale), with its health; no series for a "
                "Healthy node, so alerts can name the node at a cost that follows the nodes in trouble.",
            ),
            checks=counter(
                "checks",
                [LABEL_POLICY, LABEL_CHECK, LABEL_RESULT],
                "Active checks' runs ended (spec.activeChecks), by policy, check and result (Passed, "
                "Failed, Preempted, TimedOut).",
            ),
            checks_in_flight=fleet(
                "checks_in_flight",
                [],
                "Active check Jobs running now, all policies together (what maxConcurrent bounds).",
            ),
            checks_overdue=fleet(
                "checks_overdue_nodes",
                [LABEL_POLICY, LABEL_CHECK],
                "Nodes the policy selects with no pass of the check within its everySeconds.",
            ),
            check_gpu_seconds=counter(
                "check_gpu_seconds",
                [LABEL_POLICY, LABEL_CHECK],
                "GPU-seconds spent on active checks: each check pod's GPUs times the seconds it ran.",
            ),
        )
        for fleet_gauge in meters.fleet_gauges():
            fleet_gauge.shown = lambda: not meters._standby
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
            self._gpus.new_term()
            for series in (self._troubled, self._degraded, self._at_budget):
                series.clear()
        self._standby = not leading
        self.leader.set(1 if leading else 0)

    def forget_policy(self, name: str) -> None:
        """Drop a deleted policy's series, so its alerts resolve instead of firing on its last value."""
        by_health = [(g, (name, h)) for g in (self.nodes, self.drill_nodes) for h in HEALTHS]
        by_reason = [(self.unknown_nodes, (name, reason)) for reason in UNKNOWN_REASONS]
        alone = (
            self.budget_pending,
            self.nodes_retired,
            self.breaker_open,
            self.isolated_gpus,
            self.drain_failed_nodes,
        )
        for gauge, labels in [*by_health, *by_reason, *((g, (name,)) for g in alone)]:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
        self._gpus.forget_policy(name)
        for series in (self._troubled, self._degraded, self._at_budget):
            series.replace(name, ())

    def set_checks_overdue(self, counts: Mapping[tuple[str, str], int]) -> None:
        """The overdue nodes per (policy, check); a pair no longer counted loses its series."""
        replace_counts(self.checks_overdue, counts)

    def set_unhealthy_nodes(self, policy: str, troubled: Iterable[tuple[str, str, str]]) -> None:
        """The policy's nodes in trouble are `troubled` (node, condition, health): 1 for each, and the
        series of a node that recovered (or left the policy) removed, so only they carry a series."""
        self._troubled.replace(policy, troubled)

    def set_degraded_domains(self, policy: str, degraded: Iterable[tuple[str, str]]) -> None:
        """The policy's degraded domains are `degraded` (key, value): 1 for each, and the series of a
        domain that recovered removed, so the gauge has series only for domains in trouble."""
        self._degraded.replace(policy, degraded)

    def set_domains_at_budget(self, policy: str, full: Iterable[tuple[str, str]]) -> None:
        """The policy's topology budget domains with no free place are `full` (key, value), as above."""
        self._at_budget.replace(policy, full)

    def gpus_due(self, policy: str, now: datetime.datetime) -> bool:
        """Whether the policy's GPU gauges are due for a recount (GPU_SLI_SECONDS since the last)."""
        return self._gpus.due(policy, now)

    def record_gpus(self, policy: str, tally: gpu_meters.GPUTally, now: datetime.datetime) -> None:
        """Set a policy's GPU gauges from one pass's tally, and count the GPU-hours lost since the last."""
        self._gpus.record(policy, tally, now)

    def carry_gpus(self, now: datetime.datetime) -> None:
        """Each policy's last tally recorded again at `now` (`gpu_meters.GPUMeters.carry`)."""
        self._gpus.carry(now)

    def serve(self, port: int) -> threading.Thread | None:
        """Serve /metrics on the port in a background thread (port 0: not served)."""
        if not port:
            return None
        _server, thread = prometheus_client.start_http_server(port, registry=self.registry)
        return thread


def _definers(
    registry: prometheus_client.CollectorRegistry,
) -> tuple[
    Callable[[str, Sequence[str], str], FleetGauge],
    Callable[[str, Sequence[str], str], prometheus_client.Counter],
    Callable[[str, Sequence[str], str, Sequence[float]], prometheus_client.Histogram],
    Callable[[str, str], prometheus_client.Gauge],
]:
    """One short call per metric: its name after the prefix, its labels, its help (and buckets)."""

    def fleet(name: str, labels: Sequence[str], doc: str) -> FleetGauge:
        return FleetGauge(f"{PREFIX}_{name}", doc, labels, registry=registry)

    def counter(name: str, labels: Sequence[str], doc: str) -> prometheus_client.Counter:
        return prometheus_client.Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

    def histogram(
        name: str, labels: Sequence[str], doc: str, buckets: Sequence[float]
    ) -> prometheus_client.Histogram:
        return prometheus_client.Histogram(
            f"{PREFIX}_{name}", doc, labels, buckets=buckets, registry=registry
        )

    def gauge(name: str, doc: str) -> prometheus_client.Gauge:
        return prometheus_client.Gauge(f"{PREFIX}_{name}", doc, registry=registry)

    return fleet, counter, histogram, gauge
