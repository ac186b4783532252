"""The GPU facts the agent reports: one row per fact, and everything else derives from it.

Each `Fact` says where the fact lives in `status.gpus[]`, what a scenario
calls it, which NVML function answers it (and with which arguments, in
which part of the result, in which unit), how often it is read, what kind
of value it is, which `notSupported` name silences it, what a healthy GPU
reports and which Prometheus series shows it. The collector's queries, the
simulated getters, the scenario's accepted keys and the agent's metrics are
all built from `FACTS`, so adding a fact is one row here (plus its test).

`decode` turns what NVML returns into the status value; `encode` is its
inverse, for the simulated backend, which must answer like the driver.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_agent import nvml
from gpuhealth_api import status


class Tier(enum.Enum):
    """How often a fact is read (see collector.py)."""

    STATIC = "static"
    """When the GPU set changes: identity, thresholds, maximums."""
    FAST = "fast"
    """Every sample."""
    SLOW = "slow"
    """At most every slow period, at once after an XID/DBE event, every sample while a reset is awaited."""


class Type(enum.Enum):
    """What kind of value a fact is (for validation, decoding and metrics)."""

    INT = "int"
    FLOAT = "float"
    COUNTER = "counter"
    """A non-negative integer that only grows (volatile ECC counts drop at a GPU reset)."""
    PAGES = "pages"
    """NVML answers a list of retired page addresses; the fact is how many (a counter)."""
    BOOL = "bool"
    STR = "str"
    REASONS = "reasons"
    """A clock-event reason bit mask; the fact is the list of active reason names."""
    RECOVERY = "recovery"
    """An NVML_GPU_RECOVERY_ACTION_* code; the fact is its name."""


COUNTING_TYPES: Final = frozenset({Type.COUNTER, Type.PAGES})


@dataclasses.dataclass(frozen=True)
class Metric:
    """A Prometheus gauge family of per-GPU facts (labels gpu, uuid, then `labels`)."""

    name: str
    """Without the `gpuhealth_agent_` prefix."""
    help: str
    labels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Fact:
    key: str
    """The scenario's name for it (`set: {eccUncorrectedVolatile: 1}`)."""
    path: tuple[str, ...]
    """Where it lives in a GPUStatus (`("ecc", "uncorrectedVolatile")`)."""
    function: str
    """The NVML function that answers it (newest name; nvml.OLDER_NAMES has the fallbacks)."""
    tier: Tier
    type: Type
    group: str
    """The `notSupported` name that makes its function raise NOT_SUPPORTED in a scenario."""
    default: Any
    """What a healthy, idle H100 SXM reports (the simulation's default); None: not simulated by value."""
    args: tuple[int | None, ...] = ()
    """Arguments after the device handle."""
    part: str | int | None = None
    """The attribute (struct) or position (tuple) of the result that holds it; None: the result itself."""
    scale: int = 1
    """NVML units per reported unit (milliwatts per watt, bytes per MiB)."""
    after_reset: Any = None
    """The value a GPU reset sets (volatile counts, pending flags, recovery action); None: unchanged."""
    metric: Metric | None = None
    labels: tuple[str, ...] = ()
    """Values of the metric's own labels, for this fact."""


_MIB: Final = 2**20
_KIND: Final = "kind"

TEMPERATURE: Final = Metric("gpu_temperature_celsius", "GPU core temperature.")
SLOWDOWN_TEMPERATURE: Final = Metric(
    "gpu_slowdown_temperature_celsius",
    "Temperature at which the GPU starts to slow down (NVML slowdown threshold).",
)
POWER: Final = Metric("gpu_power_watts", "GPU power draw.")
POWER_LIMIT: Final = Metric("gpu_power_limit_watts", "Enforced GPU power limit.")
SM_CLOCK: Final = Metric("gpu_sm_clock_mhz", "Current SM clock.")
MAX_SM_CLOCK: Final = Metric("gpu_max_sm_clock_mhz", "Maximum SM clock.")
UTILIZATION: Final = Metric("gpu_utilization_percent", "GPU utilisation over the driver's last period.")
MEMORY_USED: Final = Metric(
    "gpu_memory_used_mib", "GPU memory in use (NVML v2 memory info where the driver has it)."
)
MEMORY_TOTAL: Final = Metric("gpu_memory_total_mib", "GPU memory size as NVML reports it.")
ECC_ERRORS: Final = Metric(
    "gpu_ecc_errors",
    "ECC error count as NVML reports it (kind: corrected|uncorrected, scope: volatile|aggregate). "
    "A gauge because volatile counts restart at a GPU reset.",
    (_KIND, "scope"),
)
RETIRED_PAGES: Final = Metric("gpu_retired_pages_double_bit", "Pages retired after double-bit ECC errors.")
RETIRED_PAGES_PENDING: Final = Metric(
    "gpu_retired_pages_pending", "1 when a page retirement waits for a GPU reset."
)
REMAPPED_ROWS: Final = Metric(
    "gpu_remapped_rows", "Rows remapped (kind: correctable|uncorrectable).", (_KIND,)
)
REMAP_PENDING: Final = Metric("gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.")
REMAP_FAILURE: Final = Metric("gpu_row_remap_failure", "1 when row remapping failed on the GPU.")
CLOCK_EVENT_REASON: Final = Metric(
    "gpu_clock_event_reason_active", "1 while the clock-event (throttle) reason is active.", ("reason",)
)
RECOVERY_ACTION: Final = Metric(
    "gpu_recovery_action",
    "NVML GPU recovery action code (0 None, 1 GpuReset, 2 NodeReboot, 3 DrainP2P, 4 DrainAndReset).",
)
PCIE_GENERATION: Final = Metric(
    "gpu_pcie_link_generation", "PCIe link generation (kind: current|max).", (_KIND,)
)
PCIE_WIDTH: Final = Metric("gpu_pcie_link_width", "PCIe link width in lanes (kind: current|max).", (_KIND,))
PCIE_REPLAYS: Final = Metric("gpu_pcie_replay_counter", "PCIe replay counter as NVML reports it.")

_S, _F, _L = Tier.STATIC, Tier.FAST, Tier.SLOW
_ECC: Final = "nvmlDeviceGetTotalEccErrors"
_CORR, _UNC = nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.MEMORY_ERROR_TYPE_UNCORRECTED
_VOL, _AGG = nvml.VOLATILE_ECC, nvml.AGGREGATE_ECC
_ROWS: Final = "nvmlDeviceGetRemappedRows"

FACTS: Final[tuple[Fact, ...]] = (
    # key, status path, NVML function, tier, type, notSupported group, default, then the rest by name.
    Fact("serial", ("serial",), "nvmlDeviceGetSerial", _S, Type.STR, "serial", None),
    Fact(
        "slowdownTemperatureCelsius", ("slowdownTemperatureCelsius",), "nvmlDeviceGetTemperatureThreshold",
        _S, Type.INT, "slowdownTemperatureCelsius", 87,
        args=(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN,), metric=SLOWDOWN_TEMPERATURE,
    ),
    Fact(
        "maxSmClockMHz", ("maxSmClockMHz",), "nvmlDeviceGetMaxClockInfo", _S, Type.INT, "maxSmClockMHz", 1980,
        args=(nvml.CLOCK_SM,), metric=MAX_SM_CLOCK,
    ),
    Fact(
        "pcieMaxGeneration", ("pcie", "maxGeneration"), "nvmlDeviceGetMaxPcieLinkGeneration", _S, Type.INT,
        "pcieLink", 5, metric=PCIE_GENERATION, labels=("max",),
    ),
    Fact(
        "pcieMaxWidth", ("pcie", "maxWidth"), "nvmlDeviceGetMaxPcieLinkWidth", _S, Type.INT, "pcieLink", 16,
        metric=PCIE_WIDTH, labels=("max",),
    ),
    Fact(
        "temperatureCelsius", ("temperatureCelsius",), "nvmlDeviceGetTemperatureV", _F, Type.INT,
        "temperatureCelsius", 40, args=(nvml.TEMPERATURE_GPU,), metric=TEMPERATURE,
    ),
    Fact(
        "powerWatts", ("powerWatts",), "nvmlDeviceGetPowerUsage", _F, Type.FLOAT, "powerWatts", 300.0,
        scale=1000, metric=POWER,
    ),
    Fact(
        "smClockMHz", ("smClockMHz",), "nvmlDeviceGetClockInfo", _F, Type.INT, "smClockMHz", 1980,
        args=(nvml.CLOCK_SM,), metric=SM_CLOCK,
    ),
    Fact(
        "utilizationPercent", ("utilizationPercent",), "nvmlDeviceGetUtilizationRates", _F, Type.INT,
        "utilizationPercent", 0, part="gpu", metric=UTILIZATION,
    ),
    Fact(
        "clockEventReasons", ("clockEventReasons",), "nvmlDeviceGetCurrentClocksEventReasons", _F,
        Type.REASONS, "clockEventReasons", [], metric=CLOCK_EVENT_REASON,
    ),
    Fact(
        "eccUncorrectedVolatile", ("ecc", "uncorrectedVolatile"), _ECC, _F, Type.COUNTER, "ecc", 0,
        args=(_UNC, _VOL), after_reset=0, metric=ECC_ERRORS, labels=("uncorrected", "volatile"),
    ),
    Fact(
        "recoveryAction", ("recoveryAction",), "nvmlDeviceGetFieldValues", _F, Type.RECOVERY,
        "recoveryAction", "None", args=(nvml.FI_DEV_GET_GPU_RECOVERY_ACTION,), after_reset="None",
        metric=RECOVERY_ACTION,
    ),
    Fact(
        "powerLimitWatts", ("powerLimitWatts",), "nvmlDeviceGetEnforcedPowerLimit", _L, Type.FLOAT,
        "powerLimitWatts", 700.0, scale=1000, metric=POWER_LIMIT,
    ),
    Fact(
        "memoryUsedMiB", ("memoryUsedMiB",), "nvmlDeviceGetMemoryInfo", _L, Type.INT, "memory", 0,
        part="used", scale=_MIB, metric=MEMORY_USED,
    ),
    Fact(
        "memoryTotalMiB", ("memoryTotalMiB",), "nvmlDeviceGetMemoryInfo", _L, Type.INT, "memory", 81559,
        part="total", scale=_MIB, metric=MEMORY_TOTAL,
    ),
    Fact(
        "eccCorrectedVolatile", ("ecc", "correctedVolatile"), _ECC, _L, Type.COUNTER, "ecc", 0,
        args=(_CORR, _VOL), after_reset=0, metric=ECC_ERRORS, labels=("corrected", "volatile"),
    ),
    Fact(
        "eccCorrectedAggregate", ("ecc", "correctedAggregate"), _ECC, _L, Type.COUNTER, "ecc", 0,
        args=(_CORR, _AGG), metric=ECC_ERRORS, labels=("corrected", "aggregate"),
    ),
    Fact(
        "eccUncorrectedAggregate", ("ecc", "uncorrectedAggregate"), _ECC, _L, Type.COUNTER, "ecc", 0,
        args=(_UNC, _AGG), metric=ECC_ERRORS, labels=("uncorrected", "aggregate"),
    ),
    Fact(
        "retiredPagesDoubleBit", ("retiredPages", "doubleBit"), "nvmlDeviceGetRetiredPages", _L, Type.PAGES,
        "retiredPages", 0, args=(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,), metric=RETIRED_PAGES,
    ),
    Fact(
        "retiredPagesPending", ("retiredPages", "pending"), "nvmlDeviceGetRetiredPagesPendingStatus", _L,
        Type.BOOL, "retiredPages", False, after_reset=False, metric=RETIRED_PAGES_PENDING,
    ),
    Fact(
        "remappedRowsCorrectable", ("remappedRows", "correctable"), _ROWS, _L, Type.COUNTER,
        "remappedRows", 0, part=0, metric=REMAPPED_ROWS, labels=("correctable",),
    ),
    Fact(
        "remappedRowsUncorrectable", ("remappedRows", "uncorrectable"), _ROWS, _L, Type.COUNTER,
        "remappedRows", 0, part=1, metric=REMAPPED_ROWS, labels=("uncorrectable",),
    ),
    Fact(
        "remappedRowsPending", ("remappedRows", "pending"), _ROWS, _L, Type.BOOL, "remappedRows", False,
        part=2, after_reset=False, metric=REMAP_PENDING,
    ),
    Fact(
        "remappedRowsFailure", ("remappedRows", "failure"), _ROWS, _L, Type.BOOL, "remappedRows", False,
        part=3, metric=REMAP_FAILURE,
    ),
    Fact(
        "pcieReplayCounter", ("pcie", "replayCounter"), "nvmlDeviceGetPcieReplayCounter", _L, Type.COUNTER,
        "pcieReplayCounter", 0, metric=PCIE_REPLAYS,
    ),
    Fact(
        "pcieGeneration", ("pcie", "generation"), "nvmlDeviceGetCurrPcieLinkGeneration", _L, Type.INT,
        "pcieLink", 5, metric=PCIE_GENERATION, labels=("current",),
    ),
    Fact(
        "pcieWidth", ("pcie", "width"), "nvmlDeviceGetCurrPcieLinkWidth", _L, Type.INT, "pcieLink", 16,
        metric=PCIE_WIDTH, labels=("current",),
    ),
)  # fmt: skip

BY_KEY: Final[Mapping[str, Fact]] = {fact.key: fact for fact in FACTS}
GROUPS: Final[frozenset[str]] = frozenset(fact.group for fact in FACTS)
"""Names usable in a scenario's `notSupported`."""
FUNCTIONS: Final[frozenset[str]] = frozenset(fact.function for fact in FACTS) | frozenset(
    nvml.OLDER_NAMES.values()
)
"""Every NVML function that answers a fact, under its current and older names."""
METRICS: Final[tuple[Metric, ...]] = tuple(dict.fromkeys(f.metric for f in FACTS if f.metric is not None))
REASON_BITS: Final[Mapping[str, int]] = {name: bit for bit, name in status.CLOCK_EVENT_REASONS.items()}
RECOVERY_CODES: Final[Mapping[str, int]] = {name: code for code, name in nvml.RECOVERY_ACTIONS.items()}


def answered_by(function: str, args: tuple[Any, ...]) -> tuple[Fact, ...]:
    """The facts one NVML call (by current or older name) answers, in table order."""
    current = nvml.NEWER_NAMES.get(function, function)
    return tuple(f for f in FACTS if f.function == current and f.args == tuple(args))


def decode(fact: Fact, raw: Any) -> Any:
    """The status value of a fact from its part of what NVML returned."""
    if fact.type in (Type.INT, Type.COUNTER):
        return int(raw) // fact.scale
    if fact.type is Type.FLOAT:
        return round(raw / fact.scale, 1)
    if fact.type is Type.PAGES:
        return len(raw)
    if fact.type is Type.BOOL:
        return bool(raw)
    if fact.type is Type.STR:
        return nvml.text(raw)
    if fact.type is Type.REASONS:
        return [name for bit, name in status.CLOCK_EVENT_REASONS.items() if raw & bit]
    code = int(raw)  # Type.RECOVERY
    return nvml.RECOVERY_ACTIONS.get(code, f"Unknown{code}")


def encode(fact: Fact, value: Any) -> Any:
    """What NVML returns for a fact's value (the inverse of `decode`, for the simulated backend)."""
    if fact.type in (Type.INT, Type.COUNTER):
        return int(value) * fact.scale
    if fact.type is Type.FLOAT:
        return round(float(value) * fact.scale)
    if fact.type is Type.PAGES:
        return [0x1000 * (i + 1) for i in range(int(value))]  # page addresses; the agent only counts them
    if fact.type is Type.BOOL:
        return int(bool(value))
    if fact.type is Type.STR:
        return str(value)
    if fact.type is Type.REASONS:
        mask = 0
        for name in value:
            mask |= REASON_BITS[name]
        return mask
    return RECOVERY_CODES[value]  # Type.RECOVERY
