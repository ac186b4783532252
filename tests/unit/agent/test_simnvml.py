"""The production NVML path (real pynvml, unmodified) over the simulated NVML library, fact by fact.

Every test here reads GPUs through `nvml.real()`, i.e. the pynvml module, which loads
`libnvidia-ml.so.1`: the C library hack/simnvml.sh builds against NVIDIA's nvml.h
(native/simnvml/simnvml.c), scripted by a scenario through gpuhealth_agent.simnvml. What is asserted is
what the agent reports (`status.gpus[]`), compared where it helps with the Python backend's report.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import pynvml
import pytest

import simnvml_build
from gpuhealth_agent import collector, events, facts, nvml, runner, scenario, simnvml, simulated

START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


@pytest.fixture
def library() -> ctypes.CDLL:
    return simnvml_build.preload()


class Node:
    """One scripted node read through pynvml over the library (`real`) and through the Python backend."""

    def __init__(self, lib: ctypes.CDLL, text: str, seed: str = "node-a") -> None:
        self.clock = Clock()
        self.plan = scenario.parse(text)
        self.driver = simnvml.Driver(self.plan, clock=self.clock, start=0.0, identity_seed=seed, lib=lib)
        self.real = nvml.real()
        self.real.nvmlInit()
        self.collector = collector.Collector(
            self.real, expected_gpus=self.plan.expected_gpus, sysfs_root=self.driver.sysfs_root
        )
        self.python = simulated.SimulatedNvml(self.plan, clock=self.clock, start=0.0, identity_seed=seed)
        self.python_collector = collector.Collector(
            self.python, expected_gpus=self.plan.expected_gpus, sysfs_root=self.python.sysfs_root
        )

    def sample(self, seconds: float = 0.0) -> list[Any]:
        """The library's GPUs at scenario time `seconds` (the Python backend's in `.python_gpus`)."""
        self.clock.seconds = seconds
        gpus = list(self.collector.sample(START + seconds).gpus)
        self.python_gpus = list(self.python_collector.sample(START + seconds).gpus)
        return gpus

    def request_full_sample(self) -> None:
        self.collector.request_full_sample()
        self.python_collector.request_full_sample()

    def close(self) -> None:
        self.driver.close()
        self.real.nvmlShutdown()


@pytest.fixture
def node(library: ctypes.CDLL) -> Any:
    made: list[Node] = []

    def make(text: str, seed: str = "node-a") -> Node:
        made.append(Node(library, text, seed))
        return made[-1]

    yield make
    for n in made:
        n.close()


def dig(gpu: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        gpu = gpu[key]
    return gpu


def test_pynvml_loads_the_simulation_by_its_soname(library: ctypes.CDLL) -> None:
    """pynvml's own loader (CDLL("libnvidia-ml.so.1")) gets the simulation: its handle is ours."""
    pynvml.nvmlInit()
    try:
        assert hasattr(pynvml.nvmlLib, "simnvml_reset")
        assert pynvml.nvmlSystemGetNVMLVersion().startswith("13.")
    finally:
        pynvml.nvmlShutdown()


def test_identity_count_handles_uuid_name_and_pci_bus_id(node: Any) -> None:
    n = node("gpus: 4\nmodel: NVIDIA A100-SXM4-80GB\ndriverVersion: 550.90.07\n")
    gpus = n.sample()
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["uuid"] for g in gpus] == [n.python.uuid(i) for i in range(4)]
    assert {g["model"] for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert [g["pciBusId"] for g in gpus] == [simulated.bus_id(i) for i in range(4)]
    assert n.collector.sample(START).driver_version == "550.90.07"
    handles = [n.real.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    assert [n.real.nvmlDeviceGetIndex(h) for h in handles] == [0, 1, 2, 3]
    assert nvml.same_device(handles[2], n.real.nvmlDeviceGetHandleByIndex(2))
    assert not nvml.same_device(handles[1], handles[2])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        n.real.nvmlDeviceGetHandleByIndex(4)


def _value(fact: facts.Fact) -> Any:
    """A value unlike the default, valid for the fact."""
    if fact.type is facts.Type.BOOL:
        return True
    if fact.type is facts.Type.REASONS:
        return ["SwPowerCap", "HwThermalSlowdown"]
    if fact.type is facts.Type.RECOVERY:
        return "DrainAndReset"
    if fact.type is facts.Type.FLOAT:
        return 123.4
    if fact.type is facts.Type.STR:
        return "1654321098765"
    return {"pcieGeneration": 3, "pcieMaxGeneration": 4, "pcieWidth": 8, "pcieMaxWidth": 16}.get(fact.key, 7)


@pytest.mark.parametrize("fact", facts.FACTS, ids=[f.key for f in facts.FACTS])
def test_each_fact_through_the_real_binding(node: Any, fact: facts.Fact) -> None:
    """ECC (volatile/aggregate, corrected/uncorrected), retired pages, remapped rows, clocks and
    clock-event reasons, temperature and slowdown threshold, power, utilisation, memory, PCIe
    generation/width/replay, recovery action, serial: set in the scenario, reported by the agent,
    as the Python backend reports it."""
    value = json.dumps(_value(fact))
    if fact.tier is facts.Tier.STATIC:  # read when the GPU set changes: said from the start
        n = node(f"gpus: 2\ndefaults: {{{fact.key}: {value}}}\n")
        gpus = n.sample(0)
    else:
        n = node(f"gpus: 2\ntimeline:\n- {{after: 5s, gpu: 1, set: {{{fact.key}: {value}}}}}\n")
        default = dig(n.sample(0)[1], fact.path)
        n.request_full_sample()
        gpus = n.sample(5)
        assert dig(gpus[0], fact.path) == default  # the other GPU unchanged
    assert dig(gpus[1], fact.path) == _value(fact)
    assert gpus == n.python_gpus


def test_xids_through_the_event_set(node: Any) -> None:
    """nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2: the XID, its GPU, then Timeout."""
    n = node(
        "gpus: 3\ntimeline:\n- {after: 2s, gpu: 2, xid: 48}\n"
        "- {after: 3s, gpu: 0, set: {eccUncorrectedVolatile: 1}}\n"
    )
    n.sample(0)
    watcher = events.EventWatcher(n.real)
    assert watcher.open(n.collector.handles()) == 3
    assert watcher.poll() == 0  # nothing yet: nvmlEventSetWait_v2(set, 0) answers Timeout
    n.clock.seconds = 3
    assert watcher.poll() == 2
    xid, dbe = watcher.drain()
    assert (xid.kind, xid.code) == (events.Kind.XID, 48)
    assert n.collector.identify(xid.handle).index == 2
    assert dbe.kind is events.Kind.DBE and n.collector.identify(dbe.handle).index == 0
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(watcher._set, 20)  # waits 20 ms of real time, polling the scenario
    watcher.close()


def test_an_xid_at_time_zero_reaches_the_first_event_set(node: Any) -> None:
    n = node("gpus: 2\ntimeline:\n- {after: 0s, gpu: 1, xid: 48}\n")
    n.sample(0)
    watcher = events.EventWatcher(n.real)
    watcher.open([n.real.nvmlDeviceGetHandleByIndex(i) for i in range(2)])
    assert watcher.poll() == 1
    assert watcher.drain()[0].code == 48
    watcher.close()


def test_a_gpu_lost_mid_sample(node: Any) -> None:
    """Identity reads fine, then NVML_ERROR_GPU_IS_LOST on a counter: reported lost, by UUID."""
    n = node(
        "gpus: 2\ntimeline:\n"
        "- {after: 5s, gpu: 1, fail: {function: nvmlDeviceGetTotalEccErrors, error: GpuIsLost}}\n"
        "- {after: 9s, gpu: 0, xid: 79}\n"
    )
    assert not any(g.get("lost") for g in n.sample(0))
    gpus = n.sample(5)
    assert gpus[1]["lost"] is True and gpus[1]["uuid"] == n.python.uuid(1)
    assert "lost" not in gpus[0] or gpus[0]["lost"] is False
    assert n.sample(9)[0]["lost"] is True  # XID 79: every call on it answers GPU_IS_LOST
    assert n.sample(10) == n.python_gpus


def test_not_supported_per_field(node: Any) -> None:
    """NOT_SUPPORTED leaves exactly that field absent; the rest of the GPU is reported."""
    n = node("gpus: 2\ndefaults: {notSupported: [ecc, retiredPages, recoveryAction, pcieReplayCounter]}\n")
    gpu = n.sample(0)[0]
    assert "ecc" not in gpu and "retiredPages" not in gpu and "recoveryAction" not in gpu
    assert "replayCounter" not in gpu["pcie"] and gpu["pcie"]["width"] == 16
    assert gpu["temperatureCelsius"] == 40 and gpu["remappedRows"]["failure"] is False
    assert n.sample(1) == n.python_gpus


def test_a_failing_call_keeps_the_last_value_then_recovers(node: Any) -> None:
    n = node(
        "gpus: 1\ndefaults: {powerWatts: 250}\ntimeline:\n"
        "- {after: 2s, gpu: 0, fail: {function: nvmlDeviceGetPowerUsage, error: Unknown, for: 3s}}\n"
    )
    assert n.sample(0)[0]["powerWatts"] == 250.0
    assert n.sample(2)[0]["powerWatts"] == 250.0  # a short outage keeps the last good value
    assert n.collector.sample(START + 2).errors[("nvmlDeviceGetPowerUsage", "Unknown")] == 1
    assert n.sample(6)[0]["powerWatts"] == 250.0 and "unreadable" not in n.sample(6)[0]


def test_nvlink_states_and_error_counters(node: Any) -> None:
    """One nvmlDeviceGetFieldValues call (NVLINK_GET_STATE and DL counters, scopeId = link)."""
    n = node(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, set: {nvlinkLinksDown: 2, nvlinkCrcErrors: 9, "
        "nvlinkReplayErrors: 4, nvlinkRecoveryErrors: 1}}\n"
    )
    assert n.sample(0)[1]["nvlink"] == {
        "linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0,
    }  # fmt: skip
    n.request_full_sample()
    assert n.sample(1)[1]["nvlink"] == {
        "linksUp": 16, "linksDown": 2, "crcErrors": 9, "replayErrors": 4, "recoveryErrors": 1,
    }  # fmt: skip
    handle = n.real.nvmlDeviceGetHandleByIndex(1)
    assert (
        n.real.nvmlDeviceGetNvLinkState(handle, 17) == 0 and n.real.nvmlDeviceGetNvLinkState(handle, 0) == 1
    )
    assert n.real.nvmlDeviceGetNvLinkErrorCounter(handle, 0, nvml.NVLINK_ERROR_DL_CRC_FLIT) == 9
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        n.real.nvmlDeviceGetNvLinkState(handle, 18)


def test_a_board_without_nvlink_reports_none(node: Any) -> None:
    n = node("gpus: 1\nmodel: NVIDIA H100 PCIe\n")
    assert "nvlink" not in n.sample(0)[0]
    n2 = node("gpus: 1\ndefaults: {notSupported: [nvlink]}\n")
    assert "nvlink" not in n2.sample(0)[0]


def fabric_readable() -> bool:
    """Whether this nvidia-ml-py declares the driver's nvmlGpuFabricInfo_t (12.535's is R535's layout)."""
    try:
        nvml.fabric_info()
    except nvml.FunctionNotFound:
        return False
    return True


def test_fabric_info_state_status_and_clique(node: Any) -> None:
    # Only a binding that predates cliques (nvidia-ml-py 12.535) is refused, never a current one.
    declares_cliques = any(name == "cliqueId" for name, *_ in pynvml.c_nvmlGpuFabricInfo_t._fields_)
    assert fabric_readable() == declares_cliques
    if not fabric_readable():
        n = node("gpus: 1\nmodel: NVIDIA GB200\ndefaults: {fabricState: Completed, fabricCliqueId: 7}\n")
        assert "fabric" not in n.sample(0)[0]  # not read from a struct of the wrong layout, and said so
        assert n.collector.sample(START).errors == {}  # FunctionNotFound: not supported, not an error
        return
    n = node(
        "gpus: 2\nmodel: NVIDIA GB200\ndefaults: {fabricState: Completed, fabricCliqueId: 32766}\n"
        "timeline:\n- {after: 1s, gpu: 1, set: {fabricStatus: NotReady}}\n"
    )
    assert n.sample(0)[0]["fabric"] == {"state": "Completed", "status": "Success", "cliqueId": 32766}
    n.request_full_sample()
    assert n.sample(1)[1]["fabric"]["status"] == "NotReady"
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(n.real.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert (info.state, info.cliqueId) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 32766)
    plain = node("gpus: 1\n")  # an H100 SXM: NVML answers NOT_SUPPORTED, the field is absent
    assert "fabric" not in plain.sample(0)[0]


def test_fabric_info_prefers_the_versioned_call_and_falls_back_without_it(node: Any) -> None:
    """nvmlDeviceGetGpuFabricInfoV (version-tagged) where binding and driver have it; a driver without it
    (FunctionNotFound) is read with the plain call. Same on the Python backend."""
    if nvml.fabric_info_v() is None or not fabric_readable():
        pytest.skip(f"nvidia-ml-py {pynvml.__file__} declares no versioned fabric struct")
    n = node(
        "gpus: 2\ndefaults: {fabricState: Completed, fabricCliqueId: 5}\ntimeline:\n"
        "- {after: 0s, gpu: 0, fail: {function: nvmlDeviceGetGpuFabricInfo, error: Unknown}}\n"
        "- {after: 0s, gpu: 1, fail: {function: nvmlDeviceGetGpuFabricInfoV, error: FunctionNotFound}}\n"
    )
    gpus = n.sample(0)
    assert gpus[0]["fabric"]["cliqueId"] == 5  # through V: the plain call's failure is never met
    assert gpus[1]["fabric"]["cliqueId"] == 5  # through the plain call
    assert gpus == n.python_gpus


def test_recovery_action_field(node: Any) -> None:
    n = node("gpus: 2\ntimeline:\n- {after: 1s, gpu: 0, set: {recoveryAction: NodeReboot}}\n")
    assert n.sample(0)[0]["recoveryAction"] == "None"
    assert n.sample(1)[0]["recoveryAction"] == "NodeReboot"
    (value,) = n.real.nvmlDeviceGetFieldValues(n.real.nvmlDeviceGetHandleByIndex(0), [9999])
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # a field id the driver does not know


def test_struct_versions_are_checked_as_the_driver_does(node: Any) -> None:
    """pynvml sets nvmlMemory_v2 and nvmlTemperature_v1 tags; a wrong one is ArgumentVersionMismatch."""
    n = node("gpus: 1\ndefaults: {memoryUsedMiB: 1024}\n")
    handle = n.real.nvmlDeviceGetHandleByIndex(0)
    assert n.real.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used == 1024 * 2**20
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)
    assert nvml.call(n.real, "nvmlDeviceGetTemperatureV", handle, nvml.TEMPERATURE_GPU) == 40


def test_a_reset_from_outside_reaches_the_library(node: Any) -> None:
    n = node("gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, set: {eccUncorrectedVolatile: 3}}\n")
    assert n.sample(1)[1]["ecc"]["uncorrectedVolatile"] == 3
    n.driver.sim.reset_gpus([1])
    assert n.sample(2)[1]["ecc"]["uncorrectedVolatile"] == 0


def test_not_the_simulation_is_never_driven() -> None:
    class Real:  # a driver's libnvidia-ml.so.1 has no simnvml_* control API
        pass

    with pytest.raises(simnvml.NotTheSimulation):
        simnvml.Driver(scenario.parse("gpus: 1\n"), lib=Real())  # type: ignore[arg-type]


def test_a_restarted_agent_initialises_nvml_again_and_gets_the_later_xids(library: ctypes.CDLL) -> None:
    """Agent close (event set freed, nvmlShutdown) then a new agent in the same process (a restart):
    nvmlInit works again, its new event set gets the XIDs after it, not the ones before."""
    clock = Clock()
    plan = scenario.parse(
        "gpus: 2\ntimeline:\n- {after: 2s, gpu: 1, xid: 48}\n- {after: 5s, gpu: 0, xid: 31}\n"
    )
    driver = simnvml.Driver(plan, clock=clock, start=0.0, lib=library)

    def agent() -> runner.Agent:
        settings = runner.Settings("n", runner.BACKEND_NVML, expected_gpus=2, event_thread=False)
        return runner.Agent(settings, nvml.real(), clock=lambda: START + clock.seconds)

    try:
        first = agent()
        first.run_once(START)
        clock.seconds = 2
        gpus = first.run_once(START + 2).status["gpus"]
        assert [x["code"] for x in gpus[1]["xids"]] == [48]
        first.close()
        with pytest.raises(pynvml.NVMLError_Uninitialized):  # the library saw the shutdown
            pynvml.nvmlDeviceGetCount()
        second = agent()
        clock.seconds = 3
        assert len(second.run_once(START + 3).status["gpus"]) == 2
        clock.seconds = 5
        gpus = second.run_once(START + 5).status["gpus"]
        assert [x["code"] for x in gpus[0]["xids"]] == [31]
        # XID 48 happened before this set existed: a restart restores it from the GPUNode's earlier
        # status (the reporter's job, tested against a cluster), not from NVML.
        assert "xids" not in gpus[1]
        second.close()
    finally:
        driver.close()
