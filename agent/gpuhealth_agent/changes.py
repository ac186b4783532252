"""Which facts matter: the pure rules that decide when a GPU "changed" and when to write.

The agent must be polite to the API server: a temperature that wiggles by a
degree, power draw and utilisation change every sample and would turn every
sample into a write. So the agent writes at once only when a *significant*
fact changes (counters, lost, XIDs, throttle state, crossing the slowdown
threshold, recovery action, PCIe link, GPU identity) and otherwise refreshes
everything on the heartbeat. The same view stamps `observedTime`, so it marks
the moment a fault was first read, not the last wiggle.

Wave 3's facts: an NVLink going down or up, any change of fabric info, a
PCIe AER fatal or non-fatal count, and a NIC port's state, physical state,
rate or link-down count (a flap between two samples shows only there) write
at once. Counters that grow in normal operation and are judged as a rate
per hour (NVLink CRC/replay/recovery errors, AER correctable, NIC symbol and
receive errors) wait for the heartbeat: a rate over an hour loses nothing by
a minute's delay, and a noisy link must not turn every sample into a write.

Which facts those are is not written here: every fact a condition's row reads
(`gpuhealth_api.conditions`) is significant unless its row says it waits for
the heartbeat, so a new condition's facts are written at once without an edit
here; `PROJECTIONS` only says where less than a field's whole value counts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import conditions, status

BENIGN_CLOCK_EVENT_REASONS: Final[frozenset[str]] = frozenset(
    {"GpuIdle", "ApplicationsClocksSetting", "SyncBoost", "DisplayClockSetting"}
)
"""Clock-event reasons that are not throttling: an idle GPU or a deliberate clock setting."""


def throttle_reasons(gpu: status.GPUStatus) -> list[str]:
    """The active clock-event reasons that do slow the GPU down, sorted."""
    return sorted(set(gpu.get("clockEventReasons", [])) - BENIGN_CLOCK_EVENT_REASONS)


def is_hot(gpu: status.GPUStatus) -> bool | None:
    temperature = gpu.get("temperatureCelsius")
    threshold = gpu.get("slowdownTemperatureCelsius")
    if temperature is None or threshold is None:
        return None
    return temperature >= threshold


def pcie_view(gpu: status.GPUStatus) -> dict[str, Any] | None:
    """The PCIe facts worth a write: link and replays as before, AER fatal and non-fatal (not correctable)."""
    pcie = gpu.get("pcie")
    if pcie is None:
        return None
    view: dict[str, Any] = {k: v for k, v in pcie.items() if k != "aer"}
    aer = pcie.get("aer")
    if aer is not None:
        view["aer"] = {"fatal": aer.get("fatal"), "nonFatal": aer.get("nonFatal")}
    return view


def _xids_view(gpu: status.GPUStatus) -> list[tuple[int, int]]:
    return [(x["code"], x["count"]) for x in gpu.get("xids", [])]


def _lost_view(gpu: status.GPUStatus) -> bool:
    return gpu.get("lost", False)


def _unreadable_view(gpu: status.GPUStatus) -> list[str]:
    return gpu.get("unreadable", [])


IDENTITY: Final[tuple[tuple[str, Callable[[status.GPUStatus], Any]], ...]] = (
    ("index", lambda gpu: gpu.get("index")),
    ("uuid", lambda gpu: gpu.get("uuid")),
    ("model", lambda gpu: gpu.get("model")),
    ("pciBusId", lambda gpu: gpu.get("pciBusId")),
    ("unreadable", _unreadable_view),
)
"""GPU facts whose change is worth a write whatever the conditions read: which GPU it is, what it cannot
read."""

PROJECTIONS: Final[Mapping[str, Callable[[status.GPUStatus], Any]]] = {
    "lost": _lost_view,
    "xids": _xids_view,
    "clockEventReasons": throttle_reasons,
    "temperatureCelsius": is_hot,
    "slowdownTemperatureCelsius": is_hot,
    "pcie": pcie_view,
}
"""Where less than a field's whole value is significant: an XID's count, not when it was last seen; the
clock-event reasons that slow the GPU; a temperature's side of the slowdown threshold; the PCIe link and its
AER fatal and non-fatal counts. Any other field a condition reads (`conditions.SIGNIFICANT_GPU_PATHS`) is
compared whole, or by the keys its rows do not leave for the heartbeat."""


def _nested(field: str, keys: frozenset[str]) -> Callable[[status.GPUStatus], Any]:
    ordered = sorted(keys)

    def view(gpu: status.GPUStatus) -> Any:
        value = gpu.get(field)
        found = value if isinstance(value, Mapping) else {}
        return {key: found.get(key) for key in ordered}

    return view


def _whole(field: str) -> Callable[[status.GPUStatus], Any]:
    return lambda gpu: gpu.get(field)


_VIEWS: Final[tuple[tuple[str, Callable[[status.GPUStatus], Any]], ...]] = (
    *IDENTITY,
    *(
        (
            field,
            PROJECTIONS.get(field) or (_whole(field) if keys is None else _nested(field, keys)),
        )
        for field, keys in conditions.SIGNIFICANT_GPU_PATHS.items()
    ),
)


def gpu_view(gpu: status.GPUStatus) -> dict[str, Any]:
    """The facts of one GPU whose change is worth a write (and a new observedTime): its identity, and every
    fact a condition reads but those its row leaves for the heartbeat (`conditions.ROWS`)."""
    return {field: view(gpu) for field, view in _VIEWS}


NIC_IDENTITY: Final = ("name", "port", "physState")


def nic_view(nic: status.Nic) -> tuple[Any, ...]:
    """The port facts worth a write (module doc): its name, physical state and what NicDegraded reads but
    its error counters (`conditions.SIGNIFICANT_NIC_FIELDS`)."""
    return tuple(nic.get(key) for key in (*NIC_IDENTITY, *conditions.SIGNIFICANT_NIC_FIELDS))


def fingerprint(node: status.GPUNodeStatus) -> str:
    """A stable string of everything significant in the agent's part of the status."""
    agent = node.get("agent", {})
    summary = node.get("summary", {})
    view = {
        "driverVersion": agent.get("driverVersion"),
        "expectedGpuCount": agent.get("expectedGpuCount"),
        "maxGpuCountSeen": agent.get("maxGpuCountSeen"),
        "heartbeatSeconds": agent.get("heartbeatSeconds"),
        "error": agent.get("error"),
        "released": agent.get("released"),  # the operator waits for it before a reset: at once
        "canRelease": agent.get("canRelease"),
        "gpuCount": summary.get("gpuCount"),
        "model": summary.get("model"),
        "gpus": [gpu_view(g) for g in node.get("gpus", [])],
        "nics": [nic_view(n) for n in node.get("nics", [])] if "nics" in node else None,
    }
    return json.dumps(view, sort_keys=True, default=str)


class WriteReason(enum.StrEnum):
    FIRST = "first"
    CHANGE = "change"
    HEARTBEAT = "heartbeat"
    RETRY = "retry"


@dataclasses.dataclass(frozen=True)
class WriteState:
    """What was last written successfully (fingerprint, time) and whether a write is owed."""

    fingerprint: str | None = None
    written_at: float | None = None
    pending: bool = False
    """A write was due but failed or was deferred by backoff: retry with the latest state."""


def write_reason(state: WriteState, current: str, now: float, heartbeat_seconds: float) -> WriteReason | None:
    """Why the agent should write now, or None to stay quiet."""
    if state.written_at is None or state.fingerprint is None:
        return WriteReason.RETRY if state.pending else WriteReason.FIRST
    if current != state.fingerprint:
        return WriteReason.CHANGE
    if state.pending:
        return WriteReason.RETRY
    if now - state.written_at >= heartbeat_seconds:
        return WriteReason.HEARTBEAT
    return None


def summarize(gpus: Sequence[status.GPUStatus]) -> status.Summary:
    """Node-level facts: GPUs that answer, the first GPU's model, the hottest temperature."""
    answering = [g for g in gpus if not g.get("lost", False)]
    summary = status.Summary(gpuCount=len(answering))
    models = [g["model"] for g in gpus if "model" in g]
    if models:
        summary["model"] = models[0]
    temperatures = [g["temperatureCelsius"] for g in answering if "temperatureCelsius" in g]
    if temperatures:
        summary["maxTemperatureCelsius"] = max(temperatures)
    return summary
