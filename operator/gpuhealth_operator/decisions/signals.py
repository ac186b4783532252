"""Raw per-instant signals: what the agent's facts say about each condition right now.

A signal is the evidence before hysteresis (`hysteresis.advance` turns a run of
signals into a condition). Each signal is True (a GPU shows the fault), False
(GPUs are reported and none shows it) or unknown (the facts cannot tell).

Missing data is never a fault: an absent field never makes a signal True, and
a stale agent makes every signal but AgentStale unknown, so conditions hold
their last state instead of firing or clearing on old facts.

Straggler is not here: it needs the whole cohort (see `stragglers`).

Only AgentStale depends on the time; the others depend on the facts, the
policy's XIDs and the GPUs the node should have, so a caller that keeps a
`FactSignals` per version of the facts judges each version's GPUs once, and
`still_healthy` tells when a new version's healthy signals are the last one's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from gpuhealth_api import conditions, faults, heartbeats, keys, status, vocabulary
from gpuhealth_operator.compact import slotted
from gpuhealth_operator.decisions import check_runs, gpu_facts, liveness, model, times, trends

Condition = vocabulary.Condition

DEFAULT_HEARTBEAT_SECONDS: Final = heartbeats.UNSTATED_HEARTBEAT_SECONDS
STALE_HEARTBEATS: Final = heartbeats.STALE_HEARTBEATS
"""An agent that missed this many heartbeats is stale (DESIGN.md)."""
MAX_HEARTBEAT_SECONDS: Final = heartbeats.MAX_HEARTBEAT_SECONDS

BUSY_UTILIZATION_PERCENT: Final = faults.BUSY_UTILIZATION_PERCENT

FACT_CONDITIONS: Final = conditions.FACT_CONDITIONS
"""Conditions judged from one node's facts (and its `trends`) alone (AgentStale aside)."""

GPUFault = faults.GPUFault

DRIVER_UPGRADE_MAINTENANCE: Final = frozenset({"pod-restart-required", "validation-required"})
"""`nvidia.com/gpu-driver-upgrade-state` values (k8s-operator-libs) while the driver is really away: its pod
restarts (the old driver unloads, the new one loads), then the validator waits for the new one. Not the
states before (`upgrade-required`, `cordon-required`, `wait-for-jobs-required`, `pod-deletion-required`,
`drain-required`, `node-maintenance-required`, `post-maintenance-required`): the old driver still runs and
so may jobs, for as long as the longest one, so their faults are judged as on any node (issue 45, item 4);
nor `uncordon-required` (the new driver is Ready: the grace after maintenance covers a late report),
`upgrade-done`, `upgrade-failed` (nobody brings the GPUs back: the node is judged as any other)."""
MAINTENANCE_LIMIT_SECONDS: Final = 3600.0
"""The longest a GPU Operator maintenance keeps a node's facts unknown. A driver pod's restart and
validation take minutes, a MIG reboot a quarter of an hour; a label that stays longer (a stuck upgrade,
or anyone who can label Nodes hiding a fault) no longer hides anything: the facts are judged again."""
OVERDUE_WORDS: Final = f"for over {MAINTENANCE_LIMIT_SECONDS:g}s: the GPUs' facts are judged again"
"""Said in the GPUOperatorMaintenance condition (and its Event) once the maintenance is overdue."""
MIG_MAINTENANCE: Final = frozenset({"pending", "rebooting"})
"""`nvidia.com/mig.config.state` values while mig-manager applies a MIG configuration (not `success`,
`failed`)."""

FactSignals = dict[
    tuple[frozenset[int], int | None, trends.Thresholds, tuple[int | None, ...]],
    dict[Condition, model.Signal],
]
"""Signals of FACT_CONDITIONS per (policy XIDs, expected GPUs, trend thresholds, the links up each GPU's
cohort has: `trends.Trends.expectations`), for one version of a node's facts (and the trends remembered
with it)."""


def raw_signals(
    facts: status.GPUNodeStatus,
    node: model.NodeView,
    rule_xids: frozenset[int],
    now: datetime.datetime,
    report_age_seconds: float = 0.0,
    *,
    agent_pod: liveness.AgentPod | None = None,
    known: FactSignals | None = None,
    thresholds: trends.Thresholds = (),
    memory: trends.Trends | None = None,
    overdue: bool = False,
) -> dict[vocabulary.ConditionKey, model.Signal]:
    """One signal per condition of DESIGN.md's table except Straggler.

    `report_age_seconds`: how long ago the operator saw the agent's last new report (see `agent_stale`);
    `agent_pod`: the node's agent pod as the operator last saw it (None: not known); `known`: the
    fact signals already judged for these facts (module docstring), filled in here; `thresholds`: the
    policy's trend thresholds (`trends.thresholds`); `memory`: what the operator remembers of the
    node's earlier reports as of these facts (None: nothing, as `check`); `overdue`: the GPU Operator's
    maintenance has held for MAINTENANCE_LIMIT_SECONDS (`verdicts.maintenance_overdue`): facts are judged.
    """
    stale = agent_stale(facts, report_age_seconds, now, agent_pod)
    error = agent_error(facts, stale=stale.present is True)
    maintenance = gpu_operator_signal(node)
    if overdue and maintenance.present:
        maintenance = model.Signal(maintenance.condition, True, f"{maintenance.message}; {OVERDUE_WORDS}")
    signals: dict[vocabulary.ConditionKey, model.Signal] = {
        Condition.AGENT_STALE: stale,
        Condition.AGENT_ERROR: error,
        Condition.GPU_OPERATOR_MAINTENANCE: maintenance,
        Condition.ACTIVE_CHECK_FAILED: active_check_signal(facts),
    }
    # GPUs the GPU Operator takes away on purpose are no fault; a stale agent's facts are old; an agent in
    # error (it sees no GPU) reports none to judge.
    # Past MAINTENANCE_LIMIT_SECONDS (`overdue`) the maintenance still shows, but blinds no more.
    blind = next(
        (s for s in (maintenance, stale, error) if s.present and not (overdue and s is maintenance)), None
    )
    if blind is not None:
        for condition in FACT_CONDITIONS:
            signals[condition] = model.Signal(condition, None, f"unknown: {blind.message}")
        return signals
    if known is None:
        return signals | fact_signals(facts, node, rule_xids, thresholds, memory)
    key = (
        rule_xids,
        expected_gpus(facts, node),
        thresholds,
        memory.expectations(facts.get("gpus")) if memory is not None else (),
    )
    judged = known.get(key)
    if judged is None:
        judged = known[key] = fact_signals(facts, node, rule_xids, thresholds, memory)
    return signals | judged


REPAIRS_FIELD: Final = "repairs"
"""GPUNode `status.repairs[]`: its ValidationPassed entries clear ActiveCheckFailed (`check_runs`)."""


def active_check_signal(facts: status.GPUNodeStatus) -> model.Signal:
    """ActiveCheckFailed from the node's check history (`check_runs.active_check`): the operator's own
    evidence, stored in the cluster, so judged whatever the agent's state and after a restart."""
    condition = Condition.ACTIVE_CHECK_FAILED
    failing, cleared = check_runs.active_check(facts.get(check_runs.STATUS_FIELD), facts.get(REPAIRS_FIELD))
    if failing is None:
        if cleared:
            return model.Signal(condition, False, "cleared by a repair validation that passed after it")
        return model.Signal(condition, False, "no active check failed since its last pass")
    return model.Signal(
        condition, True, f"active check {failing.check} failed at {times.render(failing.since)}"
    )


def fact_signals(
    facts: status.GPUNodeStatus,
    node: model.NodeView,
    rule_xids: frozenset[int],
    thresholds: trends.Thresholds = (),
    memory: trends.Trends | None = None,
) -> dict[Condition, model.Signal]:
    """The signals of FACT_CONDITIONS of a node whose agent is not stale."""
    signals: dict[Condition, model.Signal] = {}
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        for condition in FACT_CONDITIONS:
            signals[condition] = model.Signal(condition, None, "unknown: the agent has not reported GPUs yet")
        return signals
    # Read as dicts, in one call: the memory and each check ask each GPU's facts key by key (issue 46).
    gpus = slotted.as_dicts(gpus)
    # And the memory of every GPU and NIC port, in one call: each check asks it of each GPU (issue 46).
    read = memory.read(gpus, facts.get("nics")) if memory is not None else None
    limits = dict(thresholds)
    history = _history(gpus, read.gpus) if read is not None else faults.no_history
    # Most reports list no fact their agent cannot read: then no condition has an unread GPU to name.
    unread = any(isinstance(g, gpu_facts.MAPPINGS) and isinstance(g.get("unreadable"), list) for g in gpus)
    for condition, check in conditions.gpu_checks(rule_xids, limits, history).items():
        if condition is not Condition.GPU_LOST:  # per GPU and per node: _lost
            signals[condition] = _per_gpu(condition, gpus, check, unread=unread)
    signals[Condition.GPU_LOST] = _lost(facts, node, gpus)
    nics = facts.get("nics")
    ports = _history(nics, read.nics) if read is not None and isinstance(nics, list) else None
    signals[Condition.NIC_DEGRADED] = _nics(nics, limits, ports)
    return signals


def _history(items: Iterable[object], answers: tuple[faults.Trend, ...]) -> Callable[[object], faults.Trend]:
    """The history of `items` whose trends are `answers` (`trends.Read`: by position), asked with an item:
    by identity, since the checks ask it with the very objects listed, alive while they judge."""
    by_id = {id(item): answer for item, answer in zip(items, answers, strict=True)}

    def history(item: object) -> faults.Trend:
        return by_id[id(item)]

    return history


def node_condition_signal(node: model.NodeView, condition: vocabulary.NodeCondition) -> model.Signal:
    """Another tool's Node condition a rule names: True while the Node holds it with the rule's status.
    A Node without the condition (its tool not installed, not yet reporting) shows no fault."""
    status_now = node.conditions.get(condition.node_type)
    if status_now is None:
        return model.Signal(condition, False, f"the Node has no {condition.node_type} condition")
    present = status_now == condition.status
    return model.Signal(condition, present, f"the Node's {condition.node_type} condition is {status_now}")


def _nics(
    nics: object, limits: Mapping[Condition, float], history: Callable[[status.Nic], faults.Trend] | None
) -> model.Signal:
    """NicDegraded: the node's InfiniBand/RoCE ports (`status.nics`); a node without any has none degraded."""
    condition = Condition.NIC_DEGRADED
    threshold = conditions.threshold(limits, condition)
    found = faults.nic_faults(nics, threshold, history)
    if not found:
        return _HEALTHY[condition]
    return model.Signal(condition, True, "; ".join(found))


def agent_stale(
    facts: status.GPUNodeStatus,
    report_age_seconds: float,
    now: datetime.datetime,
    agent_pod: liveness.AgentPod | None = None,
) -> model.Signal:
    """True when the agent missed STALE_HEARTBEATS heartbeats, or never reported one, or its pod
    has not been Ready for a while (`liveness.pod_stale`; only ever sooner than the heartbeat rule).

    Timed by the operator's own clock: `report_age_seconds` is how long ago the
    operator saw `lastHeartbeatTime` change (the caller keeps that time), never
    the agent's timestamp, so an agent whose clock runs ahead cannot stay fresh
    once it stops reporting. The heartbeat period is the agent's own, capped at
    MAX_HEARTBEAT_SECONDS (the schema's maximum) so a bad value cannot postpone it.
    """
    condition = Condition.AGENT_STALE
    agent = facts.get("agent")
    if not isinstance(agent, dict):
        return model.Signal(condition, True, "no agent has reported for this node")
    heartbeat = times.parse(agent.get("lastHeartbeatTime"))
    if heartbeat is None:
        return model.Signal(condition, True, "the agent reported no valid lastHeartbeatTime")
    limit = STALE_HEARTBEATS * heartbeat_seconds(agent)
    # No elapsed seconds in the messages, so a message changes only when the facts do.
    if report_age_seconds > limit:
        return model.Signal(
            condition,
            True,
            f"no new agent report for over {limit:g}s ({STALE_HEARTBEATS} heartbeats) by the operator's "
            f"clock; the agent's last heartbeat said {times.render(heartbeat)}",
            observed_at=now - datetime.timedelta(seconds=report_age_seconds - limit),
        )
    by_pod = liveness.pod_stale(agent_pod, report_age_seconds, now)
    if by_pod is not None:
        message, since = by_pod
        return model.Signal(condition, True, message, observed_at=since)
    # Not the heartbeat's time either: an unchanged condition stays byte-identical, so a heartbeat
    # writes no GPUNode status.
    return model.Signal(condition, False, f"the agent reports every {heartbeat_seconds(agent):g}s")


def agent_error(facts: status.GPUNodeStatus, *, stale: bool = False) -> model.Signal:
    """True while the agent reports an error of its own (`_reported_error`): it cannot judge the
    node's GPUs (it sees none), so health is Unknown and no fact condition is judged; unknown while
    the agent is stale (its last report is old news)."""
    condition = Condition.AGENT_ERROR
    if stale:
        return model.Signal(condition, None, "unknown: the agent is stale")
    error = _reported_error(facts)
    if error is None:
        return model.Signal(condition, False, "the agent reports no error of its own")
    return model.Signal(condition, True, error)


def _reported_error(facts: status.GPUNodeStatus) -> str | None:
    """The error the agent reports about itself (`status.agent.error`), as `Reason: message`; None if none.

    An agent that runs and reports, but cannot see the node's GPUs (a container runtime that
    hides them), is alive by its heartbeat and its pod: only it can say it is blind. Any
    well-formed error counts, even a reason this operator does not know (an agent newer than it).
    """
    agent = facts.get("agent")
    error = agent.get("error") if isinstance(agent, dict) else None
    if not isinstance(error, dict):
        return None
    reason, message = error.get("reason"), error.get("message")
    if not isinstance(reason, str) or not reason:
        return None
    return f"{reason}: {message}" if isinstance(message, str) and message else reason


def gpu_operator_maintenance(labels: Mapping[str, str]) -> str | None:
    """Why the GPU Operator is working on the node's GPUs, from its labels; None when it is not.

    During a driver upgrade or a MIG reconfiguration the GPUs vanish and come back by design.
    """
    upgrade = labels.get(keys.GPU_DRIVER_UPGRADE_STATE_LABEL)
    if upgrade in DRIVER_UPGRADE_MAINTENANCE:
        return f"the GPU Operator is upgrading the driver ({keys.GPU_DRIVER_UPGRADE_STATE_LABEL}={upgrade})"
    mig = labels.get(keys.MIG_CONFIG_STATE_LABEL)
    if mig in MIG_MAINTENANCE:
        return f"the GPU Operator is reconfiguring MIG ({keys.MIG_CONFIG_STATE_LABEL}={mig})"
    return None


def gpu_operator_signal(node: model.NodeView) -> model.Signal:
    """GPUOperatorMaintenance: True while the node's labels say the GPU Operator works on its GPUs."""
    condition = Condition.GPU_OPERATOR_MAINTENANCE
    why = gpu_operator_maintenance(node.labels)
    if why is None:
        return model.Signal(condition, False, "no GPU Operator driver upgrade or MIG reconfiguration")
    return model.Signal(condition, True, why)


def agent_is_stale(
    stale_limit: float | None,
    report_age_seconds: float,
    now: datetime.datetime,
    agent_pod: liveness.AgentPod | None = None,
) -> bool:
    """`agent_stale(...).present` without its message, for facts whose `clocks.stale_limit` is
    `stale_limit` (the straggler statistics ask it of every cohort member every tick)."""
    return (
        stale_limit is None
        or report_age_seconds > stale_limit
        or liveness.pod_stale(agent_pod, report_age_seconds, now) is not None
    )


def heartbeat_seconds(agent: Mapping[str, object]) -> float:
    """The agent's heartbeat period: its own if valid (at most MAX_HEARTBEAT_SECONDS), else the default."""
    period = agent.get("heartbeatSeconds")
    if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
        return float(DEFAULT_HEARTBEAT_SECONDS)
    return float(min(period, MAX_HEARTBEAT_SECONDS))


def gpu_name(gpu: status.GPUStatus) -> str:
    """`GPU 3 (GPU-5b1e2a3c…)`: the index people use and enough of the UUID to find the board."""
    index = gpu.get("index")
    label = f"GPU {index}" if isinstance(index, int) else "GPU ?"
    uuid = gpu.get("uuid")
    if isinstance(uuid, str) and uuid:
        label += f" ({uuid[:12]}…)" if len(uuid) > 12 else f" ({uuid})"
    return label


def _per_gpu(
    condition: Condition, gpus: list[status.GPUStatus], check: GPUFault, *, unread: bool = True
) -> model.Signal:
    """`unread`: whether any GPU may list facts it cannot read (False: none does, `_unread` finds none)."""
    found: list[str] = []
    for gpu in gpus:
        if not isinstance(gpu, gpu_facts.MAPPINGS):
            continue
        fault = check(gpu)
        if fault is None:
            continue
        found.append(f"{gpu_name(gpu)}: {fault}")
    if not found:
        unread_gpus = _unread(condition, gpus) if unread else None
        if unread_gpus:
            # A fact that cannot be read is no evidence either way: the condition keeps its state.
            return model.Signal(condition, None, f"unknown: {unread_gpus}")
        return _HEALTHY[condition]
    # No observed_at: the agent's stamps (observedTime, XID lastSeen) are its clock, which may be
    # minutes off; forSeconds counts from when the operator received the evidence (issue 24).
    return model.Signal(condition, True, "; ".join(found))


_HEALTHY_MESSAGES: Final = conditions.HEALTHY_MESSAGES
_HEALTHY: Final = {condition: model.Signal(condition, False, m) for condition, m in _HEALTHY_MESSAGES.items()}
"""One healthy signal per condition, shared (signals are frozen): every node kept 22 of its own (issue 29)."""


def _unread(condition: Condition, gpus: list[status.GPUStatus]) -> str | None:
    """Which GPUs cannot read a fact `condition` reads (`gpus[].unreadable`), or None."""
    fields = conditions.READS[condition]
    found = [
        f"{gpu_name(gpu)}: cannot read {', '.join(unread)}"
        for gpu in gpus
        if isinstance(gpu, gpu_facts.MAPPINGS) and (unread := faults.unreadable(gpu, fields))
    ]
    return "; ".join(found) or None


def expected_gpus(facts: status.GPUNodeStatus, node: model.NodeView) -> int | None:
    """The GPUs the node physically has: its GFD labels and capacity, and what its agent has seen."""
    return faults.expected_gpu_count(node.labels, node.gpu_capacity, faults.seen_by_agent(facts))


def _lost(facts: status.GPUNodeStatus, node: model.NodeView, gpus: list[status.GPUStatus]) -> model.Signal:
    condition = Condition.GPU_LOST
    lost = [g for g in gpus if isinstance(g, gpu_facts.MAPPINGS) and faults.gpu_lost(g) is not None]
    found = [f"{gpu_name(g)}: {faults.gpu_lost(g)}" for g in lost]
    missing = faults.missing_gpus(len(gpus), expected_gpus(facts, node))
    if missing is not None:
        found.append(missing)
    if not found:
        return _HEALTHY[condition]
    return model.Signal(condition, True, "; ".join(found))  # timed by receipt, as `_per_gpu`'s
