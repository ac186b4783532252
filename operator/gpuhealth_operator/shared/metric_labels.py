"""The operator's metric names and their bounded label values.

Every metric is named `gpuhealth_operator_…`; a label takes its values from a bounded set (health,
action, condition/reason names, eviction results, policy names, GPU model names), never a GPU's,
so the series count follows the policies and the nodes in trouble, not the fleet.
"""

from __future__ import annotations

from gpuhealth_api import vocabulary

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
UNKNOWN_MODEL = "unknown"

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
