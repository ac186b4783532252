"""Agent liveness from its DaemonSet pod's readiness, beside the GPUNode heartbeat.

Why: a heartbeat that must catch a dead agent within 90 s costs a GPUNode
status write per node every 30 s, the API server's largest steady cost in a
large fleet. The kubelet already probes every agent (`/readyz`: the NVML
loop runs and its last API contact worked) and the API server already keeps
the answer in the pod's Ready condition, so the operator reads liveness
there and the heartbeat can be long (5 min by default).

The rule (`pod_stale`), on top of the heartbeat rule of `signals.agent_stale`
(which always holds, so a pod can only make a node stale sooner, never later):

- no agent pod known (agents outside Kubernetes, as in the simulator, or the
  pod watch switched off): the heartbeat rule alone;
- a Ready agent pod: live, up to 3 long heartbeats without a new report;
- an agent pod NotReady, or gone, for over NOT_READY_GRACE_SECONDS, and no new
  report for as long: stale (health Unknown, never a disruptive action).

The grace absorbs an agent restart or a rolling update (a new pod is
NotReady until its first probe passes); a report newer than the grace keeps
the node live whatever the pod says, since its facts are fresh. All times are
the operator's own clock (when it saw the pod change), like the heartbeat's.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Final

from gpuhealth_operator.decisions import times

NOT_READY_GRACE_SECONDS: Final = 60.0
"""How long an agent pod may be NotReady or gone before its node's facts count as stale."""


@dataclasses.dataclass(frozen=True)
class AgentPod:
    """What the operator knows of the agent pod on one node."""

    name: str
    """namespace/name of the pod the state comes from (the latest one seen on the node)."""
    ready: bool
    """The pod's Ready condition is True."""
    since: datetime.datetime
    """When (operator's clock) the node's agent last turned Ready, or stopped being Ready."""
    gone: bool = False
    """The pod was deleted and no other agent pod has been seen on the node since."""


def pod_stale(
    pod: AgentPod | None, report_age_seconds: float, now: datetime.datetime
) -> tuple[str, datetime.datetime] | None:
    """Why the agent is stale by its pod, and since when; None: live by its pod, or no pod known.

    `report_age_seconds`: how long ago the operator saw the agent's last new report.
    No elapsed seconds in the message, so it changes only when the facts do.
    """
    if pod is None or pod.ready:
        return None
    down_seconds = times.seconds_between(pod.since, now)
    if down_seconds <= NOT_READY_GRACE_SECONDS or report_age_seconds <= NOT_READY_GRACE_SECONDS:
        return None
    state = "gone" if pod.gone else "not Ready"
    message = (
        f"the agent's pod {pod.name} is {state} since {times.render(pod.since)} (over "
        f"{NOT_READY_GRACE_SECONDS:g}s) and sent no new report since"
    )
    return message, pod.since + datetime.timedelta(seconds=NOT_READY_GRACE_SECONDS)


def observe(
    known: AgentPod | None, name: str, ready: bool, now: datetime.datetime, *, gone: bool = False
) -> AgentPod:
    """The node's agent state after seeing pod `name` Ready (or not, or deleted) at `now`.

    Another pod of the node that is still Ready keeps the node live (a rolling
    update with a surge); a pod that stays NotReady keeps its first `since`.
    """
    if known is None:
        return AgentPod(name, ready, now, gone)
    if known.ready and not ready and known.name != name:
        return known  # another agent pod of this node is Ready: a new or a leaving pod does not change that
    if known.ready == ready:
        return dataclasses.replace(known, name=name, gone=gone)
    return AgentPod(name, ready, now, gone)
