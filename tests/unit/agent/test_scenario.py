"""Scenario files: what loads, and what is rejected with a message that says where and why."""

from pathlib import Path

import pytest

from gpuhealth_agent import scenario

GOOD = """\
gpus: 8
model: NVIDIA H100 80GB HBM3
driverVersion: 570.124.06
defaults: {temperatureCelsius: 42, smClockMHz: 1980, maxSmClockMHz: 1980, powerWatts: 300,
           utilizationPercent: 95}
timeline:
- {after: 5s,  gpu: 3, set: {eccUncorrectedVolatile: 1}}
- {after: 5s,  gpu: 1, set: {temperatureCelsius: 92, clockEventReasons: [HwThermalSlowdown],
                             smClockMHz: 1400}}
- {after: 10s, gpu: 0, xid: 79}          # an XID event; 79 also marks the GPU lost
- {after: 60s, gpu: 1, set: {temperatureCelsius: 55, clockEventReasons: [], smClockMHz: 1980}}
"""


def test_the_design_example_loads() -> None:
    plan = scenario.parse(GOOD, "design.yaml")
    assert plan.gpus == 8
    assert plan.expected_gpus == 8
    assert plan.model == "NVIDIA H100 80GB HBM3"
    assert plan.driver_version == "570.124.06"
    assert plan.defaults["temperatureCelsius"] == 42
    assert plan.defaults["powerWatts"] == 300.0
    assert [e.after_seconds for e in plan.timeline] == [5, 5, 10, 60]
    assert plan.timeline[2].xid == 79
    assert plan.timeline[0].line == 7
    assert plan.end_seconds == 60


def test_timeline_is_sorted_by_time_keeping_file_order_for_ties() -> None:
    plan = scenario.parse(
        "gpus: 2\ntimeline:\n"
        "- {after: 10s, gpu: 0, set: {temperatureCelsius: 50}}\n"
        "- {after: 1s, gpu: 1, set: {temperatureCelsius: 60}}\n"
        "- {after: 1s, gpu: 0, set: {temperatureCelsius: 70}}\n"
    )
    assert [(e.after_seconds, e.gpu) for e in plan.timeline] == [(1, 1), (1, 0), (10, 0)]


def test_minimal_file_gets_healthy_defaults() -> None:
    plan = scenario.parse("gpus: 1\n")
    assert plan.model == scenario.DEFAULT_MODEL
    assert plan.defaults["eccUncorrectedVolatile"] == 0
    assert plan.timeline == ()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", {"pcieMaxGeneration": 4, "maxSmClockMHz": 1410, "powerLimitWatts": 400}),
        ("NVIDIA A100 80GB PCIe", {"pcieMaxGeneration": 4, "powerLimitWatts": 300}),
        ("NVIDIA A100-SXM4-40GB", {"memoryTotalMiB": 40960}),
        ("NVIDIA L4", {"pcieMaxGeneration": 4, "powerLimitWatts": 72, "powerWatts": 35}),
        ("NVIDIA L40S", {"maxSmClockMHz": 2520, "memoryTotalMiB": 46068}),  # not taken for an L4
        ("NVIDIA H100 80GB HBM3", {"pcieMaxGeneration": 5, "maxSmClockMHz": 1980, "powerLimitWatts": 700}),
        ("Some Future GPU", {"pcieMaxGeneration": 5, "maxSmClockMHz": 1980}),  # unknown: H100-like
    ],
)
def test_a_known_model_starts_from_its_own_healthy_figures(model: str, expected: dict) -> None:
    plan = scenario.parse(f"gpus: 1\nmodel: {model}\n")
    assert {k: plan.defaults[k] for k in expected} == expected
    # A healthy card of that model is not degraded by its own nature: its link runs at its maximum.
    assert plan.defaults["pcieGeneration"] == plan.defaults["pcieMaxGeneration"]
    assert plan.defaults["powerWatts"] < plan.defaults["powerLimitWatts"]


def test_the_files_own_defaults_win_over_the_models() -> None:
    text = "gpus: 1\nmodel: NVIDIA L4\ndefaults: {maxSmClockMHz: 1800, pcieMaxGeneration: 5}\n"
    plan = scenario.parse(text)
    assert (plan.defaults["maxSmClockMHz"], plan.defaults["pcieMaxGeneration"]) == (1800, 5)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("1m30s", 90), ("250ms", 0.25), ("2h", 7200), ("1.5s", 1.5), (3, 3), (0.5, 0.5), ("1m", 60)],
)
def test_durations(text: object, seconds: float) -> None:
    assert scenario.parse_duration(text) == pytest.approx(seconds)


def test_volatile_ecc_may_drop_after_a_reset() -> None:
    plan = scenario.parse(
        "gpus: 1\ntimeline:\n"
        "- {after: 1s, gpu: 0, set: {eccUncorrectedVolatile: 2}}\n"
        "- {after: 2s, gpu: 0, reset: true}\n"
        "- {after: 3s, gpu: 0, set: {eccUncorrectedVolatile: 1}}\n"
    )
    assert plan.timeline[1].reset


def test_fail_and_not_supported_entries() -> None:
    plan = scenario.parse(
        "gpus: 3\ndefaults: {notSupported: [serial]}\ntimeline:\n"
        "- {after: 3s, gpu: 2, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown, for: 2s}}\n"
        "- {after: 0s, gpu: 1, notSupported: [ecc, pcieLink]}\n"
    )
    assert plan.not_supported == {"serial"}
    assert plan.timeline[0].not_supported == {"ecc", "pcieLink"}
    fail = plan.timeline[1].fail
    assert fail == scenario.Failure("nvmlDeviceGetPowerUsage", "Unknown", 2.0)


BAD = {
    "unknown top-level field": ("gpus: 1\ncolour: red\n", ["colour", "one of the keys"]),
    "fact at the top level": (
        "gpus: 1\ntemperatureCelsius: 90\n",
        ["temperatureCelsius", "under `defaults:`"],
    ),
    "notSupported at the top level": (
        "gpus: 1\nnotSupported: [power]\n",
        ["notSupported", "under `defaults:`"],
    ),
    "entry key at the top level": ("gpus: 1\nxid: 79\n", ["xid", "in a `timeline:` entry"]),
    "unknown fact": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {temprature: 3}}\n",
        ["temprature", "known field"],
    ),
    "unknown entry key": ("gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, sett: {}}\n", ["timeline[0]", "sett"]),
    "bad type": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {temperatureCelsius: hot}}\n",
        ["an integer", "'hot'"],
    ),
    "bool for int": ("gpus: 1\ndefaults: {smClockMHz: true}\n", ["defaults.smClockMHz", "an integer"]),
    "negative value": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {powerWatts: -5}}\n",
        ["powerWatts", "non-negative"],
    ),
    "negative counter": (
        "gpus: 1\ndefaults: {eccCorrectedAggregate: -1}\n",
        ["eccCorrectedAggregate", ">= 0"],
    ),
    "gpu index out of range": (
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 2, xid: 48}\n",
        ["timeline[0]", ".gpu", "<= 1"],
    ),
    "unknown clock reason": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {clockEventReasons: [TooHot]}}\n",
        ["clockEventReasons", "TooHot", "HwThermalSlowdown"],
    ),
    "unknown recovery action": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {recoveryAction: Reboot}}\n",
        ["recoveryAction", "GpuReset", "'Reboot'"],
    ),
    "bad duration string": (
        "gpus: 1\ntimeline:\n- {after: 5 minutes, gpu: 0, xid: 13}\n",
        ["after", "duration"],
    ),
    "negative duration": ("gpus: 1\ntimeline:\n- {after: -3, gpu: 0, xid: 13}\n", ["after", "non-negative"]),
    "counter decreasing": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {eccCorrectedAggregate: 5}}\n"
        "- {after: 2s, gpu: 0, set: {eccCorrectedAggregate: 3}}\n",
        ["timeline[1] (line 4)", "eccCorrectedAggregate", ">= 5", "only grow"],
    ),
    "counter decreasing in an entry listed before a later one": (
        "gpus: 1\ntimeline:\n- {after: 2s, gpu: 0, set: {eccCorrectedAggregate: 3}}\n"
        "- {after: 1s, gpu: 0, set: {eccCorrectedAggregate: 5}}\n",
        ["timeline[0] (line 3)", "eccCorrectedAggregate", ">= 5"],
    ),
    "volatile counter decreasing without reset": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, set: {eccUncorrectedVolatile: 2}}\n"
        "- {after: 2s, gpu: 0, set: {eccUncorrectedVolatile: 0}}\n",
        ["eccUncorrectedVolatile", "reset: true"],
    ),
    "missing gpus": ("model: x\n", ["gpus", "missing"]),
    "zero gpus": ("gpus: 0\n", ["gpus", ">= 1"]),
    "YAML syntax error": ("gpus: 1\ntimeline: [\n- {after: 1s\n", ["not valid YAML", "line"]),
    "not a mapping": ("- gpus: 1\n", ["top level", "a mapping"]),
    "empty file": ("", ["top level", "a mapping"]),
    "unknown XID format (string)": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, xid: seventy-nine}\n",
        ["xid", "XID code"],
    ),
    "unknown XID format (list)": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, xid: [79]}\n",
        ["xid", "XID code"],
    ),
    "XID zero": ("gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, xid: 0}\n", ["xid", "1..65535"]),
    "entry without action": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0}\n",
        ["timeline[0]", "at least one of"],
    ),
    "entry missing after": (
        "gpus: 1\ntimeline:\n- {gpu: 0, xid: 13}\n",
        ["timeline[0] (line 3).after", "missing"],
    ),
    "entry missing gpu": (
        "gpus: 1\ntimeline:\n- {after: 1s, xid: 13}\n",
        ["timeline[0] (line 3).gpu", "missing"],
    ),
    "timeline not a list": ("gpus: 1\ntimeline: {after: 1s}\n", ["timeline", "a list"]),
    "entry not a mapping": ("gpus: 1\ntimeline:\n- 5s gpu 0 xid 79\n", ["timeline[0] (line 3)", "a mapping"]),
    "unknown notSupported name": (
        "gpus: 1\ndefaults: {notSupported: [warpDrive]}\n",
        ["notSupported", "warpDrive"],
    ),
    "unknown fail function": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, fail: {function: nvmlDeviceExplode, error: Unknown}}\n",
        ["fail.function", "nvmlDeviceExplode"],
    ),
    "unknown fail error": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, fail: {function: nvmlDeviceGetPowerUsage, error: Oops}}\n",
        ["fail.error", "GpuIsLost", "'Oops'"],
    ),
    "expectedGpus below gpus": ("gpus: 4\nexpectedGpus: 2\n", ["expectedGpus", ">= 4"]),
    "reset not a boolean": (
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, reset: yes please}\n",
        ["reset", "true or false"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_are_rejected_with_where_and_what(case: str, tmp_path: Path) -> None:
    text, fragments = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(scenario.ScenarioError) as caught:
        scenario.load(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_there_are_at_least_fifteen_kinds_of_bad_file() -> None:
    assert len(BAD) >= 15


def test_timeline_errors_name_index_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 0, xid: 13}\n\n- {after: 2s, gpu: 0, set: {lost: 1}}\n"
    )
    with pytest.raises(
        scenario.ScenarioError, match=r"timeline\[1\] \(line 5\)\.set\.lost: expected a known field"
    ):
        scenario.load(path)


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(scenario.ScenarioError, match="cannot read"):
        scenario.load(tmp_path / "nope.yaml")


def test_example_scenarios_all_load() -> None:
    examples = Path(__file__).resolve().parents[3] / "examples" / "scenarios"
    files = sorted(examples.glob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        scenario.load(path)


def test_from_data_validates_a_mapping_and_names_the_entry() -> None:
    plan = scenario.from_data({"gpus": 2, "timeline": [{"after": "5s", "gpu": 1, "xid": 48}]}, "fleet.yaml")
    assert plan.timeline[0].xid == 48 and plan.path == "fleet.yaml"
    with pytest.raises(scenario.ScenarioError) as caught:
        scenario.from_data({"gpus": 2, "timeline": [{"after": "1s", "gpu": 5, "xid": 79}]}, "inline (p[0])")
    assert str(caught.value).startswith("inline (p[0]): timeline[0].gpu: expected")
    assert "(line" not in str(caught.value)
