"""Raw per-instant signals: what the agent's facts say about each condition right now.

A signal is the evidence before hysteresis (`hysteresis.advance` turns a run of
signals into a condition). Each signal is True (a GPU shows the fault), False
(GPUs are reported and none shows it) or unknown (the facts cannot tell).

Missing data is never a fault: an absent field never makes a signal True, and
a stale agent makes every signal but AgentStale unknown, so conditions hold
their last state instead of firing or clearing on old facts.

Straggler is not here: it needs the whole cohort (see `stragglers`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from gpuhealth_api import heartbeats, status, vocabulary
from gpuhealth_operator.decisions import model, times

Condition = vocabulary.Condition

DEFAULT_HEARTBEAT_SECONDS: Final = heartbeats.DEFAULT_HEARTBEAT_SECONDS
STALE_HEARTBEATS: Final = heartbeats.STALE_HEARTBEATS
"""An agent that missed this many heartbeats is stale (DESIGN.md)."""
MAX_HEARTBEAT_SECONDS: Final = heartbeats.MAX_HEARTBEAT_SECONDS

BUSY_UTILIZATION_PERCENT: Final = 10
"""Above this a GPU counts as busy. PCIe links and clocks drop on purpose when idle, so idle is no fault."""

_NO_RECOVERY: Final = frozenset({"", vocabulary.RecoveryAction.NONE.value})

FACT_CONDITIONS: Final[tuple[Condition, ...]] = (
    Condition.ECC_UNCORRECTABLE,
    Condition.ROW_REMAP_FAILURE,
    Condition.XID_CRITICAL,
    Condition.GPU_LOST,
    Condition.RECOVERY_REQUIRED,
    Condition.THERMAL_THROTTLED,
    Condition.POWER_THROTTLED,
    Condition.PCIE_DEGRADED,
)
"""Conditions judged from one node's facts alone (AgentStale aside)."""

GPUFault = Callable[[status.GPUStatus], str | None]
"""A per-GPU check: a description of the fault, or None."""


def raw_signals(
    facts: status.GPUNodeStatus,
    node: model.NodeView,
    rule_xids: frozenset[int],
    now: datetime.datetime,
    report_age_seconds: float = 0.0,
) -> dict[Condition, model.Signal]:
    """One signal per condition of DESIGN.md's table except Straggler.

    `report_age_seconds`: how long ago the operator saw the agent's last new report (see `agent_stale`).
    """
    stale = agent_stale(facts, report_age_seconds, now)
    signals = {Condition.AGENT_STALE: stale}
    if stale.present:
        for condition in FACT_CONDITIONS:
            signals[condition] = model.Signal(condition, None, f"unknown: {stale.message}")
        return signals
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        for condition in FACT_CONDITIONS:
            signals[condition] = model.Signal(condition, None, "unknown: the agent has not reported GPUs yet")
        return signals
    checks: dict[Condition, GPUFault] = {
        Condition.ECC_UNCORRECTABLE: _ecc,
        Condition.ROW_REMAP_FAILURE: _remap,
        Condition.XID_CRITICAL: lambda gpu: _xid(gpu, rule_xids),
        Condition.RECOVERY_REQUIRED: _recovery,
        Condition.THERMAL_THROTTLED: _thermal,
        Condition.POWER_THROTTLED: _power,
        Condition.PCIE_DEGRADED: _pcie,
    }
    for condition, check in checks.items():
        signals[condition] = _per_gpu(condition, gpus, check, rule_xids)
    signals[Condition.GPU_LOST] = _lost(facts, node, gpus)
    return signals


def agent_stale(
    facts: status.GPUNodeStatus, report_age_seconds: float, now: datetime.datetime
) -> model.Signal:
    """True when the agent missed STALE_HEARTBEATS heartbeats, or never reported one.

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
    return model.Signal(condition, False, f"last agent heartbeat at {times.render(heartbeat)}")


def heartbeat_seconds(agent: Mapping[str, object]) -> float:
    """The agent's heartbeat period: its own if valid, at most MAX_HEARTBEAT_SECONDS, else the default."""
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
    condition: Condition, gpus: list[status.GPUStatus], check: GPUFault, rule_xids: frozenset[int]
) -> model.Signal:
    faults: list[str] = []
    observed: list[datetime.datetime] = []
    for gpu in gpus:
        if not isinstance(gpu, dict):
            continue
        fault = check(gpu)
        if fault is None:
            continue
        faults.append(f"{gpu_name(gpu)}: {fault}")
        when = _xid_seen(gpu, rule_xids) if condition is Condition.XID_CRITICAL else None
        when = when or times.parse(gpu.get("observedTime"))
        if when is not None:
            observed.append(when)
    if not faults:
        return model.Signal(condition, False, _HEALTHY_MESSAGES[condition])
    return model.Signal(condition, True, "; ".join(faults), observed_at=min(observed, default=None))


_HEALTHY_MESSAGES: Final[dict[Condition, str]] = {
    Condition.ECC_UNCORRECTABLE: "no uncorrectable volatile ECC errors",
    Condition.ROW_REMAP_FAILURE: "no row-remapping failure or pending remap",
    Condition.XID_CRITICAL: "no critical XID since the last GPU reset",
    Condition.RECOVERY_REQUIRED: "no GPU asks for a recovery action",
    Condition.THERMAL_THROTTLED: "no thermal slowdown",
    Condition.POWER_THROTTLED: "no hardware power brake or slowdown",
    Condition.PCIE_DEGRADED: "PCIe links at full generation and width under load",
}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _ecc(gpu: status.GPUStatus) -> str | None:
    ecc = gpu.get("ecc")
    count = _int(ecc.get("uncorrectedVolatile")) if isinstance(ecc, dict) else None
    if count is None or count <= 0:
        return None
    return f"{_plural(count, 'uncorrectable volatile ECC error')}"


def _remap(gpu: status.GPUStatus) -> str | None:
    rows = gpu.get("remappedRows")
    if not isinstance(rows, dict):
        return None
    if rows.get("failure") is True:
        return "row remapping failed"
    if rows.get("pending") is True:
        return "row remap pending a GPU reset"
    return None


def _matching_xids(gpu: status.GPUStatus, rule_xids: frozenset[int]) -> list[status.XidRecord]:
    xids = gpu.get("xids")
    if not isinstance(xids, list):
        return []
    return [
        x
        for x in xids
        if isinstance(x, dict) and _int(x.get("code")) in rule_xids and (_int(x.get("count")) or 0) > 0
    ]


def _xid(gpu: status.GPUStatus, rule_xids: frozenset[int]) -> str | None:
    # The agent reports XIDs since the GPU's last reset, so any count is current evidence.
    matching = _matching_xids(gpu, rule_xids)
    if not matching:
        return None
    ordered = sorted(matching, key=lambda x: x["code"])
    return ", ".join(f"XID {x['code']} seen {_plural(x['count'], 'time')}" for x in ordered)


def _xid_seen(gpu: status.GPUStatus, rule_xids: frozenset[int]) -> datetime.datetime | None:
    seen = (times.parse(x.get("lastSeen")) for x in _matching_xids(gpu, rule_xids))
    return min((t for t in seen if t is not None), default=None)


def _recovery(gpu: status.GPUStatus) -> str | None:
    action = gpu.get("recoveryAction")
    if not isinstance(action, str) or action in _NO_RECOVERY:
        return None
    return f"driver asks for recovery action {action}"


def _reasons(gpu: status.GPUStatus, wanted: Iterable[str]) -> list[str]:
    reasons = gpu.get("clockEventReasons")
    if not isinstance(reasons, list):
        return []
    return sorted(set(wanted).intersection(r for r in reasons if isinstance(r, str)))


def _thermal(gpu: status.GPUStatus) -> str | None:
    parts = _reasons(gpu, status.THERMAL_REASONS)
    temperature = _int(gpu.get("temperatureCelsius"))
    slowdown = _int(gpu.get("slowdownTemperatureCelsius"))
    if temperature is not None and slowdown is not None and temperature >= slowdown:
        parts.append(f"{temperature} °C ≥ slowdown {slowdown} °C")
    return ", ".join(parts) or None


def _power(gpu: status.GPUStatus) -> str | None:
    return ", ".join(_reasons(gpu, status.POWER_REASONS)) or None


def _pcie(gpu: status.GPUStatus) -> str | None:
    utilization = _int(gpu.get("utilizationPercent"))
    pcie = gpu.get("pcie")
    if utilization is None or utilization <= BUSY_UTILIZATION_PERCENT or not isinstance(pcie, dict):
        return None
    parts = []
    generation, max_generation = _int(pcie.get("generation")), _int(pcie.get("maxGeneration"))
    if generation is not None and max_generation is not None and generation < max_generation:
        parts.append(f"PCIe gen {generation} of {max_generation}")
    width, max_width = _int(pcie.get("width")), _int(pcie.get("maxWidth"))
    if width is not None and max_width is not None and width < max_width:
        parts.append(f"x{width} of x{max_width}")
    if not parts:
        return None
    return f"{', '.join(parts)} at {utilization}% utilization"


def _lost(facts: status.GPUNodeStatus, node: model.NodeView, gpus: list[status.GPUStatus]) -> model.Signal:
    condition = Condition.GPU_LOST
    faults = [
        f"{gpu_name(g)}: fell off the bus" for g in gpus if isinstance(g, dict) and g.get("lost") is True
    ]
    observed = [
        times.parse(g.get("observedTime")) for g in gpus if isinstance(g, dict) and g.get("lost") is True
    ]
    agent = facts.get("agent")
    expected_by_agent = _int(agent.get("expectedGpuCount")) if isinstance(agent, dict) else None
    expected = max((n for n in (expected_by_agent, node.gpu_capacity) if n is not None), default=None)
    if expected is not None and len(gpus) < expected:
        faults.append(f"{len(gpus)} of {_plural(expected, 'GPU')} reported")
    if not faults:
        return model.Signal(condition, False, "all GPUs present")
    return model.Signal(
        condition, True, "; ".join(faults), observed_at=min((t for t in observed if t), default=None)
    )
