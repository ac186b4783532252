"""Conditions as rows: everything the programs know of one condition, in one table.

Each `Row` says how a condition is judged (its predicate in `faults`, the facts
it reads, per GPU or per node), what it means (fatal, sustained, or a blind
spot that makes health Unknown), how severe it is (its place in `ROWS`), what
a GPU without it is told, which of the facts it reads move with every sample,
and which of them the agent may leave for its heartbeat. Every other
per-condition table derives from `ROWS`: the predicates by condition
(`gpu_checks`), the fatal and sustained sets, the severity order, the facts
the operator keeps of a GPU (`GPU_PATHS`), the facts whose change the agent
writes at once (`SIGNIFICANT_GPU_FIELDS`), the conditions a policy rule may
name and those IsolateGPU may answer. So a new condition is a name in
`vocabulary.Condition`, a predicate in `faults` and a row here (docs/conditions.md,
"Adding a condition"); a test holds the CRDs and the chart's schema to the rows.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from gpuhealth_api import faults, status, vocabulary

Condition = vocabulary.Condition


class Kind(enum.Enum):
    """What a true condition does to the node's health, and how it clears."""

    FATAL = "fatal"
    """Unhealthy; its evidence only a GPU reset or a reboot clears, so it clears as soon as that is gone.
    Judged under every policy; `gpu-health-agent check` exits 1."""
    SUSTAINED = "sustained"
    """Degraded; comes and goes with load and cooling, so it clears only after healthyForSeconds."""
    BLIND = "blind"
    """Unknown: the operator cannot judge the node's facts (no fact condition is judged meanwhile)."""


class Scope(enum.Enum):
    """What the condition is judged from."""

    GPU = "gpu"
    """One predicate per reported GPU (`status.gpus[]`), named by the GPUs that show it."""
    NODE = "node"
    """The node's own facts (its NIC ports)."""
    COHORT = "cohort"
    """The node against its peers (Straggler: `decisions.stragglers`)."""
    AGENT = "agent"
    """The agent, its pod or the Node's labels, not the GPUs' facts."""
    CHECK = "check"
    """The operator's own active checks' runs (GPUNode `status.checks[]`), not the agent's facts: judged
    while the agent is stale too (the history is the operator's evidence, kept in the cluster)."""


Bind = Callable[[frozenset[int], float, faults.History], faults.GPUFault]
"""A row's predicate, bound for one judgement to what it may need beyond one GPU's facts: the XIDs
XidCritical acts on (the rule's, else the catalogue's critical ones), the growth per hour a trend
condition tolerates (the policy's, else the row's default), and what the operator remembers of each GPU
(`faults.no_history`: one report, as `check`). The result is a function of one GPU's facts."""


def _plain(predicate: faults.GPUFault) -> Bind:
    return lambda critical_xids, threshold, history: predicate


def _xids(critical_xids: frozenset[int], threshold: float, history: faults.History) -> faults.GPUFault:
    return lambda gpu: faults.xid_critical(gpu, critical_xids)


def _trend(predicate: Callable[[status.GPUStatus, faults.Trend, float], str | None]) -> Bind:
    def bind(critical_xids: frozenset[int], threshold: float, history: faults.History) -> faults.GPUFault:
        return lambda gpu: predicate(gpu, history(gpu), threshold)

    return bind


@dataclasses.dataclass(frozen=True)
class Row:
    """One condition: how it is judged, what it means, who must see its facts."""

    condition: Condition
    kind: Kind
    scope: Scope
    check: Bind | None = None
    """The per-GPU predicate (`Scope.GPU`); None: judged elsewhere (`decisions.signals`, `stragglers`)."""
    reads: tuple[str, ...] = ()
    """The facts the predicate reads, as dotted paths in a GPU's status (a NIC port's for NicDegraded):
    the operator keeps them (`GPU_PATHS`), and the agent writes at once when one changes (`waits` aside)."""
    moving: frozenset[str] = frozenset()
    """Fields it reads that move with nearly every sample (temperature, utilization): an unchanged report
    is told by the other fields, and this predicate is asked again (`signals.still_healthy`)."""
    waits: frozenset[str] = frozenset()
    """Paths of `reads` whose change alone the agent leaves for its heartbeat: they move with every sample,
    or are counters judged as a rate per hour, which a minute's delay does not change."""
    healthy: str = ""
    """The signal's message when the facts show no fault (empty: the judging code words its own)."""
    counters: tuple[str, ...] = ()
    """Counters whose growth per hour it judges against the rule's `threshold` (`decisions.trends`)."""
    default_threshold: float | None = None
    """The growth per hour it tolerates when its rule gives no `threshold` (trend conditions only)."""
    rule_threshold: bool = False
    """A rule naming it may give a `threshold` (the CRD's CEL rule)."""
    isolatable: bool = False
    """A rule may answer it with IsolateGPU: a fatal fault of one GPU that a reset of that GPU can cure."""
    rule: bool = True
    """A policy rule may name it (the CRD's enum); False: judged on every node, answered by health alone."""

    @property
    def fields(self) -> frozenset[str]:
        """The top-level fields `reads` names (`ecc` for `ecc.uncorrectedVolatile`)."""
        return frozenset(path.split(".", 1)[0] for path in self.reads)


ROWS: Final[tuple[Row, ...]] = (
    Row(
        Condition.GPU_LOST,
        Kind.FATAL,
        Scope.GPU,
        _plain(faults.gpu_lost),
        reads=("lost",),
        healthy="all GPUs present",
        isolatable=True,
    ),
    Row(
        Condition.ECC_UNCORRECTABLE,
        Kind.FATAL,
        Scope.GPU,
        _plain(faults.ecc_uncorrectable),
        reads=("ecc.uncorrectedVolatile",),
        healthy="no uncorrectable volatile ECC errors",
        isolatable=True,
    ),
    Row(
        Condition.ROW_REMAP_FAILURE,
        Kind.FATAL,
        Scope.GPU,
        _plain(faults.row_remap_failure),
        reads=(
            "remappedRows.failure",
            "remappedRows.pending",
            "remappedRows.uncorrectable",
            "retiredPages.pending",
            "retiredPages.doubleBit",
        ),
        healthy="no row-remapping failure, nor a remap or page retirement pending for uncorrectable errors",
        isolatable=True,
    ),
    Row(
        Condition.XID_CRITICAL,
        Kind.FATAL,
        Scope.GPU,
        _xids,
        reads=("xids",),
        healthy="no critical XID since the last GPU reset",
        isolatable=True,
    ),
    Row(
        Condition.RECOVERY_REQUIRED,
        Kind.FATAL,
        Scope.GPU,
        _plain(faults.recovery_required),
        reads=("recoveryAction",),
        healthy="no GPU asks for a recovery action",
        isolatable=True,
    ),
    Row(
        Condition.FABRIC_UNHEALTHY,
        Kind.FATAL,
        Scope.GPU,
        _plain(faults.fabric_unhealthy),
        reads=("fabric.state", "fabric.status"),
        healthy="no fabric registration failed or pending",
    ),
    Row(
        Condition.PCIE_ERRORS,
        Kind.FATAL,
        Scope.GPU,
        _trend(faults.pcie_errors),
        reads=("pcie.aer",),
        healthy="no fatal or growing non-fatal PCIe AER errors",
        counters=faults.PCIE_ERROR_COUNTERS,
        default_threshold=faults.PCIE_ERRORS_THRESHOLD,
        rule_threshold=True,
    ),
    # A failed diagnostic: the GPUs failed a test made to find faults; it clears when a later run passes.
    Row(Condition.ACTIVE_CHECK_FAILED, Kind.FATAL, Scope.CHECK),
    Row(Condition.AGENT_STALE, Kind.BLIND, Scope.AGENT),
    Row(Condition.AGENT_ERROR, Kind.BLIND, Scope.AGENT, rule=False),
    Row(Condition.GPU_OPERATOR_MAINTENANCE, Kind.BLIND, Scope.AGENT, rule=False),
    Row(
        Condition.THERMAL_THROTTLED,
        Kind.SUSTAINED,
        Scope.GPU,
        _plain(faults.thermal_throttled),
        reads=("clockEventReasons", "temperatureCelsius", "slowdownTemperatureCelsius"),
        moving=frozenset({"temperatureCelsius"}),
        healthy="no thermal slowdown",
    ),
    Row(
        Condition.POWER_THROTTLED,
        Kind.SUSTAINED,
        Scope.GPU,
        _plain(faults.power_throttled),
        reads=("clockEventReasons",),
        healthy="no hardware power brake or slowdown",
    ),
    Row(
        Condition.PCIE_DEGRADED,
        Kind.SUSTAINED,
        Scope.GPU,
        _plain(faults.pcie_degraded),
        reads=("utilizationPercent", "pcie.generation", "pcie.maxGeneration", "pcie.width", "pcie.maxWidth"),
        moving=frozenset({"utilizationPercent"}),
        waits=frozenset({"utilizationPercent"}),
        healthy="PCIe links at full generation and width under load",
    ),
    Row(
        Condition.NVLINK_DEGRADED,
        Kind.SUSTAINED,
        Scope.GPU,
        _trend(faults.nvlink_degraded),
        reads=("nvlink.linksUp", "nvlink.linksDown", *faults.NVLINK_COUNTERS),
        waits=frozenset(faults.NVLINK_COUNTERS),
        healthy="no NVLink down or with errors growing",
        counters=faults.NVLINK_COUNTERS,
        default_threshold=faults.NVLINK_THRESHOLD,
        rule_threshold=True,
    ),
    Row(
        Condition.NIC_DEGRADED,
        Kind.SUSTAINED,
        Scope.NODE,
        reads=("state", "rateGbps", *faults.NIC_COUNTERS),
        waits=frozenset({"symbolErrors", "rcvErrors"}),
        healthy="no InfiniBand/RoCE port down, slowed or with errors growing",
        counters=faults.NIC_COUNTERS,
        default_threshold=faults.NIC_THRESHOLD,
        rule_threshold=True,
    ),
    Row(
        Condition.MEMORY_DEGRADING,
        Kind.SUSTAINED,
        Scope.GPU,
        _trend(faults.memory_degrading),
        reads=(
            "xids",
            "retiredPages.pending",
            "retiredPages.doubleBit",
            "remappedRows.pending",
            "remappedRows.failure",
            "remappedRows.uncorrectable",
            "ecc.uncorrectedVolatile",
            *faults.MEMORY_COUNTERS,
        ),
        healthy="no corrected-memory-error trend, XID 92, or page retirement or row remap pending",
        counters=faults.MEMORY_COUNTERS,
        default_threshold=faults.MEMORY_THRESHOLD,
        rule_threshold=True,
    ),
    Row(Condition.STRAGGLER, Kind.SUSTAINED, Scope.COHORT, rule_threshold=True),
)
"""Every condition, most severe first: a lost GPU outranks the faults it is often the end of."""

BY_CONDITION: Final[Mapping[Condition, Row]] = {row.condition: row for row in ROWS}


def _where(keep: Callable[[Row], bool]) -> tuple[Condition, ...]:
    return tuple(row.condition for row in ROWS if keep(row))


ORDER: Final = _where(lambda row: True)
"""Most severe first (`decisions.severity`)."""
FATAL: Final = frozenset(_where(lambda row: row.kind is Kind.FATAL))
"""Conditions that make a node Unhealthy, judged whatever the rules say, and make `check` exit 1."""
SUSTAINED: Final = frozenset(_where(lambda row: row.kind is Kind.SUSTAINED))
"""Conditions that make a node Degraded and clear only after healthyForSeconds."""
BLIND: Final = frozenset(_where(lambda row: row.kind is Kind.BLIND))
"""Conditions under which no fact is judged: health Unknown."""
FACT_CONDITIONS: Final = _where(lambda row: row.scope in (Scope.GPU, Scope.NODE))
"""Conditions judged from one node's facts (and what the operator remembers of them) alone."""
GPU_CONDITIONS: Final = _where(lambda row: row.check is not None)
"""Conditions with a per-GPU predicate (`gpu_checks`), most severe first."""
RULE_CONDITIONS: Final = tuple(c for c in Condition if BY_CONDITION[c].rule)
"""The conditions a policy rule may name (the policy CRD's enum, in `vocabulary.Condition`'s order)."""
PER_GPU_CONDITIONS: Final = frozenset(_where(lambda row: row.isolatable))
"""Fatal conditions a fault of one GPU can cause: the only ones a rule may answer with IsolateGPU."""
THRESHOLD_CONDITIONS: Final = _where(lambda row: row.rule_threshold)
"""Conditions whose rules may give a `threshold`."""
DEFAULT_THRESHOLDS: Final[Mapping[Condition, float]] = {
    row.condition: row.default_threshold for row in ROWS if row.default_threshold is not None
}
"""Per hour: the growth of a trend condition's counters it tolerates when its rule gives no `threshold`.
NVLink CRC/replay/recovery errors and InfiniBand symbol/receive errors/link-downs: 100 (a healthy link
counts a few errors a day; a failing one thousands an hour); PCIe non-fatal AER errors: any growth;
corrected ECC errors and correctable row remaps: 10 (a healthy HBM stack counts none for days)."""
GPU_COUNTERS: Final[Mapping[Condition, tuple[str, ...]]] = {
    row.condition: row.counters for row in ROWS if row.scope is Scope.GPU and row.counters
}
"""Per trend condition, the GPU counters whose growth per hour it judges against the rule's threshold."""
HEALTHY_MESSAGES: Final[Mapping[Condition, str]] = {row.condition: row.healthy for row in ROWS if row.healthy}
READS: Final[Mapping[Condition, frozenset[str]]] = {row.condition: row.fields for row in ROWS if row.check}
"""The GPU fields each per-GPU predicate reads (`gpu_checks`): two GPUs alike in them get the same
answer (property-tested), so a caller may keep an answer while they stay as they were."""


def _paths(rows: Iterable[Row]) -> Mapping[str, frozenset[str] | None]:
    """Field → the nested keys read under it (None: the whole value), in `status.GPUStatus` order."""
    wanted: dict[str, set[str] | None] = {}
    for row in rows:
        for path in row.reads:
            field, _, rest = path.partition(".")
            if not rest:
                wanted[field] = None
                continue
            nested = wanted.setdefault(field, set())
            if nested is not None:
                nested.add(rest.split(".", 1)[0])
    return {
        field: None if wanted[field] is None else frozenset(wanted[field] or ())
        for field in status.GPUStatus.__annotations__
        if field in wanted
    }


_GPU_ROWS: Final = tuple(row for row in ROWS if row.scope is Scope.GPU)
GPU_PATHS: Final[Mapping[str, frozenset[str] | None]] = _paths(_GPU_ROWS)
"""The GPU facts the predicates read: field → the keys read of a nested object (None: the whole value).
The operator keeps these of every GPU (`decisions.gpu_facts.FIELDS`), or a predicate could never fire."""
_WAITING: Final = frozenset(path.split(".", 1)[0] for row in _GPU_ROWS for path in row.waits)
SIGNIFICANT_GPU_PATHS: Final[Mapping[str, frozenset[str] | None]] = {
    field: keys if field in _WAITING else None
    for field, keys in _paths(
        dataclasses.replace(row, reads=tuple(p for p in row.reads if p not in row.waits)) for row in _GPU_ROWS
    ).items()
}
"""The GPU facts a change of which the agent writes at once (`changes.gpu_view`): every fact a predicate
reads but those its row `waits` for. Field → None: the whole value (no fact under it waits); else the
keys of the nested object that do not wait."""
SIGNIFICANT_NIC_FIELDS: Final[tuple[str, ...]] = tuple(
    path for row in ROWS if row.scope is Scope.NODE for path in row.reads if path not in row.waits
)
"""The NIC port facts a change of which the agent writes at once (`changes.nic_view`)."""


def threshold(thresholds: Mapping[Condition, float], condition: Condition) -> float:
    """The growth per hour `condition` tolerates: the policy's, else its row's default."""
    default = BY_CONDITION[condition].default_threshold
    return thresholds.get(condition, 0.0 if default is None else default)


_BINDS: Final = tuple(
    (row.condition, row.check, row.default_threshold or 0.0) for row in _GPU_ROWS if row.check is not None
)


def gpu_checks(
    critical_xids: frozenset[int],
    thresholds: Mapping[Condition, float] | None = None,
    history: faults.History = faults.no_history,
) -> dict[Condition, faults.GPUFault]:
    """Every per-GPU predicate by condition, most severe first; XidCritical acts on `critical_xids`, the
    trend conditions on `thresholds` and each GPU's `history` (none: what one report shows)."""
    limits = thresholds or {}
    return {
        condition: bind(critical_xids, limits.get(condition, default), history)
        for condition, bind, default in _BINDS
    }


_BIND_OF: Final = types.MappingProxyType({condition: (bind, default) for condition, bind, default in _BINDS})


def gpu_check(
    condition: Condition,
    critical_xids: frozenset[int],
    thresholds: Mapping[Condition, float],
    history: faults.History = faults.no_history,
) -> faults.GPUFault:
    """`gpu_checks(critical_xids, thresholds, history)[condition]` alone: a caller that asks a few of
    the predicates binds only those."""
    bind, default = _BIND_OF[condition]
    return bind(critical_xids, thresholds.get(condition, default), history)


def gpu_faults(gpu: status.GPUStatus, critical_xids: frozenset[int]) -> dict[Condition, str]:
    """The faults one GPU shows, by condition, most severe first."""
    found = {condition: check(gpu) for condition, check in gpu_checks(critical_xids).items()}
    return {condition: text for condition, text in found.items() if text is not None}
