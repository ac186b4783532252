"""Prometheus metrics of the operator, all named `gpuhealth_operator_…`, in their own registry.

Label values are bounded sets (health, action, condition/reason names, eviction
results, policy names): no per-node or per-GPU labels, so the series count does
not grow with the fleet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import prometheus_client

from gpuhealth_api import vocabulary

PREFIX = "gpuhealth_operator"

LABEL_POLICY = "policy"
LABEL_HEALTH = "health"
LABEL_ACTION = "action"
LABEL_REASON = "reason"
LABEL_RESULT = "result"
LABEL_HANDLER = "handler"
LABEL_VERB = "verb"

HEALTHS = tuple(h.value for h in vocabulary.Health)

HANDLERS = ("node", "gpunode", "policy", "timer")
"""The `handler` label's values: error series exist from the start, so a rate over them is 0, not empty."""

LATENCY_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DRAIN_BUCKETS_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)


@dataclasses.dataclass
class Metrics:
    registry: prometheus_client.CollectorRegistry
    nodes: prometheus_client.Gauge
    actions: prometheus_client.Counter
    evictions: prometheus_client.Counter
    drain_duration: prometheus_client.Histogram
    budget_pending: prometheus_client.Gauge
    isolated_gpus: prometheus_client.Gauge
    detection_to_action: prometheus_client.Histogram
    reconcile_errors: prometheus_client.Counter
    api_requests: prometheus_client.Counter
    leader: prometheus_client.Gauge
    drill_nodes: prometheus_client.Gauge
    drill_actions: prometheus_client.Counter
    breaker_open: prometheus_client.Gauge

    @classmethod
    def create(cls) -> Metrics:
        registry = prometheus_client.CollectorRegistry(auto_describe=True)
        meters = cls(
            registry=registry,
            nodes=prometheus_client.Gauge(
                f"{PREFIX}_nodes",
                "Nodes selected by a policy, by health.",
                [LABEL_POLICY, LABEL_HEALTH],
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
            budget_pending=prometheus_client.Gauge(
                f"{PREFIX}_budget_pending_nodes",
                "Nodes waiting for the policy's disruption budget (action Pending).",
                [LABEL_POLICY],
                registry=registry,
            ),
            isolated_gpus=prometheus_client.Gauge(
                f"{PREFIX}_isolated_gpus",
                "GPUs the policy isolates with DeviceTaintRules (action IsolateGPU); 0 for other policies.",
                [LABEL_POLICY],
                registry=registry,
            ),
            detection_to_action=prometheus_client.Histogram(
                f"{PREFIX}_detection_to_action_seconds",
                "From the agent's observation of the fact (GPUNode status observedTime) to the Node patch.",
                [LABEL_ACTION],
                buckets=LATENCY_BUCKETS_SECONDS,
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
            drill_nodes=prometheus_client.Gauge(
                f"{PREFIX}_drill_nodes",
                "Nodes in a fire drill (GPUNode annotation gpuhealth.io/drill), by the health it judged.",
                [LABEL_POLICY, LABEL_HEALTH],
                registry=registry,
            ),
            drill_actions=prometheus_client.Counter(
                f"{PREFIX}_drill_actions_total",
                "Actions a fire drill would have taken (none is taken), by action and the drilled condition.",
                [LABEL_ACTION, LABEL_REASON],
                registry=registry,
            ),
            breaker_open=prometheus_client.Gauge(
                f"{PREFIX}_breaker_open",
                "1 while the policy's fleet circuit breaker holds new cordons and drains back.",
                [LABEL_POLICY],
                registry=registry,
            ),
        )
        for handler in HANDLERS:
            meters.reconcile_errors.labels(handler)
        return meters

    def forget_policy(self, name: str) -> None:
        """Drop a deleted policy's series, so its alerts resolve instead of firing on its last value."""
        for health in HEALTHS:
            with contextlib.suppress(KeyError):
                self.nodes.remove(name, health)
            with contextlib.suppress(KeyError):
                self.drill_nodes.remove(name, health)
        with contextlib.suppress(KeyError):
            self.budget_pending.remove(name)
        with contextlib.suppress(KeyError):
            self.breaker_open.remove(name)
        with contextlib.suppress(KeyError):
            self.isolated_gpus.remove(name)

    def serve(self, port: int) -> threading.Thread | None:
        """Serve /metrics on the port in a background thread (port 0: not served)."""
        if not port:
            return None
        _server, thread = prometheus_client.start_http_server(port, registry=self.registry)
        return thread
