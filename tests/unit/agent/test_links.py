"""NVLink, fabric, PCIe AER and NIC facts: the simulated backend's answers, the readers, the collector.

The simulated NVML answers the pynvml functions (nvmlDeviceGetNvLinkState,
nvmlDeviceGetNvLinkErrorCounter, nvmlDeviceGetGpuFabricInfo, field values
scoped by link) with pynvml's own error classes; the collector reads them
through links.py, and AER and NIC ports through sysfs.py from the tree the
simulation writes, so these tests cover the production code path.
"""

import ctypes
import json
from pathlib import Path
from typing import Any

import prometheus_client
import pynvml
import pytest

from gpuhealth_agent import changes, check, cli, collector, links, metrics, nvml, scenario, simulated, xids

START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def make(text: str, **collector_args: Any) -> tuple[simulated.SimulatedNvml, collector.Collector, Clock]:
    clock = Clock()
    plan = scenario.parse(text)
    sim = simulated.SimulatedNvml(plan, clock=clock, start=0.0, identity_seed="node-a")
    collector_args.setdefault("expected_gpus", plan.expected_gpus)
    collector_args.setdefault("sysfs_root", sim.sysfs_root)
    return sim, collector.Collector(sim, **collector_args), clock


def at(col: collector.Collector, clock: Clock, seconds: float) -> collector.Sample:
    clock.seconds = seconds
    return col.sample(START + seconds)


# --- the simulated NVML -------------------------------------------------------------------------------


def test_nvlink_state_per_link_ends_with_invalid_argument_past_the_boards_links() -> None:
    sim, _, _ = make("gpus: 1\ndefaults: {nvlinks: 4, nvlinkLinksDown: 1}\n")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert [sim.nvmlDeviceGetNvLinkState(handle, link) for link in range(4)] == [1, 1, 1, 0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkState(handle, 4)
    assert links.discover(sim, handle) == 4


@pytest.mark.parametrize(
    "text", ["model: NVIDIA H100 PCIe\n", "model: NVIDIA L4\n", "defaults: {nvlinks: 0}\n"]
)
def test_a_board_without_nvlink_answers_not_supported(text: str) -> None:
    sim, _, _ = make("gpus: 1\n" + text)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetNvLinkState(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetNvLinkErrorCounter(handle, 0, nvml.NVLINK_ERROR_DL_CRC_FLIT)
    assert links.discover(sim, handle) == 0


def test_error_counters_sum_to_the_scenarios_count_over_the_links_that_are_up() -> None:
    sim, _, _ = make("gpus: 1\ndefaults: {nvlinks: 18, nvlinkLinksDown: 2, nvlinkReplayErrors: 9}\n")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    per_link = [
        sim.nvmlDeviceGetNvLinkErrorCounter(handle, link, nvml.NVLINK_ERROR_DL_REPLAY) for link in range(16)
    ]
    assert sum(per_link) == 9
    assert links.NvLinkReader(18, mode=links.Mode.PER_LINK).read(sim, handle, slow=True) == {
        "linksUp": 16,
        "linksDown": 2,
        "crcErrors": 0,
        "replayErrors": 9,
        "recoveryErrors": 0,
    }


def test_field_values_scoped_by_link_answer_like_the_per_link_calls() -> None:
    sim, _, _ = make("gpus: 1\ndefaults: {nvlinks: 3, nvlinkLinksDown: 1, nvlinkCrcErrors: 5}\n")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert nvml.FI_DEV_NVLINK_GET_STATE is not None and nvml.FI_DEV_NVLINK_ERROR_DL_CRC is not None
    states = sim.nvmlDeviceGetFieldValues(handle, [(nvml.FI_DEV_NVLINK_GET_STATE, link) for link in range(4)])
    assert [v.nvmlReturn for v in states] == [nvml.SUCCESS] * 3 + [pynvml.NVML_ERROR_INVALID_ARGUMENT]
    assert [v.value.ullVal for v in states[:3]] == [1, 1, 0]
    crc = sim.nvmlDeviceGetFieldValues(handle, [(nvml.FI_DEV_NVLINK_ERROR_DL_CRC, link) for link in range(3)])
    assert sum(v.value.ullVal for v in crc) == 5


def test_fabric_info_fills_pynvmls_struct_by_reference() -> None:
    sim, _, _ = make(
        "gpus: 1\ndefaults: {fabricState: InProgress, fabricStatus: NotReady, fabricCliqueId: 32766}\n"
    )
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.c_nvmlGpuFabricInfo_t()
    assert sim.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert (info.state, info.status, info.cliqueId) == (
        pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        pynvml.NVML_ERROR_NOT_READY,
        32766,
    )
    assert links.read_fabric(sim, handle) == {"state": "InProgress", "status": "NotReady", "cliqueId": 32766}


def test_fabric_info_is_not_supported_by_default() -> None:
    sim, _, _ = make("gpus: 1\n")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        links.read_fabric(sim, handle)


def test_the_simulation_writes_sysfs_only_when_the_scenario_uses_it() -> None:
    assert make("gpus: 1\n")[0].sysfs_root is None
    sim, _, _ = make("gpus: 1\ndefaults: {pcieAerCorrectable: 3}\n")
    assert sim.sysfs_root is not None
    text = (sim.sysfs_root / "bus/pci/devices/0000:18:00.0/aer_dev_correctable").read_text()
    assert text.splitlines()[-1] == "TOTAL_ERR_COR 3"


# --- scenario validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("defaults: {fabricState: Ready}\n", "defaults.fabricState: expected one of Completed"),
        ("defaults: {fabricStatus: Fine}\n", "defaults.fabricStatus: expected one of"),
        (
            "timeline:\n- {after: 1s, gpu: 0, set: {nvlinkCrcErrors: 5}}\n"
            "- {after: 2s, gpu: 0, set: {nvlinkCrcErrors: 4}}\n",
            "counters only grow",
        ),
        ("timeline:\n- {after: 1s, nic: mlx5_0, set: {state: DOWN}}\n", "a device listed under `nics:`"),
        (
            "nics: [{name: mlx5_0}]\ntimeline:\n- {after: 1s, nic: mlx5_0, set: {state: Gone}}\n",
            "one of DOWN",
        ),
        (
            "nics: [{name: mlx5_0}]\ntimeline:\n- {after: 1s, nic: mlx5_0, port: 2, set: {state: DOWN}}\n",
            "port",
        ),
        (
            "nics: [{name: mlx5_0}]\ntimeline:\n- {after: 1s, nic: mlx5_0, gpu: 0, set: {state: DOWN}}\n",
            "not both",
        ),
        (
            "nics: [{name: mlx5_0, linkDowned: 2}]\n"
            "timeline:\n- {after: 1s, nic: mlx5_0, set: {linkDowned: 1}}\n",
            "counters only grow",
        ),
        ("nics: [{name: mlx5_0}, {name: mlx5_0, port: 1}]\n", "listed twice"),
    ],
)
def test_bad_link_and_nic_scenarios_are_refused_with_the_place(text: str, words: str) -> None:
    with pytest.raises(scenario.ScenarioError, match=words.replace("(", r"\(").replace(")", r"\)")):
        scenario.parse("gpus: 1\n" + text)


def test_a_nic_entry_sets_every_port_of_the_device_and_a_down_port_polls() -> None:
    plan = scenario.parse(
        "gpus: 1\nnics: [{name: mlx5_0, port: 1}, {name: mlx5_0, port: 2}]\n"
        "timeline:\n- {after: 10s, nic: mlx5_0, set: {state: DOWN, linkDowned: 1}}\n"
    )
    (entry,) = plan.timeline
    assert (entry.nic, entry.port, entry.gpu) == ("mlx5_0", None, -1)
    assert entry.set == {"state": "DOWN", "linkDowned": 1, "physState": "Polling"}


# --- through the collector -----------------------------------------------------------------------------


NVL = """gpus: 2
defaults: {fabricState: Completed, fabricCliqueId: 4, pcieAerCorrectable: 0}
nics: [{name: mlx5_0, port: 1, rateGbps: 400}]
timeline:
- {after: 5s, gpu: 1, set: {nvlinkLinksDown: 2, nvlinkCrcErrors: 40}}
- {after: 5s, gpu: 0, set: {pcieAerFatal: 1, fabricState: InProgress}}
- {after: 10s, nic: mlx5_0, set: {state: DOWN, linkDowned: 1}}
"""


def test_scripted_faults_reach_the_sample() -> None:
    _, col, clock = make(NVL)
    first = at(col, clock, 0)
    assert first.gpus[1]["nvlink"] == {
        "linksUp": 18,
        "linksDown": 0,
        "crcErrors": 0,
        "replayErrors": 0,
        "recoveryErrors": 0,
    }
    assert first.gpus[0]["fabric"] == {"state": "Completed", "status": "Success", "cliqueId": 4}
    assert first.gpus[0]["pcie"]["aer"] == {"fatal": 0, "nonFatal": 0, "correctable": 0}
    assert first.nics == [
        {
            "name": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "physState": "LinkUp",
            "rateGbps": 400.0,
            "linkDowned": 0,
            "symbolErrors": 0,
            "rcvErrors": 0,
        }
    ]
    col.request_full_sample()
    later = at(col, clock, 5)
    assert later.gpus[1]["nvlink"]["linksDown"] == 2 and later.gpus[1]["nvlink"]["crcErrors"] == 40
    assert later.gpus[0]["pcie"]["aer"]["fatal"] == 1
    assert later.gpus[0]["fabric"]["state"] == "InProgress"
    down = at(col, clock, 10)
    assert down.nics is not None and down.nics[0]["state"] == "DOWN", "a port's state: every sample"
    assert down.nics[0]["linkDowned"] == 0, "the rest of the port's files: on the slow tier"
    full = at(col, clock, 15)
    assert full.nics is not None
    assert (full.nics[0]["state"], full.nics[0]["physState"], full.nics[0]["linkDowned"]) == (
        "DOWN",
        "Polling",
        1,
    )


def test_link_state_is_read_every_sample_and_counters_on_slow_samples_only() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n- {after: 3s, gpu: 0, set: {nvlinkLinksDown: 1, nvlinkReplayErrors: 7}}\n",
        slow_period_seconds=10,
    )
    at(col, clock, 0)
    sample = at(col, clock, 3)
    assert sample.gpus[0]["nvlink"]["linksDown"] == 1, "a link going down shows at the next sample"
    assert sample.gpus[0]["nvlink"]["replayErrors"] == 0, "the counters wait for the slow tier"
    assert at(col, clock, 10).gpus[0]["nvlink"]["replayErrors"] == 7


def test_nvlink_costs_one_nvml_call_per_gpu_per_sample() -> None:
    sim, col, clock = make("gpus: 8\n", slow_period_seconds=1000)
    at(col, clock, 0)
    at(col, clock, 1)
    before = sim.calls
    at(col, clock, 2)
    # 7 fast-tier calls as before, 1 for all 18 links' states, 1 to count the GPUs.
    assert sim.calls - before == 8 * (7 + 1) + 1


@pytest.mark.parametrize("model", ["NVIDIA H100 PCIe", "NVIDIA L4", "NVIDIA L40S"])
def test_a_board_without_nvlink_fabric_aer_or_nics_reports_nothing_and_no_error(model: str) -> None:
    _, col, clock = make(f"gpus: 2\nmodel: {model}\n")
    sample = at(col, clock, 0)
    for gpu in sample.gpus:
        assert "nvlink" not in gpu and "fabric" not in gpu and "aer" not in gpu.get("pcie", {})
        assert "unreadable" not in gpu
    assert sample.nics is None
    assert not sample.errors, "NOT_SUPPORTED is a capability, not an error"
    code, _ = check.render({"gpus": sample.gpus}, xids.Catalogue.packaged(), "table")
    assert code == check.HEALTHY_EXIT


def test_not_supported_nvlink_and_fabric_leave_only_those_fields_absent() -> None:
    _, col, clock = make(
        "gpus: 2\ndefaults: {fabricState: Completed}\n"
        "timeline:\n- {after: 0s, gpu: 1, notSupported: [nvlink, fabric]}\n"
    )
    healthy, limited = at(col, clock, 0).gpus
    assert "nvlink" in healthy and "fabric" in healthy
    assert "nvlink" not in limited and "fabric" not in limited
    assert limited["temperatureCelsius"] == healthy["temperatureCelsius"]


def test_a_driver_without_the_link_fields_falls_back_to_per_link_calls_on_slow_samples() -> None:
    sim, col, clock = make(
        "gpus: 1\ndefaults: {nvlinks: 4}\ntimeline:\n- {after: 2s, gpu: 0, set: {nvlinkLinksDown: 1}}\n",
        slow_period_seconds=5,
    )
    real_field_values = sim.nvmlDeviceGetFieldValues

    def old_driver(handle: Any, ids: Any) -> Any:
        answers = real_field_values(handle, ids)
        return [
            simulated.FieldValue(v.fieldId, pynvml.NVML_ERROR_NOT_SUPPORTED, simulated.Value(0), v.scopeId)
            if v.fieldId == nvml.FI_DEV_NVLINK_GET_STATE
            else v
            for v in answers
        ]

    sim.nvmlDeviceGetFieldValues = old_driver  # type: ignore[method-assign]
    assert at(col, clock, 0).gpus[0]["nvlink"]["linksUp"] == 4
    assert at(col, clock, 2).gpus[0]["nvlink"]["linksDown"] == 0, "kept until the next slow sample"
    assert at(col, clock, 5).gpus[0]["nvlink"]["linksDown"] == 1


def test_a_failing_nvlink_read_keeps_its_last_value_then_is_unreadable() -> None:
    _, col, clock = make(
        "gpus: 1\ntimeline:\n"
        "- {after: 1s, gpu: 0, fail: {function: nvmlDeviceGetFieldValues, error: Unknown}}\n",
        slow_period_seconds=1000,
    )
    assert "nvlink" in at(col, clock, 0).gpus[0]
    assert "nvlink" in at(col, clock, 1).gpus[0]
    at(col, clock, 2)
    gpu = at(col, clock, 3).gpus[0]
    assert "nvlink" not in gpu and "nvlink" in gpu["unreadable"]


def test_a_gpu_lost_during_the_link_scan_is_lost() -> None:
    _, col, clock = make("gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, xid: 79}\n")
    at(col, clock, 0)
    assert at(col, clock, 1).gpus[1].get("lost") is True


def test_no_sysfs_root_means_no_aer_and_no_nics(tmp_path: Path) -> None:
    _, col, clock = make(NVL, sysfs_root=None)
    sample = at(col, clock, 0)
    assert sample.nics is None
    assert "aer" not in sample.gpus[0]["pcie"]


# --- the write decision ----------------------------------------------------------------------------------


def _node(gpu: dict[str, Any], nics: list[dict[str, Any]] | None = None) -> Any:
    node: dict[str, Any] = {"gpus": [{"index": 0, **gpu}]}
    if nics is not None:
        node["nics"] = nics
    return node


@pytest.mark.parametrize(
    ("before", "after", "significant"),
    [
        ({"nvlink": {"linksUp": 18, "linksDown": 0}}, {"nvlink": {"linksUp": 17, "linksDown": 1}}, True),
        ({"nvlink": {"linksUp": 18, "crcErrors": 1}}, {"nvlink": {"linksUp": 18, "crcErrors": 9}}, False),
        ({"fabric": {"state": "Completed"}}, {"fabric": {"state": "InProgress"}}, True),
        (
            {"pcie": {"aer": {"fatal": 0, "correctable": 1}}},
            {"pcie": {"aer": {"fatal": 1, "correctable": 1}}},
            True,
        ),
        ({"pcie": {"aer": {"nonFatal": 0}}}, {"pcie": {"aer": {"nonFatal": 2}}}, True),
        ({"pcie": {"aer": {"correctable": 1}}}, {"pcie": {"aer": {"correctable": 50}}}, False),
    ],
)
def test_which_gpu_link_changes_write_at_once(before: Any, after: Any, significant: bool) -> None:
    changed = changes.fingerprint(_node(before)) != changes.fingerprint(_node(after))
    assert changed is significant


PORT = {"name": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "rateGbps": 400.0}


@pytest.mark.parametrize(
    ("after", "significant"),
    [
        ({"state": "DOWN", "physState": "Polling"}, True),
        ({"rateGbps": 200.0}, True),
        ({"linkDowned": 1}, True),
        ({"symbolErrors": 100}, False),
        ({"rcvErrors": 3}, False),
    ],
)
def test_which_nic_changes_write_at_once(after: dict[str, Any], significant: bool) -> None:
    before = {**PORT, "linkDowned": 0, "symbolErrors": 0, "rcvErrors": 0}
    now = {**before, **after}
    changed = changes.fingerprint(_node({}, [before])) != changes.fingerprint(_node({}, [now]))
    assert changed is significant


# --- check -------------------------------------------------------------------------------------------------


def test_check_shows_links_fabric_aer_and_nics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "s.yaml"
    plan.write_text(NVL)
    assert cli.main(["check", "--backend", "sim", "--sim-scenario", str(plan)]) in (0, 1)
    out = capsys.readouterr().out
    rows = out.splitlines()
    # Issue 45, item 7: a port DOWN whose physState is not Disabled is NicDegraded from one report.
    assert rows[1] == "WARNING NicDegraded: mlx5_0/1: DOWN (physState Polling)"
    rows = rows[1:]
    assert rows[1].split()[6:9] == ["NVLINK", "FABRIC", "AER"]
    assert "16/18 crc 40" in rows[3]
    assert "InProgress clique 4" in rows[2] and "1/0/0" in rows[2]
    assert rows[-1] == (
        "NIC mlx5_0 port 1: DOWN (Polling), 400.0 Gb/s, link downed 1, symbol errors 0, rcv errors 0"
    )
    assert cli.main(["check", "--backend", "sim", "--sim-scenario", str(plan), "-o", "json"]) in (0, 1)
    answer = json.loads(capsys.readouterr().out)
    assert answer["nics"][0]["state"] == "DOWN"
    assert answer["gpus"][1]["nvlink"]["linksDown"] == 2
    assert answer["gpus"][0]["pcie"]["aer"]["fatal"] == 1
    assert answer["gpus"][0]["fabric"] == {"state": "InProgress", "status": "Success", "cliqueId": 4}


# --- metrics -----------------------------------------------------------------------------------------------


def test_metrics_show_links_fabric_aer_and_ports_and_nothing_for_a_pcie_board() -> None:
    registry = prometheus_client.CollectorRegistry()
    exported = metrics.AgentMetrics(registry)
    _, col, clock = make(NVL)
    col.request_full_sample()
    at(col, clock, 0)
    exported.observe(at(col, clock, 10))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"gpuhealth_agent_{name}", labels)

    assert value("gpu_nvlink_links", gpu="1", uuid=simulated.gpu_uuid("node-a", 1), state="down") == 2
    assert value("gpu_nvlink_errors", gpu="1", uuid=simulated.gpu_uuid("node-a", 1), kind="crc") == 40
    assert value("gpu_fabric_state", gpu="0", uuid=simulated.gpu_uuid("node-a", 0)) == 2
    assert value("gpu_pcie_aer_errors", gpu="0", uuid=simulated.gpu_uuid("node-a", 0), kind="fatal") == 1
    assert value("nic_port_active", device="mlx5_0", port="1") == 0
    assert value("nic_port_rate_gbps", device="mlx5_0", port="1") == 400
    assert value("nic_port_errors", device="mlx5_0", port="1", kind="link_downed") == 1

    pcie_registry = prometheus_client.CollectorRegistry()
    pcie = metrics.AgentMetrics(pcie_registry)
    _, col, clock = make("gpus: 1\nmodel: NVIDIA H100 PCIe\n")
    pcie.observe(at(col, clock, 0))
    names = {s.name for family in pcie_registry.collect() for s in family.samples}
    assert not {n for n in names if "nvlink" in n or "fabric" in n or "aer" in n or "nic_port" in n}
