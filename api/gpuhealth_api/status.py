"""Shapes of GPUNode status as stored in the cluster (camelCase, as in the CRD).

The agent writes `agent`, `summary` and `gpus`; the operator writes
`health`, `issues`, `action`, `conditions` and `straggler`. Every GPU field
is optional: an NVML query a GPU does not support leaves its field absent,
and absent never means zero.
"""

from typing import TypedDict


class EccCounts(TypedDict, total=False):
    correctedVolatile: int
    uncorrectedVolatile: int
    correctedAggregate: int
    uncorrectedAggregate: int


class RetiredPages(TypedDict, total=False):
    doubleBit: int
    pending: bool


class RemappedRows(TypedDict, total=False):
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


class XidRecord(TypedDict):
    code: int
    count: int
    lastSeen: str  # RFC 3339


class PcieAer(TypedDict, total=False):
    """PCIe Advanced Error Reporting totals of the GPU's PCI function (sysfs aer_dev_*; since boot)."""

    fatal: int
    nonFatal: int
    correctable: int


class Pcie(TypedDict, total=False):
    generation: int
    maxGeneration: int
    width: int
    maxWidth: int
    replayCounter: int
    aer: PcieAer


class NvLink(TypedDict, total=False):
    """NVLink of one GPU (NVML); absent on boards without NVLink. Counters are summed over active links."""

    linksUp: int
    linksDown: int
    crcErrors: int
    replayErrors: int
    recoveryErrors: int


class Fabric(TypedDict, total=False):
    """NVML GPU fabric info (NVSwitch / NVL72 systems); absent where NVML does not support it."""

    state: str  # NotSupported | NotStarted | InProgress | Completed
    status: str  # NVML's return name of the registration (Success, ...)
    cliqueId: int


class Nic(TypedDict, total=False):
    """One InfiniBand/RoCE port from sysfs (/sys/class/infiniband/<name>/ports/<port>)."""

    name: str
    port: int
    state: str  # ACTIVE | DOWN | INIT | ARMED | ...
    physState: str  # LinkUp | Disabled | Polling | ...
    rateGbps: float
    linkDowned: int
    symbolErrors: int
    rcvErrors: int


class GPUStatus(TypedDict, total=False):
    index: int
    uuid: str
    model: str
    pciBusId: str
    serial: str
    temperatureCelsius: int
    slowdownTemperatureCelsius: int
    powerWatts: float
    powerLimitWatts: float
    smClockMHz: int
    maxSmClockMHz: int
    utilizationPercent: int
    memoryUsedMiB: int
    memoryTotalMiB: int
    ecc: EccCounts
    retiredPages: RetiredPages
    remappedRows: RemappedRows
    xids: list[XidRecord]
    clockEventReasons: list[str]
    throttledSince: str  # RFC 3339: when any clock-event reason other than idle began
    recoveryAction: str  # vocabulary.RecoveryAction
    pcie: Pcie
    nvlink: NvLink
    fabric: Fabric
    lost: bool
    unreadable: list[str]  # facts (status paths) NVML keeps failing to read: absent, not their last value
    observedTime: str  # RFC 3339: when the agent last read a fact of this GPU that changed


class AgentError(TypedDict, total=False):
    reason: str  # vocabulary.AgentErrorReason
    message: str
    since: str  # RFC 3339: when this agent process first found the error


class AgentInfo(TypedDict, total=False):
    version: str
    backend: str  # nvml | sim
    driverVersion: str
    lastHeartbeatTime: str  # RFC 3339
    heartbeatSeconds: int
    expectedGpuCount: int  # GPUs the node physically has (faults.expected_gpu_count), if known
    maxGpuCountSeen: int  # the most GPUs the agent has seen answer at once on this node
    bootId: str  # the kernel's boot ID: a change means the node rebooted (and its GPUs were reset)
    bootTime: str  # RFC 3339, the node's clock (/proc/stat btime): when that boot began
    error: AgentError  # the agent cannot report its GPUs (it sees none): the node is Unknown, not faulty
    canRelease: bool  # the agent lets go of NVML on request (GPUNode annotation gpuhealth.io/release-gpus)
    released: str  # the release ask answered: NVML is shut for a reset (issue 48)


class Summary(TypedDict, total=False):
    gpuCount: int
    model: str
    maxTemperatureCelsius: int


class ConditionStatus(TypedDict, total=False):
    type: str
    status: str  # True | False | Unknown
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int
    observedSince: str  # RFC 3339: the raw signal's first sighting in this episode
    recoveringSince: str  # RFC 3339: first sighting of its absence while still True


class StragglerStatus(TypedDict, total=False):
    score: float
    zScore: float
    peers: int


class IsolatedGPUStatus(TypedDict, total=False):
    index: int
    uuid: str
    rule: str
    state: str
    since: str


class PolicyVerdictStatus(TypedDict, total=False):
    policy: str
    dryRun: bool
    health: str
    issues: str
    action: str


class RepairStatus(TypedDict, total=False):
    time: str  # RFC 3339
    cycle: int
    step: str  # spec.repair.steps[].name
    action: str  # ResetGPU | RebootNode | Validation
    gpus: list[str]  # GPU UUIDs
    result: str  # vocabulary.RepairResult
    message: str
    fault: str  # the issues that began the cycle (a step's Started, Retired)


class CheckStatus(TypedDict, total=False):
    name: str  # spec.activeChecks[].name
    template: str
    policy: str
    started: str  # RFC 3339
    time: str  # RFC 3339: the run's end
    result: str  # vocabulary.CheckResult
    figures: dict[str, float]
    message: str
    requestId: str  # the on-demand request's token (keys.CHECK_NOW_ANNOTATION)


class GPUNodeStatus(TypedDict, total=False):
    agent: AgentInfo
    summary: Summary
    gpus: list[GPUStatus]
    nics: list[Nic]  # node-level InfiniBand/RoCE ports; absent without /sys/class/infiniband
    health: str
    issues: str
    action: str
    conditions: list[ConditionStatus]
    policies: list[PolicyVerdictStatus]  # each selecting policy's verdict, when more than one selects
    straggler: StragglerStatus
    isolatedGPUs: list[IsolatedGPUStatus]
    isolatedFraction: str
    repairs: list[RepairStatus]  # repair history (spec.repair), oldest first, the last 20
    checks: list[CheckStatus]  # active checks' runs (spec.activeChecks), oldest first, the last 20


# Clock-event reason names as the agent reports them (NVML nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x0000000000000001: "GpuIdle",
    0x0000000000000002: "ApplicationsClocksSetting",
    0x0000000000000004: "SwPowerCap",
    0x0000000000000008: "HwSlowdown",
    0x0000000000000010: "SyncBoost",
    0x0000000000000020: "SwThermalSlowdown",
    0x0000000000000040: "HwThermalSlowdown",
    0x0000000000000080: "HwPowerBrakeSlowdown",
    0x0000000000000100: "DisplayClockSetting",
}
THERMAL_REASONS: frozenset[str] = frozenset({"SwThermalSlowdown", "HwThermalSlowdown"})
POWER_REASONS: frozenset[str] = frozenset({"HwPowerBrakeSlowdown", "HwSlowdown"})
