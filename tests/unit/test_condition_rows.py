"""Every fact a condition's row reads reaches the operator, and the agent writes a change of it at once.

Two silent failures the table (`gpuhealth_api.conditions`) exists to prevent: a fact the operator's cache
does not keep (its predicate would never fire in the cluster, though `check` on the node shows it), and a
fact the agent's significant-change view leaves out (the fault would wait up to a heartbeat to be written).
Both are read from the rows here, path by path, so a new row is held to both at once.
"""

import copy
import datetime
import typing
from typing import Any

import pytest

from gpuhealth_agent import changes
from gpuhealth_api import conditions, faults, status, vocabulary
from gpuhealth_operator.decisions import trends
from gpuhealth_operator.state import cache, compaction

Condition = vocabulary.Condition
Scope = conditions.Scope
T0 = datetime.datetime(2026, 11, 26, 12, tzinfo=datetime.UTC)
STAMP = "2026-11-26T12:00:00Z"


def path_type(record: type, path: str) -> Any:
    kind: Any = record
    for part in path.split("."):
        kind = typing.get_type_hints(kind)[part]
    return kind


def sample(kind: Any, variant: int) -> Any:
    """A value of an annotated status type; the two variants differ."""
    if kind is bool:
        return bool(variant)
    if kind is int:
        return 3 + 6 * variant
    if kind is float:
        return 100.0 * (1 + variant)
    if kind is str:
        return "ACTIVE" if variant == 0 else "DOWN"
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        if item is str:
            return [] if variant == 0 else ["HwSlowdown"]
        return [] if variant == 0 else [{"code": 79, "count": 1, "lastSeen": STAMP}]
    first = next(iter(typing.get_type_hints(kind)))  # a nested TypedDict: vary its first key
    return {first: sample(typing.get_type_hints(kind)[first], variant)}


def put(record: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        record = record.setdefault(part, {})
    record[last] = value


def at(record: Any, path: str) -> Any:
    for part in path.split("."):
        record = record.get(part)
    return record


GPU_READS = [
    pytest.param(row, path, id=f"{row.condition.value}-{path}")
    for row in conditions.ROWS
    if row.scope is Scope.GPU
    for path in row.reads
]
NIC_READS = [
    pytest.param(row, path, id=f"{row.condition.value}-{path}")
    for row in conditions.ROWS
    if row.scope is Scope.NODE
    for path in row.reads
]


def base_gpu() -> dict[str, Any]:
    """A GPU with every fact any row reads (variant 0), 40 °C of a 90 °C slowdown."""
    gpu: dict[str, Any] = {"index": 0, "uuid": "GPU-0", "model": "NVIDIA H100 80GB HBM3"}
    for row in conditions.ROWS:
        for path in row.reads if row.scope is Scope.GPU else ():
            put(gpu, path, sample(path_type(status.GPUStatus, path), 0))
    gpu["temperatureCelsius"], gpu["slowdownTemperatureCelsius"] = 40, 90
    return gpu


def changed(gpu: dict[str, Any], path: str) -> dict[str, Any]:
    """`gpu` with the fact at `path` changed as a fault would change it."""
    new = copy.deepcopy(gpu)
    value = {"temperatureCelsius": 95, "slowdownTemperatureCelsius": 30}.get(path)
    put(new, path, sample(path_type(status.GPUStatus, path), 1) if value is None else value)
    return new


@pytest.mark.parametrize(("row", "path"), GPU_READS)
def test_the_operator_keeps_every_fact_a_predicate_reads(row: conditions.Row, path: str) -> None:
    gpu = changed(base_gpu(), path)
    kept = compaction.compact_gpu(gpu)
    assert at(kept, path) == at(gpu, path)


@pytest.mark.parametrize(("row", "path"), GPU_READS)
def test_the_agent_writes_a_change_of_a_fact_at_once_unless_its_row_waits(
    row: conditions.Row, path: str
) -> None:
    before = base_gpu()
    significant = changes.gpu_view(before) != changes.gpu_view(changed(before, path))
    assert significant is (path not in row.waits)


@pytest.mark.parametrize(("row", "path"), NIC_READS)
def test_a_nic_port_fact_reaches_the_operator_and_the_agent_unless_its_row_waits(
    row: conditions.Row, path: str
) -> None:
    port: dict[str, Any] = {"name": "mlx5_0", "port": 1, "physState": "LinkUp"}
    for read in row.reads:
        port[read] = sample(path_type(status.Nic, read), 0)
    other = port | {path: sample(path_type(status.Nic, path), 1)}
    record = cache.gpunode_record({"metadata": {"name": "n"}, "status": {"nics": [other]}})
    assert record.status["nics"] == [other]
    significant = changes.nic_view(typing.cast(Any, port)) != changes.nic_view(typing.cast(Any, other))
    assert significant is (path not in row.waits)


FAULTY: dict[Condition, dict[str, Any]] = {
    Condition.GPU_LOST: {"lost": True},
    Condition.ECC_UNCORRECTABLE: {"ecc": {"uncorrectedVolatile": 1}},
    Condition.ROW_REMAP_FAILURE: {"remappedRows": {"failure": True}},
    Condition.XID_CRITICAL: {"xids": [{"code": 79, "count": 1, "lastSeen": STAMP}]},
    Condition.RECOVERY_REQUIRED: {"recoveryAction": "GpuReset"},
    Condition.FABRIC_UNHEALTHY: {"fabric": {"state": "Completed", "status": "Failure"}},
    Condition.PCIE_ERRORS: {"pcie": {"aer": {"fatal": 1}}},
    Condition.THERMAL_THROTTLED: {"temperatureCelsius": 95, "slowdownTemperatureCelsius": 90},
    Condition.POWER_THROTTLED: {"clockEventReasons": ["HwPowerBrakeSlowdown"]},
    Condition.PCIE_DEGRADED: {"utilizationPercent": 95, "pcie": {"generation": 3, "maxGeneration": 5}},
    Condition.NVLINK_DEGRADED: {"nvlink": {"linksUp": 17, "linksDown": 1}},
    Condition.MEMORY_DEGRADING: {"retiredPages": {"pending": True, "doubleBit": 0}},
}
"""Per per-GPU condition, facts that show it (NvLinkDegraded: once a report showed all 18 links up)."""


def test_every_per_gpu_condition_has_a_faulty_gpu_here() -> None:
    assert set(FAULTY) == set(conditions.GPU_CONDITIONS)


@pytest.mark.parametrize("condition", conditions.GPU_CONDITIONS)
def test_a_fault_one_report_shows_fires_on_the_facts_the_operator_keeps(condition: Condition) -> None:
    gpu = {"index": 0, "uuid": "GPU-0"} | FAULTY[condition]
    seen_up = {"nvlink": {"linksUp": 18, "linksDown": 0}} if condition is Condition.NVLINK_DEGRADED else {}
    memory = trends.advance(
        None, {"gpus": [compaction.compact_gpu({"index": 0, "uuid": "GPU-0"} | seen_up)]}, T0
    )
    kept = compaction.compact_gpu(gpu)
    memory = trends.advance(memory, {"gpus": [kept]}, T0 + datetime.timedelta(minutes=1))
    check = conditions.gpu_checks(frozenset({79}), history=memory.gpu)[condition]
    assert check(kept) is not None


@pytest.mark.parametrize(
    ("condition", "counter"),
    [(condition, counter) for condition, counters in conditions.GPU_COUNTERS.items() for counter in counters],
)
def test_a_counter_growing_fast_fires_its_trend_on_the_facts_the_operator_keeps(
    condition: Condition, counter: str
) -> None:
    reports = []
    for minutes, value in ((0, 0), (30, 100_000)):
        gpu: dict[str, Any] = {"index": 0, "uuid": "GPU-0", "nvlink": {"linksUp": 18, "linksDown": 0}}
        put(gpu, counter, value)
        reports.append((T0 + datetime.timedelta(minutes=minutes), compaction.compact_gpu(gpu)))
    memory = None
    for now, kept in reports:
        memory = trends.advance(memory, {"gpus": [kept]}, now)
    assert memory is not None
    check = conditions.gpu_checks(frozenset(), history=memory.gpu)[condition]
    assert check(reports[-1][1]) is not None
    assert faults.NO_TREND.per_hour(counter) is None  # `check` (no memory) never fires a trend
