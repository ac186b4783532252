"""Whether a node's facts or its Node start a clock: the state in which time alone can change a verdict.

The timer (`ticker.is_due`) judges a node only while a clock runs for it. These
are the parts of that question a stored version answers on its own, so the
cache asks them once per version (`cache.GPUNodeRecord.at_rest`,
`cache.NodeRecord.at_rest`) instead of once per node per tick.
"""

from __future__ import annotations

from gpuhealth_api import keys, status, vocabulary
from gpuhealth_operator.decisions import model, signals, times

_HEALTHY = (None, vocabulary.Health.HEALTHY.value)
_NO_ACTION = (None, vocabulary.NodeAction.NONE.value)
_OUR_FLAGS = keys.NODE_FLAG_LABELS


def facts_at_rest(facts: status.GPUNodeStatus) -> bool:
    """Healthy, no action, and every condition False with nothing pending (no `observedSince`)."""
    if facts.get("health") not in _HEALTHY or facts.get("action") not in _NO_ACTION:
        return False
    return all(
        condition.get("status") == "False" and not condition.get("observedSince")
        for condition in facts.get("conditions") or []
    )


def node_at_rest(view: model.NodeView) -> bool:
    """Not cordoned by a policy, not tainted by us, labelled healthy (or not at all), no flag label."""
    if view.cordoned_by or keys.UNHEALTHY_TAINT in view.taint_keys:
        return False
    labels = view.labels
    return labels.get(keys.HEALTH_LABEL) in (None, "healthy") and not any(labels.get(f) for f in _OUR_FLAGS)


def stale_limit(facts: status.GPUNodeStatus) -> float | None:
    """Seconds of report age at which the agent turns stale (`signals.agent_stale`); None when the
    facts carry no valid heartbeat time (stale already)."""
    agent = facts.get("agent") or {}
    if not isinstance(agent, dict) or times.parse(agent.get("lastHeartbeatTime")) is None:
        return None
    return signals.STALE_HEARTBEATS * signals.heartbeat_seconds(agent)
