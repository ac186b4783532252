"""Raw signals: what one instant of GPUNode facts says about each condition."""

import datetime
from typing import Any

import pytest

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, policies, signals, verdicts

Condition = vocabulary.Condition
NOW = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
OBSERVED = "2026-11-22T00:59:58Z"
XIDS = policies.DEFAULT_CRITICAL_XIDS


def _agent(**overrides: Any) -> dict[str, Any]:
    return {"lastHeartbeatTime": "2026-11-22T00:59:30Z", "heartbeatSeconds": 60, **overrides}


def _gpu(index: int = 0, **fields: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-0000000{index}-aaaa-bbbb", "observedTime": OBSERVED, **fields}


def _facts(*gpus: dict[str, Any], **agent: Any) -> Any:
    return {"agent": _agent(**agent), "gpus": list(gpus)}


def _signal(facts: Any, condition: Condition, node: model.NodeView | None = None) -> model.Signal:
    return signals.raw_signals(facts, node or model.NodeView(name="n"), XIDS, NOW)[condition]


@pytest.mark.parametrize(
    ("condition", "gpu_fields", "present"),
    [
        (Condition.ECC_UNCORRECTABLE, {"ecc": {"uncorrectedVolatile": 1}}, True),
        (Condition.ECC_UNCORRECTABLE, {"ecc": {"uncorrectedVolatile": 0, "uncorrectedAggregate": 5}}, False),
        (Condition.ECC_UNCORRECTABLE, {"ecc": {"correctedVolatile": 100}}, False),
        (Condition.ECC_UNCORRECTABLE, {}, False),
        (Condition.ROW_REMAP_FAILURE, {"remappedRows": {"failure": True}}, True),
        (Condition.ROW_REMAP_FAILURE, {"remappedRows": {"pending": True}}, True),
        (Condition.ROW_REMAP_FAILURE, {"remappedRows": {"correctable": 3, "uncorrectable": 1}}, False),
        (Condition.ROW_REMAP_FAILURE, {}, False),
        (Condition.XID_CRITICAL, {"xids": [{"code": 79, "count": 1, "lastSeen": OBSERVED}]}, True),
        (Condition.XID_CRITICAL, {"xids": [{"code": 13, "count": 4, "lastSeen": OBSERVED}]}, False),
        (Condition.XID_CRITICAL, {"xids": [{"code": 79, "count": 0, "lastSeen": OBSERVED}]}, False),
        (Condition.XID_CRITICAL, {"xids": []}, False),
        (Condition.XID_CRITICAL, {}, False),
        (Condition.GPU_LOST, {"lost": True}, True),
        (Condition.GPU_LOST, {"lost": False}, False),
        (Condition.GPU_LOST, {}, False),
        (Condition.RECOVERY_REQUIRED, {"recoveryAction": "GpuReset"}, True),
        (Condition.RECOVERY_REQUIRED, {"recoveryAction": "NodeReboot"}, True),
        (Condition.RECOVERY_REQUIRED, {"recoveryAction": "None"}, False),
        (Condition.RECOVERY_REQUIRED, {}, False),
        (Condition.THERMAL_THROTTLED, {"clockEventReasons": ["HwThermalSlowdown"]}, True),
        (Condition.THERMAL_THROTTLED, {"clockEventReasons": ["SwThermalSlowdown"]}, True),
        (Condition.THERMAL_THROTTLED, {"temperatureCelsius": 90, "slowdownTemperatureCelsius": 90}, True),
        (Condition.THERMAL_THROTTLED, {"temperatureCelsius": 89, "slowdownTemperatureCelsius": 90}, False),
        (Condition.THERMAL_THROTTLED, {"temperatureCelsius": 120}, False),  # no threshold known
        (Condition.THERMAL_THROTTLED, {"clockEventReasons": ["GpuIdle", "SwPowerCap"]}, False),
        (Condition.THERMAL_THROTTLED, {}, False),
        (Condition.POWER_THROTTLED, {"clockEventReasons": ["HwPowerBrakeSlowdown"]}, True),
        (Condition.POWER_THROTTLED, {"clockEventReasons": ["HwSlowdown"]}, True),
        (Condition.POWER_THROTTLED, {"clockEventReasons": ["SwPowerCap"]}, False),
        (Condition.POWER_THROTTLED, {}, False),
        (
            Condition.PCIE_DEGRADED,
            {
                "utilizationPercent": 90,
                "pcie": {"generation": 4, "maxGeneration": 5, "width": 16, "maxWidth": 16},
            },
            True,
        ),
        (
            Condition.PCIE_DEGRADED,
            {
                "utilizationPercent": 90,
                "pcie": {"generation": 5, "maxGeneration": 5, "width": 8, "maxWidth": 16},
            },
            True,
        ),
        (
            Condition.PCIE_DEGRADED,
            {
                "utilizationPercent": 0,
                "pcie": {"generation": 1, "maxGeneration": 5, "width": 16, "maxWidth": 16},
            },
            False,
        ),
        (Condition.PCIE_DEGRADED, {"pcie": {"generation": 1, "maxGeneration": 5}}, False),  # idle unknown
        (Condition.PCIE_DEGRADED, {"utilizationPercent": 90, "pcie": {"generation": 4}}, False),
        (Condition.PCIE_DEGRADED, {"utilizationPercent": 90}, False),
    ],
)
def test_condition_signal(condition: Condition, gpu_fields: dict[str, Any], present: bool) -> None:
    facts = _facts(_gpu(0), _gpu(3, **gpu_fields))
    signal = _signal(facts, condition)
    assert signal.present is present
    assert signal.condition is condition
    if present:
        assert signal.message.startswith("GPU 3 (GPU-00000003…): "), signal.message
        assert signal.observed_at is None, "the agent's observedTime times nothing: its clock (issue 24)"


def test_ecc_message_names_gpu_and_count() -> None:
    facts = _facts(_gpu(3, uuid="GPU-abc", ecc={"uncorrectedVolatile": 2}))
    assert _signal(facts, Condition.ECC_UNCORRECTABLE).message == (
        "GPU 3 (GPU-abc): 2 uncorrectable volatile ECC errors"
    )


def test_xid_is_timed_by_its_receipt_not_its_last_seen() -> None:
    facts = _facts(_gpu(1, xids=[{"code": 79, "count": 2, "lastSeen": "2026-11-22T00:50:00Z"}]))
    signal = _signal(facts, Condition.XID_CRITICAL)
    assert signal.observed_at is None, "lastSeen is the agent's clock (issue 24)"
    assert "XID 79 seen 2 times" in signal.message


def test_xid_uses_the_rule_codes() -> None:
    facts = _facts(_gpu(1, xids=[{"code": 13, "count": 1, "lastSeen": OBSERVED}]))
    got = signals.raw_signals(facts, model.NodeView(name="n"), frozenset({13}), NOW)
    assert got[Condition.XID_CRITICAL].present is True


@pytest.mark.parametrize(
    ("gpu_count", "expected_by_agent", "capacity", "present"),
    [
        (8, 8, 8, False),
        (7, 8, None, True),
        (7, None, 8, False),  # the bare capacity never counts GPUs: sharing multiplies it
        (7, 7, 8, False),
        (8, None, None, False),
        (0, 8, None, True),
        (0, None, None, False),
    ],
)
def test_gpu_lost_by_count(
    gpu_count: int, expected_by_agent: int | None, capacity: int | None, present: bool
) -> None:
    agent = {} if expected_by_agent is None else {"expectedGpuCount": expected_by_agent}
    facts = _facts(*(_gpu(i) for i in range(gpu_count)), **agent)
    signal = _signal(facts, Condition.GPU_LOST, model.NodeView(name="n", gpu_capacity=capacity))
    assert signal.present is present
    if present:
        assert f"{gpu_count} of" in signal.message


TIME_SLICED = {keys.GPU_COUNT_LABEL: "8", keys.GPU_REPLICAS_LABEL: "4"}
MIG_SINGLE = {keys.MIG_STRATEGY_LABEL: "single", keys.GPU_COUNT_LABEL: "56"}  # GFD counts MIG devices


@pytest.mark.parametrize(
    ("labels", "capacity", "gpu_count", "agent", "present"),
    [
        pytest.param(
            TIME_SLICED, 32, 8, {"expectedGpuCount": 8, "maxGpuCountSeen": 8}, False, id="time-sliced-x4"
        ),
        pytest.param(
            {keys.GPU_REPLICAS_LABEL: "4"},
            32,
            8,
            {"maxGpuCountSeen": 8},
            False,
            id="replicas-without-gpu-count",
        ),
        pytest.param(
            MIG_SINGLE, 56, 8, {"expectedGpuCount": 8, "maxGpuCountSeen": 8}, False, id="mig-single"
        ),
        pytest.param(
            {keys.MIG_STRATEGY_LABEL: "mixed", keys.GPU_COUNT_LABEL: "8"},
            None,
            8,
            {"expectedGpuCount": 8, "maxGpuCountSeen": 8},
            False,
            id="mig-mixed",
        ),
        pytest.param({}, 128, 8, {"maxGpuCountSeen": 8}, False, id="time-sliced-x16-without-gfd"),
        pytest.param(
            {keys.GPU_COUNT_LABEL: "8"},
            8,
            7,
            {"expectedGpuCount": 8, "maxGpuCountSeen": 8},
            True,
            id="8th-gpu-gone",
        ),
        pytest.param(TIME_SLICED, 32, 7, {"maxGpuCountSeen": 7}, True, id="time-sliced-8th-gpu-gone"),
        pytest.param(
            {keys.GPU_COUNT_LABEL: "7"},
            7,
            7,
            {"maxGpuCountSeen": 8},
            True,
            id="gfd-relabelled-after-the-loss",
        ),
        pytest.param(MIG_SINGLE, 56, 7, {"maxGpuCountSeen": 8}, True, id="mig-gpu-gone"),
        pytest.param({}, None, 7, {"maxGpuCountSeen": 8}, True, id="no-labels-agent-saw-8"),
    ],
)
def test_gpu_lost_counts_physical_gpus_not_shared_capacity(
    labels: dict[str, str], capacity: int | None, gpu_count: int, agent: dict[str, Any], present: bool
) -> None:
    facts = _facts(*(_gpu(i) for i in range(gpu_count)), **agent)
    node = model.NodeView(name="n", labels=labels, gpu_capacity=capacity)
    signal = _signal(facts, Condition.GPU_LOST, node)
    assert signal.present is present, signal.message
    if present:
        assert signal.message.startswith(f"{gpu_count} of 8 GPUs reported")


@pytest.mark.parametrize(
    ("agent", "age_seconds", "stale"),
    [
        ({"lastHeartbeatTime": "2026-11-22T00:57:00Z", "heartbeatSeconds": 60}, 180, False),  # exactly 3
        ({"lastHeartbeatTime": "2026-11-22T00:57:00Z", "heartbeatSeconds": 60}, 181, True),
        ({"lastHeartbeatTime": "2026-11-22T00:59:50Z", "heartbeatSeconds": 10}, 31, True),
        ({"lastHeartbeatTime": "2026-11-22T00:57:30Z"}, 150, False),  # default 60 s heartbeat
        ({"lastHeartbeatTime": "2026-11-22T00:57:30Z"}, 181, True),
        # The agent's own timestamps do not count, only when the operator saw the report:
        ({"lastHeartbeatTime": "2026-11-23T01:00:00Z", "heartbeatSeconds": 60}, 181, True),  # 24 h ahead
        ({"lastHeartbeatTime": "2026-11-21T01:00:00Z", "heartbeatSeconds": 60}, 5, False),  # 24 h behind
        # heartbeatSeconds beyond the schema's maximum cannot postpone staleness:
        ({"lastHeartbeatTime": "2026-11-22T00:59:30Z", "heartbeatSeconds": 10**9}, 1801, True),
        ({"lastHeartbeatTime": "2026-11-22T00:59:30Z", "heartbeatSeconds": 10**9}, 1799, False),
        ({"lastHeartbeatTime": "2026-11-22T00:59:30Z", "heartbeatSeconds": -5}, 181, True),
        ({"lastHeartbeatTime": "yesterday"}, 0, True),
        ({"heartbeatSeconds": 60}, 0, True),
        (None, 0, True),
    ],
)
def test_agent_stale_by_the_operators_clock(
    agent: dict[str, Any] | None, age_seconds: float, stale: bool
) -> None:
    facts: Any = {"gpus": [_gpu(0)]} if agent is None else {"agent": agent, "gpus": [_gpu(0)]}
    got = signals.raw_signals(facts, model.NodeView(name="n"), XIDS, NOW, age_seconds)[Condition.AGENT_STALE]
    assert got.present is stale


def test_stale_since_is_when_the_operator_stopped_seeing_reports_and_the_message_is_stable() -> None:
    facts: Any = {"agent": _agent(lastHeartbeatTime="2026-11-23T01:00:00Z"), "gpus": [_gpu(0)]}
    first = signals.agent_stale(facts, 200, NOW)
    later = signals.agent_stale(facts, 260, NOW + datetime.timedelta(seconds=60))
    assert first.observed_at == later.observed_at == NOW - datetime.timedelta(seconds=20)
    assert first.message == later.message
    assert "2026-11-23T01:00:00.000000Z" in first.message


def test_stale_agent_makes_every_fact_unknown() -> None:
    facts: Any = {
        "agent": {"lastHeartbeatTime": "2026-11-22T00:00:00Z", "heartbeatSeconds": 60},
        "gpus": [_gpu(0, ecc={"uncorrectedVolatile": 3}, lost=True)],
    }
    got = signals.raw_signals(facts, model.NodeView(name="n"), XIDS, NOW, 3600)
    assert got[Condition.AGENT_STALE].present is True
    agent = (Condition.AGENT_STALE, Condition.AGENT_ERROR, Condition.GPU_OPERATOR_MAINTENANCE)
    assert {c: s.present for c, s in got.items() if c not in agent} == {
        **dict.fromkeys(signals.FACT_CONDITIONS, None),
        Condition.ACTIVE_CHECK_FAILED: False,  # the operator's own evidence: no run failed
    }


def test_gpus_not_reported_yet_is_unknown_not_lost() -> None:
    facts: Any = {"agent": _agent(expectedGpuCount=8)}
    got = signals.raw_signals(facts, model.NodeView(name="n", gpu_capacity=8), XIDS, NOW)
    assert got[Condition.GPU_LOST].present is None
    assert got[Condition.ECC_UNCORRECTABLE].present is None
    assert got[Condition.AGENT_STALE].present is False


def test_garbage_fields_are_no_fault() -> None:
    gpu = _gpu(
        0,
        ecc="broken",
        remappedRows={"failure": "yes"},
        xids=[{"code": "79"}, "junk"],
        lost="true",
        recoveryAction=7,
        clockEventReasons="HwSlowdown",
        temperatureCelsius="hot",
        pcie=None,
    )
    facts: Any = {"agent": _agent(), "gpus": [gpu, "not a gpu"]}
    got = signals.raw_signals(facts, model.NodeView(name="n"), XIDS, NOW)
    assert {c: s.present for c, s in got.items()} == dict.fromkeys(
        (*signals.FACT_CONDITIONS, *verdicts.BLIND, Condition.ACTIVE_CHECK_FAILED),
        False,
    )


def test_kept_fact_signals_give_the_same_signals_and_only_the_agents_staleness_moves_with_time() -> None:
    """A caller keeping the fact signals per version of the facts (the cache does) judges the same."""
    facts = _facts(_gpu(0, ecc={"uncorrectedVolatile": 1}), _gpu(1))
    node = model.NodeView(name="n", gpu_capacity=2)
    known: signals.FactSignals = {}
    fresh = signals.raw_signals(facts, node, XIDS, NOW)
    assert signals.raw_signals(facts, node, XIDS, NOW, known=known) == fresh
    assert len(known) == 1
    assert signals.raw_signals(facts, node, XIDS, NOW, known=known) == fresh
    other = signals.raw_signals(facts, node, frozenset({13}), NOW, known=known)
    assert other == signals.raw_signals(facts, node, frozenset({13}), NOW), "kept per policy XIDs"
    later = NOW + datetime.timedelta(hours=1)
    stale = signals.raw_signals(facts, node, XIDS, later, 3600, known=known)
    assert stale[Condition.AGENT_STALE].present is True
    assert stale[Condition.ECC_UNCORRECTABLE].present is None, "a stale agent's facts are unknown"
