"""The simulated NVML behaves like pynvml: same functions, same error classes, same event API."""

import threading
from typing import Any

import pynvml
import pytest

from gpuhealth_agent import events, nvml, scenario, simulated


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.seconds += seconds


def make(text: str, seed: str = "node-a") -> tuple[simulated.SimulatedNvml, Clock]:
    clock = Clock()
    return simulated.SimulatedNvml(
        scenario.parse(text), clock=clock, start=0.0, sleep=clock.sleep, identity_seed=seed
    ), clock


def test_errors_are_pynvmls_own_classes() -> None:
    sim, clock = make(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 0, xid: 79}\n- {after: 0s, gpu: 1, notSupported: [ecc]}\n"
    )
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetTotalEccErrors(h1, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
    clock.seconds = 1
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as caught:
        sim.nvmlDeviceGetPowerUsage(h0)
    assert caught.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(5)


def test_units_match_nvml() -> None:
    sim, _ = make("gpus: 1\ndefaults: {powerWatts: 312.5, memoryUsedMiB: 2048, memoryTotalMiB: 4096}\n")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetPowerUsage(h) == 312_500  # milliwatts
    memory = sim.nvmlDeviceGetMemoryInfo(h)
    assert (memory.used, memory.total, memory.free) == (2048 * 2**20, 4096 * 2**20, 2048 * 2**20)
    assert sim.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)


def test_clock_event_reasons_are_nvml_bitmasks() -> None:
    sim, _ = make("gpus: 1\ndefaults: {clockEventReasons: [SwThermalSlowdown, HwThermalSlowdown]}\n")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    mask = sim.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert (
        mask == pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    assert sim.nvmlDeviceGetCurrentClocksThrottleReasons(h) == mask


def test_recovery_action_through_field_values() -> None:
    sim, _ = make(
        "gpus: 2\ndefaults: {recoveryAction: NodeReboot}\ntimeline:\n"
        "- {after: 0s, gpu: 1, notSupported: [recoveryAction]}\n"
    )
    field = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    (value,) = sim.nvmlDeviceGetFieldValues(sim.nvmlDeviceGetHandleByIndex(0), [field])
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    assert value.value.ullVal == pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    (other,) = sim.nvmlDeviceGetFieldValues(sim.nvmlDeviceGetHandleByIndex(1), [field])
    assert other.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_identities_are_stable_per_node_and_distinct_across_nodes() -> None:
    a1, _ = make("gpus: 2\n", seed="node-a")
    a2, _ = make("gpus: 2\n", seed="node-a")
    b, _ = make("gpus: 2\n", seed="node-b")
    uuids = lambda sim: [sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]  # noqa: E731
    assert uuids(a1) == uuids(a2)
    assert not set(uuids(a1)) & set(uuids(b))
    assert len(set(uuids(a1))) == 2


def test_a_failure_window_ends() -> None:
    sim, clock = make(
        "gpus: 1\ntimeline:\n- {after: 2s, gpu: 0, fail: {function: nvmlDeviceGetPowerUsage, "
        "error: Unknown, for: 3s}}\n"
    )
    h = sim.nvmlDeviceGetHandleByIndex(0)
    clock.seconds = 2
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetPowerUsage(h)
    clock.seconds = 4.9
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetPowerUsage(h)
    clock.seconds = 5
    assert sim.nvmlDeviceGetPowerUsage(h) == 300_000


def test_rewinding_the_clock_replays_the_timeline() -> None:
    sim, clock = make("gpus: 1\ntimeline:\n- {after: 5s, gpu: 0, set: {temperatureCelsius: 90}}\n")
    h = sim.nvmlDeviceGetHandleByIndex(0)
    clock.seconds = 6
    assert sim.nvmlDeviceGetTemperatureV(h, nvml.TEMPERATURE_GPU) == 90
    clock.seconds = 1
    assert sim.nvmlDeviceGetTemperatureV(h, nvml.TEMPERATURE_GPU) == 40


def _event_set(sim: simulated.SimulatedNvml, gpus: list[int], mask: int = events.EVENT_TYPES) -> Any:
    event_set = sim.nvmlEventSetCreate()
    for gpu in gpus:
        sim.nvmlDeviceRegisterEvents(sim.nvmlDeviceGetHandleByIndex(gpu), mask, event_set)
    return event_set


def test_xid_and_dbe_events_arrive_through_the_event_api() -> None:
    sim, clock = make(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 0, xid: 13}\n"
        "- {after: 2s, gpu: 1, set: {eccUncorrectedVolatile: 1}}\n"
        "- {after: 3s, gpu: 1, xid: 48}\n"
    )
    event_set = _event_set(sim, [0, 1])
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 0)
    clock.seconds = 3
    first = sim.nvmlEventSetWait_v2(event_set, 0)
    assert (first.device, first.eventType, first.eventData) == (
        sim.nvmlDeviceGetHandleByIndex(0),
        pynvml.nvmlEventTypeXidCriticalError,
        13,
    )
    second = sim.nvmlEventSetWait_v2(event_set, 0)
    assert (second.device.gpu, second.eventType) == (1, pynvml.nvmlEventTypeDoubleBitEccError)
    third = sim.nvmlEventSetWait_v2(event_set, 0)
    assert (third.device.gpu, third.eventData) == (1, 48)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 0)
    assert sim.nvmlDeviceGetIndex(third.device) == 1


def test_events_only_for_registered_gpus_and_types_and_only_after_the_set_exists() -> None:
    sim, clock = make(
        "gpus: 2\ntimeline:\n- {after: 1s, gpu: 0, xid: 31}\n- {after: 2s, gpu: 1, xid: 31}\n"
        "- {after: 3s, gpu: 0, set: {eccUncorrectedVolatile: 1}}\n- {after: 4s, gpu: 0, xid: 43}\n"
    )
    clock.seconds = 1.5
    late = _event_set(sim, [0, 1], mask=pynvml.nvmlEventTypeXidCriticalError)
    clock.seconds = 10
    assert sim.nvmlEventSetWait_v2(late, 0).eventData == 31  # gpu 1 at 2s; gpu 0's XID at 1s predates the set
    assert sim.nvmlEventSetWait_v2(late, 0).eventData == 43  # the DBE at 3s is not registered for
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(late, 0)


def test_events_at_time_zero_reach_the_agents_first_set_only() -> None:
    sim, clock = make(
        "gpus: 2\ntimeline:\n- {after: 0s, gpu: 1, xid: 48}\n"
        "- {after: 0s, gpu: 0, set: {eccUncorrectedVolatile: 1}}\n- {after: 1s, gpu: 0, xid: 31}\n"
    )
    clock.seconds = 2  # the agent's start-up took a while: the 1 s XID predates its set, the 0 s ones do not
    first = _event_set(sim, [0, 1], mask=pynvml.nvmlEventTypeXidCriticalError)
    event = sim.nvmlEventSetWait_v2(first, 0)
    assert (event.device.gpu, event.eventData) == (1, 48)  # the DBE at 0s is not registered for
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(first, 0)
    again = _event_set(sim, [0, 1], mask=pynvml.nvmlEventTypeXidCriticalError)  # a re-initialised agent
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(again, 0)


def test_waiting_sleeps_until_the_next_event_or_times_out() -> None:
    sim, clock = make("gpus: 1\ntimeline:\n- {after: 2.5s, gpu: 0, xid: 94}\n")
    event_set = _event_set(sim, [0])
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 1000)
    assert clock.seconds == pytest.approx(1.0)
    event = sim.nvmlEventSetWait_v2(event_set, 5000)
    assert event.eventData == 94
    assert clock.seconds == pytest.approx(2.5)  # woke at the event, not at the timeout
    sim.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlEventSetWait_v2(event_set, 0)


def test_xid_79_marks_the_gpu_lost_and_a_reset_brings_it_back() -> None:
    sim, clock = make(
        "gpus: 1\ntimeline:\n- {after: 1s, gpu: 0, xid: 79}\n- {after: 2s, gpu: 0, reset: true}\n"
    )
    h = sim.nvmlDeviceGetHandleByIndex(0)
    clock.seconds = 1
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetName(h)
    clock.seconds = 2
    assert sim.nvmlDeviceGetName(h) == scenario.DEFAULT_MODEL


def test_the_event_watcher_thread_delivers_events_and_wakes_the_loop() -> None:
    sim, _ = make("gpus: 2\ntimeline:\n- {after: 1s, gpu: 1, xid: 79}\n")
    woke = threading.Event()
    watcher = events.EventWatcher(simulated_library(sim), wake=woke.set)
    assert watcher.open([sim.nvmlDeviceGetHandleByIndex(i) for i in range(2)]) == 2
    stop = threading.Event()
    thread = watcher.start_thread(stop)
    try:
        assert woke.wait(timeout=10), "the watcher never woke the loop"
        (event,) = watcher.drain()
        assert event.kind is events.Kind.XID
        assert event.code == 79
        assert event.handle.gpu == 1
    finally:
        stop.set()
        thread.join(timeout=10)
        watcher.close()
    assert not thread.is_alive()


def test_a_gpu_that_answers_later_is_registered_once() -> None:
    sim, clock = make("gpus: 2\ntimeline:\n- {after: 5s, gpu: 1, xid: 31}\n")
    watcher = events.EventWatcher(simulated_library(sim))
    first, second = (sim.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert watcher.open([first]) == 1
    assert watcher.register([first, second]) == 2
    assert watcher.register([sim.nvmlDeviceGetHandleByIndex(1)]) == 2  # a new handle object, same GPU
    clock.seconds = 6
    assert watcher.poll() == 1
    (event,) = watcher.drain()
    assert (event.handle.gpu, event.code) == (1, 31)


def simulated_library(sim: simulated.SimulatedNvml) -> nvml.Library:
    lib: nvml.Library = sim
    return lib


def test_visible_gpus_is_what_a_runtime_that_hides_gpus_shows() -> None:
    """`visibleGpus: 0`: the container runtime hides every GPU from the agent (NVML counts none)."""
    hidden = simulated.SimulatedNvml(
        scenario.parse("gpus: 8\nvisibleGpus: 0\n"), clock=lambda: 0.0, start=0.0
    )
    assert hidden.nvmlDeviceGetCount() == 0
    some = simulated.SimulatedNvml(scenario.parse("gpus: 8\nvisibleGpus: 2\n"), clock=lambda: 0.0, start=0.0)
    assert some.nvmlDeviceGetCount() == 2
    assert scenario.parse("gpus: 8\n").visible_gpus == 8
    with pytest.raises(scenario.ScenarioError, match="visibleGpus"):
        scenario.parse("gpus: 2\nvisibleGpus: 3\n")
