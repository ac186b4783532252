"""Faults: what is wrong with a GPU or a node, defined once for every program.

`gpu-health-agent check` on a node and the operator in the cluster read the
same facts (GPUNode status, `status.py`) and must never give two answers to
them. So each fault is one pure predicate here, and both call it (through its row in
`conditions`, which says what else is known of each condition): a per-GPU
predicate returns a short description of the fault, or None when the GPU does
not show it.

Missing data is never a fault: an absent or malformed field never makes a
predicate fire (the operator reads these facts from the cluster, where any
field may be missing or of the wrong type).

The node-level fact is the GPU count the node physically has
(`expected_gpu_count`): time-slicing, MPS and MIG multiply the schedulable
`nvidia.com/gpu` capacity, so it is never the capacity itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol, cast

from gpuhealth_api import keys, status, vocabulary

Condition = vocabulary.Condition

BUSY_UTILIZATION_PERCENT: Final = 10
"""Above this a GPU counts as busy. PCIe links and clocks drop on purpose when idle, so idle is no fault."""

MAX_GPUS: Final = 64
"""The most GPUs one node's status lists (the CRD's maxItems for `status.gpus`)."""

MIG_STRATEGIES: Final[frozenset[str]] = frozenset({"single", "mixed"})
"""Values of GFD's `nvidia.com/mig.strategy` label on a node whose GPUs are split into MIG devices."""

_NO_RECOVERY: Final = frozenset({"", vocabulary.RecoveryAction.NONE.value})

TREND_WINDOW_SECONDS: Final = 3600.0
"""A counter's growth per hour is its growth over the last hour the operator saw (less if it has seen
less, never divided by less than the hour): a burst just after the operator started is no high rate."""

NVLINK_THRESHOLD: Final = 100.0
NIC_THRESHOLD: Final = 100.0
"""Per hour, the default growth tolerated (`conditions.DEFAULT_THRESHOLDS`): a healthy link counts a few
errors a day; a failing one thousands an hour."""
PCIE_ERRORS_THRESHOLD: Final = 0.0
"""Non-fatal AER errors: any growth."""
MEMORY_THRESHOLD: Final = 10.0
"""Corrected ECC errors and correctable row remaps: a healthy HBM stack counts none for days."""

FABRIC_PENDING: Final = frozenset({"NotStarted", "InProgress"})
"""NVML fabric states of a registration not completed (`gpus[].fabric.state`)."""
FABRIC_COMPLETED: Final = "Completed"
FABRIC_SUCCESS: Final = "Success"
NIC_ACTIVE: Final = "ACTIVE"
NIC_DOWN: Final = "DOWN"
NIC_DISABLED: Final = "Disabled"
"""The physState of a port an administrator disabled (`ibportstate ... disable`): DOWN on purpose."""
MEMORY_DEGRADING_XID: Final = 92
"""XID 92: high single-bit ECC error rate (the driver's own pre-failure warning)."""

GPUFault = Callable[[status.GPUStatus], str | None]
"""A per-GPU predicate: a description of the fault, or None."""


def _int(value: object) -> int | None:
    if type(value) is int:  # the common case, first: every predicate of every GPU of every report asks
        return value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# --- per GPU ----------------------------------------------------------------------------------------------


def gpu_lost(gpu: status.GPUStatus) -> str | None:
    """GPULost on one GPU: NVML said GPU_IS_LOST, or a GPU seen earlier vanished from enumeration."""
    return "fell off the bus" if gpu.get("lost") is True else None


def ecc_uncorrectable(gpu: status.GPUStatus) -> str | None:
    """EccUncorrectable: volatile (since the last reset) double-bit ECC errors."""
    ecc = gpu.get("ecc")
    count = _int(ecc.get("uncorrectedVolatile")) if isinstance(ecc, dict) else None
    if count is None or count <= 0:
        return None
    return plural(count, "uncorrectable volatile ECC error")


def _uncorrectable_since_reset(gpu: status.GPUStatus) -> bool:
    ecc = gpu.get("ecc")
    count = _int(ecc.get("uncorrectedVolatile")) if isinstance(ecc, dict) else None
    return count is not None and count > 0


def _pending_cause(counts: object, key: str) -> str | None:
    """Why a pending remap (`remappedRows`, key `uncorrectable`) or page retirement (`retiredPages`, key
    `doubleBit`) may be for an uncorrectable error; None when it can only be for correctable ones.

    NVML counts remapped rows (and retired pages) by cause over the GPU's life, never the cause of the
    pending one, so it is judged uncorrectable where any is: rows or pages already repaired for
    uncorrectable errors, or a count the agent did not report (the cause cannot be told).
    """
    count = _int(counts.get(key)) if isinstance(counts, dict) else None
    if count is None:
        return "its cause not reported"
    if count > 0:
        return f"{count} for uncorrectable errors"
    return None


def row_remap_failure(gpu: status.GPUStatus) -> str | None:
    """RowRemapFailure: a remap failed, or one that may be for an uncorrectable error waits for a GPU reset;
    on GPUs that retire pages instead (before Ampere), a retirement for a double-bit error waits for one.

    A pending remap for correctable errors alone is MemoryDegrading (NVIDIA: unaffected work keeps
    running and new work may start until the reset applies it); docs/conditions.md gives the sources.
    """
    rows = gpu.get("remappedRows")
    if isinstance(rows, dict):
        if rows.get("failure") is True:
            return "row remapping failed"
        if rows.get("pending") is True and (cause := _pending_cause(rows, "uncorrectable")) is not None:
            return f"row remap pending a GPU reset (remapped rows: {cause})"
    pages = gpu.get("retiredPages")
    if isinstance(pages, dict) and pages.get("pending") is True:
        cause = _pending_cause(pages, "doubleBit")
        if cause is not None:
            return f"page retirement pending a GPU reset, no new work until then (retired pages: {cause})"
    return None


def matching_xids(gpu: status.GPUStatus, codes: frozenset[int]) -> list[status.XidRecord]:
    """The GPU's XID records (since its last reset) whose code is in `codes`."""
    xids = gpu.get("xids")
    if not isinstance(xids, list):
        return []
    return [
        x
        for x in xids
        if isinstance(x, dict) and _int(x.get("code")) in codes and (_int(x.get("count")) or 0) > 0
    ]


def xid_critical(gpu: status.GPUStatus, codes: frozenset[int]) -> str | None:
    """XidCritical: one of `codes` (the rule's, else the catalogue's critical ones) since the last reset."""
    # The agent reports XIDs since the GPU's last reset, so any count is current evidence.
    matching = matching_xids(gpu, codes)
    if not matching:
        return None
    ordered = sorted(matching, key=lambda x: x["code"])
    return ", ".join(f"XID {x['code']} seen {plural(x['count'], 'time')}" for x in ordered)


def recovery_required(gpu: status.GPUStatus) -> str | None:
    """RecoveryRequired: the driver asks for a GPU reset, a reboot or a drain."""
    action = gpu.get("recoveryAction")
    if not isinstance(action, str) or action in _NO_RECOVERY:
        return None
    return f"driver asks for recovery action {action}"


_GPU_RECOVERY: Final = frozenset(a.value for a in vocabulary.GPU_RECOVERY_ACTIONS)
_P2P: Final = "peer-to-peer traffic on every GPU that talks to it"
_NODE_WIDE_CURES: Final[Mapping[str, str]] = {
    vocabulary.RecoveryAction.NODE_REBOOT.value: "a node reboot",
    vocabulary.RecoveryAction.SYSTEM_REBOOT.value: "a system reboot",
    vocabulary.RecoveryAction.RECOVER_IMEX_DOMAIN.value: "a recovery of the IMEX domain",
    vocabulary.RecoveryAction.DRAIN_P2P.value: f"a drain of {_P2P}",
    vocabulary.RecoveryAction.DRAIN_AND_RESET.value: f"a drain of {_P2P}, then a GPU reset",
}


def node_wide_recovery(gpu: status.GPUStatus) -> str | None:
    """Why the GPU's recovery action needs the whole node, or None (no action, or one for this GPU alone).

    Only a GPU reset or a reset of its PCIe bus touches one GPU (`vocabulary.GPU_RECOVERY_ACTIONS`);
    an action this version does not know is node-wide: it is never safe to guess it is smaller.
    """
    action = gpu.get("recoveryAction")
    if not isinstance(action, str) or action in _NO_RECOVERY or action in _GPU_RECOVERY:
        return None
    cure = _NODE_WIDE_CURES.get(action)
    if cure is None:
        return f"the driver asks for recovery action {action}, unknown to this version"
    return f"the driver asks for {cure} (recovery action {action})"


def unreadable(gpu: status.GPUStatus, fields: Iterable[str]) -> list[str]:
    """The facts under `fields` (top-level GPU fields, `conditions.READS`) the agent reports it cannot read.

    Such a fact is absent from the status (never its last good value), so a predicate that reads
    it finds nothing: the caller must treat that as "cannot tell", not as "healthy".
    """
    listed = gpu.get("unreadable")
    if not isinstance(listed, list):
        return []
    wanted = frozenset(fields)
    return [path for path in listed if isinstance(path, str) and path.split(".", 1)[0] in wanted]


def _reasons(gpu: status.GPUStatus, wanted: Iterable[str]) -> list[str]:
    reasons = gpu.get("clockEventReasons")
    if not reasons or not isinstance(reasons, list):
        return []  # most reports of most GPUs: no reason at all
    return sorted(set(wanted).intersection(r for r in reasons if isinstance(r, str)))


def thermal_throttled(gpu: status.GPUStatus) -> str | None:
    """ThermalThrottled: a HW or SW thermal slowdown, or at or above the slowdown temperature."""
    parts = _reasons(gpu, status.THERMAL_REASONS)
    temperature = _int(gpu.get("temperatureCelsius"))
    slowdown = _int(gpu.get("slowdownTemperatureCelsius"))
    if temperature is not None and slowdown is not None and temperature >= slowdown:
        parts.append(f"{temperature} °C ≥ slowdown {slowdown} °C")
    return ", ".join(parts) or None


def power_throttled(gpu: status.GPUStatus) -> str | None:
    """PowerThrottled: the HW power brake or a HW slowdown."""
    return ", ".join(_reasons(gpu, status.POWER_REASONS)) or None


def pcie_degraded(gpu: status.GPUStatus) -> str | None:
    """PcieDegraded: below the link's max generation or width while busy (links idle down on purpose)."""
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


# --- trends: what the operator remembers of earlier reports ------------------------------------------------


class Trend(Protocol):
    """What earlier reports said of one GPU or one NIC port (the operator's memory, `decisions.trends`).

    `check` reads one report and remembers nothing (`NO_TREND`): the trend parts of a predicate never
    fire there, only the parts one report shows."""

    def most(self, path: str) -> float | None:
        """The highest value of a PEAKS fact (`nvlink.linksUp`, `rateGbps`, `active`) seen; None: never."""
        ...

    def per_hour(self, path: str) -> float | None:
        """A COUNTERS fact's growth over the last TREND_WINDOW_SECONDS, per hour; None: not tracked.

        A counter that went down (a GPU reset, a reboot, a driver reload) starts over: no growth."""
        ...


class _NoTrend:
    def most(self, path: str) -> float | None:
        return None

    def per_hour(self, path: str) -> float | None:
        return None


NO_TREND: Final[Trend] = _NoTrend()
"""Nothing remembered: a single report (`check`, the first report the operator sees)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TrendValues:
    """A Trend's answers, worked out beforehand (`decisions.trends.Trends.read`): each predicate of each
    GPU reads them as data, not one call into the memory per counter (issue 46). A path absent from
    `peaks` (`rates`) answers None, as `Trend.most` (`Trend.per_hour`) of a fact never seen."""

    peaks: Mapping[str, float]
    rates: Mapping[str, float]

    def most(self, path: str) -> float | None:
        return self.peaks.get(path)

    def per_hour(self, path: str) -> float | None:
        return self.rates.get(path)


History = Callable[[status.GPUStatus], Trend]
"""A GPU's trend, looked up by the GPU's facts (its UUID or index)."""


def no_history(gpu: status.GPUStatus) -> Trend:
    return NO_TREND


NVLINK_COUNTERS: Final = ("nvlink.crcErrors", "nvlink.replayErrors", "nvlink.recoveryErrors")
PCIE_ERROR_COUNTERS: Final = ("pcie.aer.nonFatal",)
MEMORY_COUNTERS: Final = ("ecc.correctedVolatile", "ecc.correctedAggregate", "remappedRows.correctable")
"""The GPU counters whose growth per hour a trend predicate judges against the rule's threshold."""
GPU_PEAKS: Final = ("nvlink.linksUp",)
"""GPU facts whose highest value the operator remembers."""
NIC_COUNTERS: Final = ("linkDowned", "symbolErrors", "rcvErrors")
NIC_PEAKS: Final = ("active", "rateGbps")
"""NIC port facts whose highest value the operator remembers; `active` is 1 while the state is ACTIVE."""


def fact(record: Mapping[str, object], path: str) -> int | float | None:
    """A numeric fact at a dotted path (`nvlink.crcErrors`); None when absent or not a number.

    `active` of a NIC port is 1 while its state is ACTIVE, else 0 (absent without a state)."""
    if path == "active":
        state = record.get("state")
        return None if not isinstance(state, str) else int(state == NIC_ACTIVE)
    parts = _PATHS.get(path)
    if parts is None:
        parts = _PATHS[path] = tuple(path.split("."))
    value: object = record
    for part in parts:
        if not is_mapping(value):
            return None
        value = value.get(part)  # type: ignore[attr-defined]  # is_mapping: a Mapping
    kind = type(value)
    if kind is int or kind is float:  # nearly every fact: no bool, no subclass to ask about
        return value  # type: ignore[return-value]  # int or float, as tested
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


_PATHS: Final[dict[str, tuple[str, ...]]] = {}
"""Each dotted path's parts, split once: `fact` runs per counter per GPU per report (issue 52)."""
_MAPPING_TYPES: Final[set[type]] = {dict}
"""The types found to be Mappings: `isinstance` against the ABC costs a call into `abc` each time, and the
cache's read-only facts (a class of their own) are asked millions of times in a backtest (issue 52)."""


def is_mapping(value: object) -> bool:
    """`isinstance(value, Mapping)`, remembering the types found to be one (a class stays one)."""
    kind = type(value)
    if kind in _MAPPING_TYPES:
        return True
    if isinstance(value, Mapping):
        _MAPPING_TYPES.add(kind)
        return True
    return False


def _growing(record: Mapping[str, object], trend: Trend, paths: Iterable[str], threshold: float) -> list[str]:
    found = []
    for path in paths:
        rate = trend.per_hour(path)
        if rate is not None and rate > threshold:
            found.append(f"{path.rsplit('.', 1)[-1]} +{rate:g}/h (over {threshold:g}/h)")
    return found


def nvlink_degraded(
    gpu: status.GPUStatus, trend: Trend = NO_TREND, threshold: float = NVLINK_THRESHOLD
) -> str | None:
    """NvLinkDegraded: a link down that should be up (fewer links up than the most `trend` knows of, with
    links down: the most the operator saw, or what the GPU's cohort has up, `decisions.trends.Expected`),
    or CRC/replay/recovery errors growing faster than `threshold` per hour."""
    nvlink = gpu.get("nvlink")
    if not isinstance(nvlink, dict):
        return None  # no NVLink on this board (NOT_SUPPORTED is absent)
    parts = []
    up, down, most = _int(nvlink.get("linksUp")), _int(nvlink.get("linksDown")), trend.most("nvlink.linksUp")
    if up is not None and down is not None and down > 0 and most is not None and up < most:
        parts.append(f"{plural(down, 'link')} down ({up} of {most:g} up)")
    parts += _growing(gpu, trend, NVLINK_COUNTERS, threshold)
    return ", ".join(parts) or None


def fabric_unhealthy(gpu: status.GPUStatus) -> str | None:
    """FabricUnhealthy: NVSwitch fabric registration completed with a failure, or not completed (the rule's
    forSeconds says how long that may last). Absent or NotSupported: no fabric, no fault."""
    fabric = gpu.get("fabric")
    if not isinstance(fabric, dict):
        return None
    state = fabric.get("state")
    if state == FABRIC_COMPLETED:
        result = fabric.get("status")
        if isinstance(result, str) and result and result != FABRIC_SUCCESS:
            return f"fabric registration failed ({result})"
        return None
    if state in FABRIC_PENDING:
        return f"fabric registration not completed ({state})"
    return None


def pcie_errors(
    gpu: status.GPUStatus, trend: Trend = NO_TREND, threshold: float = PCIE_ERRORS_THRESHOLD
) -> str | None:
    """PcieErrors: a fatal AER error since boot, or non-fatal AER errors growing faster than `threshold`/h."""
    pcie = gpu.get("pcie")
    aer = pcie.get("aer") if isinstance(pcie, dict) else None
    if not isinstance(aer, dict):
        return None  # no AER reporting for this function
    parts = []
    fatal = _int(aer.get("fatal"))
    if fatal is not None and fatal > 0:
        parts.append(plural(fatal, "fatal AER error"))
    parts += [f"non-fatal AER {p}" for p in _growing(gpu, trend, PCIE_ERROR_COUNTERS, threshold)]
    return ", ".join(parts) or None


def memory_degrading(
    gpu: status.GPUStatus, trend: Trend = NO_TREND, threshold: float = MEMORY_THRESHOLD
) -> str | None:
    """MemoryDegrading (pre-failure): XID 92, a page retirement or row remap pending for correctable errors
    alone, or corrected ECC errors or correctable row remaps growing faster than `threshold` per hour."""
    parts = []
    if matching_xids(gpu, frozenset({MEMORY_DEGRADING_XID})):
        parts.append(f"XID {MEMORY_DEGRADING_XID} (high single-bit ECC rate)")
    # A pending repair that is not RowRemapFailure's is for correctable errors alone, applied at the next
    # reset; unless an uncorrectable error came since the last reset (a pending repair is always younger
    # than the reset that will apply it): then it may be that error's, which EccUncorrectable judges.
    if not _uncorrectable_since_reset(gpu):
        pages = gpu.get("retiredPages")
        pending = isinstance(pages, dict) and pages.get("pending") is True
        if pending and _pending_cause(pages, "doubleBit") is None:
            parts.append("retired pages pending a GPU reset (single-bit errors only)")
        rows = gpu.get("remappedRows")
        if (
            isinstance(rows, dict)
            and rows.get("pending") is True
            and rows.get("failure") is not True
            and _pending_cause(rows, "uncorrectable") is None
        ):
            parts.append("row remap pending a GPU reset (correctable errors only)")
    parts += _growing(gpu, trend, MEMORY_COUNTERS, threshold)
    return ", ".join(parts) or None


def nic_degraded(nic: status.Nic, trend: Trend = NO_TREND, threshold: float = NIC_THRESHOLD) -> str | None:
    """NicDegraded on one port: DOWN while its physState is not Disabled (not switched off by an
    administrator), another state than ACTIVE after the operator saw it ACTIVE, a rate below the highest
    seen, or link-down / symbol / receive errors growing faster than `threshold` per hour."""
    parts = []
    state = nic.get("state")
    phys = nic.get("physState")
    if state == NIC_DOWN and isinstance(phys, str) and phys != NIC_DISABLED:
        # Down without an administrator disabling it (Polling: no peer, a cable or switch port gone): a
        # fault from one report, whatever the operator saw before (issue 45, item 7: a restart forgot it).
        parts.append(f"{state} (physState {phys})")
    elif isinstance(state, str) and state != NIC_ACTIVE and trend.most("active") == 1:
        parts.append(f"{state} (was {NIC_ACTIVE})")
    rate, most = fact(nic, "rateGbps"), trend.most("rateGbps")
    if state == NIC_ACTIVE and rate is not None and most is not None and rate < most:
        parts.append(f"{rate:g} Gb/s of {most:g}")
    parts += _growing(nic, trend, NIC_COUNTERS, threshold)
    return ", ".join(parts) or None


def nic_name(nic: status.Nic) -> str:
    """`mlx5_0/1`: the device and port, as in /sys/class/infiniband."""
    return f"{nic.get('name', '?')}/{nic.get('port', '?')}"


def nic_faults(
    nics: object, threshold: float = NIC_THRESHOLD, history: Callable[[status.Nic], Trend] | None = None
) -> list[str]:
    """NicDegraded of the node: one `mlx5_0/1: ...` per degraded port of `status.nics`."""
    if not isinstance(nics, list):
        return []
    found = []
    for nic in nics:
        if isinstance(nic, dict):
            port = cast(status.Nic, nic)  # read from the cluster: each field is checked where read
            fault = nic_degraded(port, history(port) if history else NO_TREND, threshold)
            if fault is not None:
                found.append(f"{nic_name(port)}: {fault}")
    return found


# --- per node -----------------------------------------------------------------------------------------------


def _count(value: object) -> int | None:
    """A positive count from a label value, an int or a digit string; None for anything else."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    number = _int(value)
    return number if number is not None and number > 0 else None


def expected_gpu_count(labels: Mapping[str, str], capacity: int | None, seen: int | None) -> int | None:
    """How many GPUs the node physically has; None when nothing tells.

    - MIG nodes (GFD's `nvidia.com/mig.strategy` single or mixed): neither the
      capacity nor GFD's `nvidia.com/gpu.count` counts physical GPUs (with the
      single strategy GFD writes the MIG device count there, e.g. 56 for 8 GPUs of 7),
      so only what the agent saw: the physical GPUs NVML enumerates.
    - Elsewhere: GFD's `nvidia.com/gpu.count`; else the `nvidia.com/gpu`
      capacity ÷ `nvidia.com/gpu.replicas` (time-slicing, MPS); else what the
      agent saw. Never the bare capacity, which sharing multiplies.

    `seen` is the most GPUs the agent has seen on the node at once. It is a
    floor in every case: a GPU that fell off the bus makes GFD relabel the
    node with one GPU fewer, and that must not hide the loss. The result is
    capped at MAX_GPUS.
    """
    seen = _count(seen)
    source: int | None = None
    if labels.get(keys.MIG_STRATEGY_LABEL) not in MIG_STRATEGIES:
        source = _count(labels.get(keys.GPU_COUNT_LABEL))
        replicas = _count(labels.get(keys.GPU_REPLICAS_LABEL))
        advertised = _count(capacity)
        if source is None and replicas is not None and advertised is not None:
            source = advertised // replicas or None
    expected = max((n for n in (source, seen) if n is not None), default=None)
    return None if expected is None else min(expected, MAX_GPUS)


def seen_by_agent(facts: status.GPUNodeStatus) -> int | None:
    """The most GPUs the node's agent has seen: `maxGpuCountSeen`, or its `expectedGpuCount` (the
    agent's own reading of `expected_gpu_count`, or a simulated scenario's count) when larger."""
    agent = facts.get("agent")
    if not isinstance(agent, dict):
        return None
    counts = (_int(agent.get("maxGpuCountSeen")), _int(agent.get("expectedGpuCount")))
    return max((n for n in counts if n is not None), default=None)


def missing_gpus(reported: int, expected: int | None) -> str | None:
    """GPULost on a node: fewer GPUs reported than it physically has."""
    if expected is None or reported >= expected:
        return None
    return f"{reported} of {plural(expected, 'GPU')} reported"
