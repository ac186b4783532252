"""Every field and fault of the scenario format, through the real collector with the simulated NVML."""

from typing import Any

import prometheus_client
import pytest

from gpuhealth_agent import check, collector, history, metrics, scenario, simulated, xids

START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def scenario(self) -> float:
        return self.seconds

    def epoch(self) -> float:
        return START + self.seconds


def make(text: str, **collector_args: Any) -> tuple[simulated.SimulatedNvml, collector.Collector, Clock]:
    clock = Clock()
    plan = scenario.parse(text)
    sim = simulated.SimulatedNvml(plan, clock=clock.scenario, start=0.0, identity_seed="node-a")
    collector_args.setdefault("expected_gpus", plan.expected_gpus)  # as the runner does for the sim backend
    return sim, collector.Collector(sim, **collector_args), clock


def at(col: collector.Collector, clock: Clock, seconds: float) -> collector.Sample:
    clock.seconds = seconds
    return col.sample(clock.epoch())


def dig(gpu: Any, path: str) -> Any:
    for key in path.split("."):
        gpu = gpu[key]
    return gpu


def test_a_healthy_gpu_reports_every_field() -> None:
    _, col, clock = make("gpus: 2\ndefaults: {utilizationPercent: 95, serial: '1654321'}\n")
    sample = at(col, clock, 0)
    gpu = sample.gpus[0]
    assert gpu["index"] == 0
    assert gpu["uuid"].startswith("GPU-")
    assert gpu["model"] == scenario.DEFAULT_MODEL
    assert gpu["pciBusId"] == "00000000:18:00.0"
    assert gpu["serial"] == "1654321"
    assert gpu["temperatureCelsius"] == 40
    assert gpu["slowdownTemperatureCelsius"] == 87
    assert gpu["powerWatts"] == 300.0
    assert gpu["powerLimitWatts"] == 700.0
    assert gpu["smClockMHz"] == 1980
    assert gpu["maxSmClockMHz"] == 1980
    assert gpu["utilizationPercent"] == 95
    assert gpu["memoryTotalMiB"] == 81559
    assert gpu["ecc"] == {
        "correctedVolatile": 0,
        "uncorrectedVolatile": 0,
        "correctedAggregate": 0,
        "uncorrectedAggregate": 0,
    }
    assert gpu["retiredPages"] == {"doubleBit": 0, "pending": False}
    assert gpu["remappedRows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["clockEventReasons"] == []
    assert gpu["recoveryAction"] == "None"
    assert gpu["pcie"] == {
        "generation": 5,
        "maxGeneration": 5,
        "width": 16,
        "maxWidth": 16,
        "replayCounter": 0,
    }
    assert "lost" not in gpu
    assert "throttledSince" not in gpu
    assert gpu["observedTime"] == "2027-01-15T08:00:00.000000Z"
    assert sample.driver_version == scenario.DEFAULT_DRIVER_VERSION
    assert sample.expected_gpus == 2
    assert not sample.errors
    assert sample.gpus[0]["uuid"] != sample.gpus[1]["uuid"]


# (scenario field, value, path in status.gpus[], expected value)
RUNTIME_FIELDS = [
    ("temperatureCelsius", 77, "temperatureCelsius", 77),
    ("powerWatts", 450.5, "powerWatts", 450.5),
    ("powerLimitWatts", 650, "powerLimitWatts", 650.0),
    ("smClockMHz", 1500, "smClockMHz", 1500),
    ("utilizationPercent", 33, "utilizationPercent", 33),
    ("memoryUsedMiB", 1024, "memoryUsedMiB", 1024),
    ("eccCorrectedVolatile", 7, "ecc.correctedVolatile", 7),
    ("eccUncorrectedVolatile", 2, "ecc.uncorrectedVolatile", 2),
    ("eccCorrectedAggregate", 70, "ecc.correctedAggregate", 70),
    ("eccUncorrectedAggregate", 3, "ecc.uncorrectedAggregate", 3),
    ("retiredPagesDoubleBit", 4, "retiredPages.doubleBit", 4),
    ("retiredPagesPending", True, "retiredPages.pending", True),
    ("remappedRowsCorrectable", 5, "remappedRows.correctable", 5),
    ("remappedRowsUncorrectable", 6, "remappedRows.uncorrectable", 6),
    ("remappedRowsPending", True, "remappedRows.pending", True),
    ("remappedRowsFailure", True, "remappedRows.failure", True),
    ("clockEventReasons", ["HwSlowdown", "SwPowerCap"], "clockEventReasons", ["SwPowerCap", "HwSlowdown"]),
    ("recoveryAction", "DrainAndReset", "recoveryAction", "DrainAndReset"),
    ("pcieGeneration", 3, "pcie.generation", 3),
    ("pcieWidth", 8, "pcie.width", 8),
    ("pcieReplayCounter", 12, "pcie.replayCounter", 12),
]


@pytest.mark.parametrize(
    ("field", "value", "path", "expected"), RUNTIME_FIELDS, ids=[f[0] for f in RUNTIME_FIELDS]
)
def test_every_settable_field_reaches_the_status(field: str, value: Any, path: str, expected: Any) -> None:
    plan = f"gpus: 2\ntimeline:\n- {{after: 5s, gpu: 1, set: {{{field}: {value!r}}}}}\n".replace("'", '"')
    _, col, clock = make(plan.replace("True", "true"), slow_period_seconds=10)
    before = at(col, clock, 0).gpus[1]
    assert dig(before, path) != expected
    after = at(col, clock, 10)  # a full (slow-tier) sample after the change
    assert dig(after.gpus[1], path) == expected
    assert dig(after.gpus[0], path) == dig(before, path)  # the other GPU is untouched


STATIC_FIELDS = [
    ("slowdownTemperatureCelsius", 83, "slowdownTemperatureCelsius", 83),
    ("maxSmClockMHz", 2100, "maxSmClockMHz", 2100),
    ("pcieMaxGeneration", 4, "pcie.maxGeneration", 4),
    ("pcieMaxWidth", 8, "pcie.maxWidth", 8),
    ("memoryTotalMiB", 40960, "memoryTotalMiB", 40960),
    ("serial", "ABC123", "serial", "ABC123"),
]


@pytest.mark.parametrize(
    ("field", "value", "path", "expected"), STATIC_FIELDS, ids=[f[0] for f in STATIC_FIELDS]
)
def test_static_fields_come_from_defaults(field: str, value: Any, path: str, expected: Any) -> None:
    _, col, clock = make(f"gpus: 1\ndefaults: {{{field}: {value}}}\n")
    assert dig(at(col, clock, 0).gpus[0], path) == expected


def test_fast_faults_appear_in_the_next_sample_slow_counters_within_the_slow_period() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 3s, gpu: 0, set: {eccUncorrectedVolatile: 1, remappedRowsFailure: true}}\n",
        slow_period_seconds=10,
    )
    at(col, clock, 0)
    gpu = at(col, clock, 3).gpus[0]
    assert gpu["ecc"]["uncorrectedVolatile"] == 1  # fast tier
    assert gpu["remappedRows"]["failure"] is False  # slow tier: not yet re-read
    col.request_full_sample()  # what an XID/DBE event does
    assert at(col, clock, 4).gpus[0]["remappedRows"]["failure"] is True


def test_slow_counters_refresh_on_their_own_period() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n- {after: 3s, gpu: 0, set: {remappedRowsFailure: true}}\n",
        slow_period_seconds=10,
    )
    at(col, clock, 0)
    assert at(col, clock, 9).gpus[0]["remappedRows"]["failure"] is False
    assert at(col, clock, 10).gpus[0]["remappedRows"]["failure"] is True


def test_a_reset_that_clears_a_pending_row_remap_shows_in_the_next_sample() -> None:
    sim, col, clock = make(
        "gpus: 2\ntimeline:\n"
        "- {after: 3s, gpu: 0, xid: 63, set: {remappedRowsUncorrectable: 1, remappedRowsPending: true}}\n"
        "- {after: 7s, gpu: 0, reset: true}\n",
        slow_period_seconds=10,
    )
    at(col, clock, 0)
    col.record_xid(col.gpu_at(0), 63, clock.epoch())  # the event thread's part
    faulty = at(col, clock, 3).gpus[0]
    assert faulty["remappedRows"]["pending"] is True and faulty["xids"][0]["code"] == 63
    at(col, clock, 5)
    calls = sim.calls
    at(col, clock, 6)
    watched = sim.calls - calls
    # Still pending: the waiting GPU re-reads its slow counters every sample; the healthy one does not.
    assert watched > 2 * 7 + 8
    repaired = at(col, clock, 7).gpus[0]  # 3 s before the slow period would have come round
    assert repaired["remappedRows"]["pending"] is False and "xids" not in repaired
    calls = sim.calls
    at(col, clock, 8)
    assert sim.calls - calls < watched  # back to the fast tier only


OPTIONAL_ABSENT = {
    "serial": ["serial"],
    "temperatureCelsius": ["temperatureCelsius"],
    "slowdownTemperatureCelsius": ["slowdownTemperatureCelsius"],
    "powerWatts": ["powerWatts"],
    "powerLimitWatts": ["powerLimitWatts"],
    "smClockMHz": ["smClockMHz"],
    "maxSmClockMHz": ["maxSmClockMHz"],
    "utilizationPercent": ["utilizationPercent"],
    "memory": ["memoryUsedMiB", "memoryTotalMiB"],
    "ecc": ["ecc"],
    "retiredPages": ["retiredPages"],
    "remappedRows": ["remappedRows"],
    "clockEventReasons": ["clockEventReasons"],
    "recoveryAction": ["recoveryAction"],
    "pcieReplayCounter": ["pcie.replayCounter"],
    "pcieLink": ["pcie.generation", "pcie.maxGeneration", "pcie.width", "pcie.maxWidth"],
    "nvlink": ["nvlink"],
    "fabric": ["fabric"],
}


def test_every_optional_query_is_covered() -> None:
    assert set(OPTIONAL_ABSENT) == scenario.OPTIONAL_FIELDS


def _has(gpu: Any, path: str) -> bool:
    try:
        dig(gpu, path)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(OPTIONAL_ABSENT))
def test_not_supported_leaves_only_that_field_absent(name: str) -> None:
    _, col, clock = make(
        "gpus: 2\ndefaults: {fabricState: Completed}\n"  # fabric info is NOT_SUPPORTED by default
        f"timeline:\n- {{after: 0s, gpu: 1, notSupported: [{name}]}}\n"
    )
    sample = at(col, clock, 0)
    healthy, limited = sample.gpus
    for path in OPTIONAL_ABSENT[name]:
        assert _has(healthy, path), path
        assert not _has(limited, path), path
    assert "lost" not in limited
    assert not sample.errors, "NOT_SUPPORTED is a capability, not an error"
    other_fields = {k for k in healthy if k not in {p.split(".")[0] for p in OPTIONAL_ABSENT[name]}}
    assert other_fields - {"serial"} <= set(limited)


def test_not_supported_in_defaults_applies_to_every_gpu() -> None:
    _, col, clock = make("gpus: 3\ndefaults: {notSupported: [remappedRows, recoveryAction]}\n")
    for gpu in at(col, clock, 0).gpus:
        assert "remappedRows" not in gpu
        assert "recoveryAction" not in gpu


def test_a_transient_error_keeps_the_last_value_and_is_counted() -> None:
    _, col, clock = make(
        "gpus: 3\ntimeline:\n"
        "- {after: 3s, gpu: 2, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown, for: 2s}}\n"
        "- {after: 3s, gpu: 2, set: {powerWatts: 500}}\n"
    )
    assert at(col, clock, 0).gpus[2]["powerWatts"] == 300.0
    failing = at(col, clock, 3)
    assert failing.gpus[2]["powerWatts"] == 300.0  # last good value, not absent
    assert failing.errors == {("nvmlDeviceGetPowerUsage", "Unknown"): 1}
    recovered = at(col, clock, 5)
    assert recovered.gpus[2]["powerWatts"] == 500.0
    assert not recovered.errors


def test_a_query_that_keeps_failing_is_no_longer_its_last_good_value() -> None:
    """A persistent failure must not report a healthy old value for ever (issue 24, item 13):
    after UNREADABLE_AFTER_FAILURES failed reads the fact is absent and listed in `unreadable`."""
    _, col, clock = make(
        "gpus: 2\ntimeline:\n"
        "- {after: 3s, gpu: 1, fail: {function: nvmlDeviceGetTotalEccErrors, error: Unknown}}\n"
    )
    assert at(col, clock, 0).gpus[1]["ecc"]["uncorrectedVolatile"] == 0
    for second in range(3, 3 + collector.UNREADABLE_AFTER_FAILURES - 1):
        gpu = at(col, clock, second).gpus[1]
        assert gpu["ecc"]["uncorrectedVolatile"] == 0  # a short outage keeps the last good value
        assert "unreadable" not in gpu
    gpu = at(col, clock, 3 + collector.UNREADABLE_AFTER_FAILURES - 1).gpus[1]
    assert "uncorrectedVolatile" not in gpu.get("ecc", {})
    assert gpu["unreadable"] == ["ecc.uncorrectedVolatile"]
    healthy = at(col, clock, 9).gpus[0]
    assert healthy["ecc"]["uncorrectedVolatile"] == 0 and "unreadable" not in healthy
    # The slow ECC counters are read every slow period (10 s); they turn unreadable after as many reads.
    for second in range(10, 10 + 10 * collector.UNREADABLE_AFTER_FAILURES, 5):
        gpu = at(col, clock, second).gpus[1]
    assert gpu.get("ecc", {}) == {}
    assert gpu["unreadable"] == [
        "ecc.correctedAggregate",
        "ecc.correctedVolatile",
        "ecc.uncorrectedAggregate",
        "ecc.uncorrectedVolatile",
    ]


def test_an_unreadable_fact_comes_back_when_it_reads_again() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 3s, gpu: 0, fail: {function: nvmlDeviceGetTemperatureV, error: Timeout, for: 10s}}\n"
        "- {after: 3s, gpu: 0, fail: {function: nvmlDeviceGetTemperature, error: Timeout, for: 10s}}\n"
        "- {after: 4s, gpu: 0, set: {temperatureCelsius: 91}}\n"
    )
    at(col, clock, 0)
    for second in range(3, 10):
        gpu = at(col, clock, second).gpus[0]
    assert "temperatureCelsius" not in gpu and gpu["unreadable"] == ["temperatureCelsius"]
    gpu = at(col, clock, 13).gpus[0]
    assert gpu["temperatureCelsius"] == 91 and "unreadable" not in gpu


def test_an_unreadable_volatile_count_is_no_sign_of_a_reset() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 1s, gpu: 0, set: {eccUncorrectedVolatile: 2}}\n"
        "- {after: 3s, gpu: 0, fail: {function: nvmlDeviceGetTotalEccErrors, error: Unknown}}\n"
    )
    at(col, clock, 0)
    col.record_xid(col.gpu_at(0), 48, clock.epoch())
    assert at(col, clock, 1).gpus[0]["ecc"]["uncorrectedVolatile"] == 2
    for second in range(3, 40):
        gpu = at(col, clock, second).gpus[0]
    assert "uncorrectedVolatile" not in gpu.get("ecc", {})
    assert [x["code"] for x in gpu["xids"]] == [48]  # still there: an unread count is not a count of 0


def test_a_query_failing_from_the_start_is_absent_not_zero() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetRemappedRows}}\n"
    )
    sample = at(col, clock, 0)
    assert "remappedRows" not in sample.gpus[0]
    assert sample.errors == {("nvmlDeviceGetRemappedRows", "Unknown"): 1}


def test_gpu_is_lost_from_any_query_marks_the_gpu_lost() -> None:
    _, col, clock = make(
        "gpus: 2\ntimeline:\n"
        "- {after: 2s, gpu: 1, fail: {function: nvmlDeviceGetClockInfo, error: GpuIsLost}}\n"
    )
    at(col, clock, 0)
    gpu = at(col, clock, 2).gpus[1]
    assert gpu["lost"] is True
    assert gpu["uuid"].startswith("GPU-")
    assert "temperatureCelsius" not in gpu


def test_older_drivers_fall_back_to_the_older_functions() -> None:
    _, col, clock = make(
        "gpus: 1\ndefaults: {temperatureCelsius: 61, clockEventReasons: [SwThermalSlowdown]}\ntimeline:\n"
        "- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetTemperatureV, error: FunctionNotFound}}\n"
        "- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetCurrentClocksEventReasons,"
        " error: FunctionNotFound}}\n"
    )
    gpu = at(col, clock, 0).gpus[0]
    assert gpu["temperatureCelsius"] == 61
    assert gpu["clockEventReasons"] == ["SwThermalSlowdown"]


def test_a_gpu_lost_mid_run_is_reported_lost_and_comes_back_after_a_reset() -> None:
    _, col, clock = make(
        "gpus: 4\ntimeline:\n- {after: 10s, gpu: 2, xid: 79}\n- {after: 30s, gpu: 2, reset: true}\n"
    )
    first = at(col, clock, 0)
    uuid = first.gpus[2]["uuid"]
    lost = at(col, clock, 10)
    assert [g.get("lost", False) for g in lost.gpus] == [False, False, True, False]
    assert lost.gpus[2]["uuid"] == uuid
    assert lost.gpus[2]["index"] == 2
    assert ("nvmlDeviceGetTemperatureV", "GpuIsLost") in lost.errors
    assert at(col, clock, 20).gpus[2]["lost"] is True
    back = at(col, clock, 30)
    assert "lost" not in back.gpus[2]
    assert back.gpus[2]["uuid"] == uuid
    assert back.gpus[2]["temperatureCelsius"] == 40


def test_fewer_gpus_than_expected_reports_the_missing_ones_lost() -> None:
    _, col, clock = make("gpus: 7\nexpectedGpus: 8\n")
    sample = at(col, clock, 0)
    assert len(sample.gpus) == 8
    assert sample.gpus[7] == {"index": 7, "lost": True, "observedTime": "2027-01-15T08:00:00.000000Z"}
    assert sample.expected_gpus == 8
    # The missing GPU's observedTime stays put: it has been missing since the first sample.
    assert at(col, clock, 5).gpus[7]["observedTime"] == "2027-01-15T08:00:00.000000Z"


def test_expected_count_can_come_from_outside() -> None:
    _, col, clock = make("gpus: 2\n", expected_gpus=4)
    assert [g.get("lost", False) for g in at(col, clock, 0).gpus] == [False, False, True, True]


def test_throttled_since_marks_when_real_throttling_began() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 2s, gpu: 0, set: {clockEventReasons: [GpuIdle]}}\n"
        "- {after: 4s, gpu: 0, set: {clockEventReasons: [HwThermalSlowdown], temperatureCelsius: 91}}\n"
        "- {after: 6s, gpu: 0, set: {clockEventReasons: [HwThermalSlowdown, SwThermalSlowdown]}}\n"
        "- {after: 8s, gpu: 0, set: {clockEventReasons: []}}\n"
    )
    assert "throttledSince" not in at(col, clock, 2).gpus[0]  # idle is not throttling
    began = at(col, clock, 4).gpus[0]["throttledSince"]
    assert began == "2027-01-15T08:00:04.000000Z"
    assert at(col, clock, 6).gpus[0]["throttledSince"] == began
    assert "throttledSince" not in at(col, clock, 8).gpus[0]


def test_observed_time_moves_only_when_a_significant_fact_changes() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 2s, gpu: 0, set: {temperatureCelsius: 45, powerWatts: 410, utilizationPercent: 12}}\n"
        "- {after: 4s, gpu: 0, set: {temperatureCelsius: 88}}\n"
        "- {after: 6s, gpu: 0, set: {eccCorrectedVolatile: 1}}\n"
        "- {after: 8s, gpu: 0, set: {temperatureCelsius: 89}}\n",
        slow_period_seconds=1,
    )
    first = at(col, clock, 0).gpus[0]["observedTime"]
    assert at(col, clock, 2).gpus[0]["observedTime"] == first  # noise
    crossed = at(col, clock, 4).gpus[0]["observedTime"]
    assert crossed == "2027-01-15T08:00:04.000000Z"  # crossed the 87°C slowdown threshold
    assert at(col, clock, 6).gpus[0]["observedTime"] == "2027-01-15T08:00:06.000000Z"  # a counter grew
    assert at(col, clock, 8).gpus[0]["observedTime"] == "2027-01-15T08:00:06.000000Z"  # hotter, still above


def test_xids_recorded_for_a_gpu_appear_with_count_and_last_seen() -> None:
    _, col, clock = make("gpus: 2\n")
    at(col, clock, 0)
    col.record_xid(col.gpu_at(1), 13, START + 1)
    col.record_xid(col.gpu_at(1), 13, START + 2)
    col.record_xid(col.gpu_at(1), 48, START + 2)
    gpu = at(col, clock, 3).gpus[1]
    assert gpu["xids"] == [
        {"code": 13, "count": 2, "lastSeen": "2027-01-15T08:00:02.000000Z"},
        {"code": 48, "count": 1, "lastSeen": "2027-01-15T08:00:02.000000Z"},
    ]
    assert "xids" not in at(col, clock, 4).gpus[0]


def test_a_reset_clears_volatile_ecc_and_the_xids_since_the_last_reset() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 1s, gpu: 0, set: {eccUncorrectedVolatile: 2, eccUncorrectedAggregate: 2,"
        " recoveryAction: GpuReset}}\n- {after: 5s, gpu: 0, reset: true}\n"
    )
    at(col, clock, 0)
    col.record_xid(col.gpu_at(0), 48, START + 1)
    gpu = at(col, clock, 1).gpus[0]
    assert gpu["ecc"]["uncorrectedVolatile"] == 2
    assert gpu["xids"][0]["code"] == 48
    reset = at(col, clock, 5).gpus[0]
    assert reset["ecc"]["uncorrectedVolatile"] == 0
    assert reset["ecc"]["uncorrectedAggregate"] == 2  # aggregate survives resets
    assert reset["recoveryAction"] == "None"
    assert "xids" not in reset


def test_nvml_traffic_stays_under_ten_calls_per_gpu_per_second_at_one_second() -> None:
    sim, col, clock = make("gpus: 8\n", slow_period_seconds=10)
    for second in range(60):
        at(col, clock, second)
    assert sim.calls / 8 / 60 <= 10


def test_enrich_hook_sees_raw_facts_before_they_are_stamped() -> None:
    seen: list[int] = []

    def enrich(gpus: list[Any], now: float) -> None:
        seen.append(len(gpus))
        gpus[0].setdefault("ecc", {})["uncorrectedVolatile"] = 9

    _, col, clock = make("gpus: 2\n", enrich=enrich)
    col_sample = at(col, clock, 0)
    assert seen == [2]
    assert col_sample.gpus[0]["ecc"]["uncorrectedVolatile"] == 9


def test_a_lost_gpu_does_not_make_the_others_reread_their_static_facts() -> None:
    sim, col, clock = make("gpus: 8\ntimeline:\n- {after: 5s, gpu: 2, xid: 79}\n", slow_period_seconds=1000)
    at(col, clock, 0)
    at(col, clock, 5)
    before = sim.calls
    at(col, clock, 6)
    # Fast tier (7 calls, and 1 for NVLink states) for 7 GPUs, plus re-reading the identities (count,
    # and up to 4 per GPU).
    assert sim.calls - before <= 7 * 8 + 1 + 4 * 8


@pytest.mark.parametrize(
    ("before", "after", "reset"),
    [
        ({"lost": True}, {}, True),
        ({}, {"lost": True}, False),
        ({"ecc": {"uncorrectedVolatile": 2}}, {"ecc": {"uncorrectedVolatile": 0}}, True),
        ({"ecc": {"correctedVolatile": 9}}, {"ecc": {"correctedVolatile": 0}}, True),
        ({"ecc": {"correctedAggregate": 9}}, {"ecc": {"correctedAggregate": 9}}, False),
        ({"retiredPages": {"pending": True}}, {"retiredPages": {"pending": False}}, True),
        ({"remappedRows": {"pending": True}}, {"remappedRows": {"pending": False}}, True),
        ({"remappedRows": {"pending": True}}, {}, False),  # unsupported/unknown now is not proof of a reset
        ({"recoveryAction": "GpuReset"}, {"recoveryAction": "None"}, True),
        ({"recoveryAction": "GpuReset"}, {}, False),
        ({"ecc": {"uncorrectedVolatile": 2}}, {"ecc": {}}, False),  # unreadable now: no proof of a reset
        ({"ecc": {"correctedVolatile": 9}}, {}, False),
        ({}, {}, False),
    ],
)
def test_reset_inference(before: Any, after: Any, reset: bool) -> None:
    assert history.looks_reset(before, after) is reset


def test_unreadable_facts_are_said_by_check_and_the_metric() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown}}\n"
    )
    sample = at(col, clock, 0)
    assert sample.gpus[0]["unreadable"] == ["powerWatts"]
    problems = check.problems(sample.gpus[0], xids.Catalogue.packaged())
    assert [p.render() for p in problems] == ["WARNING NVML keeps failing to read powerWatts"]
    registry = prometheus_client.CollectorRegistry()
    metrics.AgentMetrics(registry).observe(sample)
    labels = {"gpu": "0", "uuid": sample.gpus[0]["uuid"]}
    assert registry.get_sample_value("gpuhealth_agent_gpu_unreadable_facts", labels) == 1
