"""The NVML surface: pynvml's errors by name, a shim for old bindings, call counting, handle identity."""

import ctypes

import pynvml
import pytest

from gpuhealth_agent import nvml, scenario, simulated
from gpuhealth_api import vocabulary


def test_errors_by_short_name_are_pynvmls_classes() -> None:
    assert isinstance(nvml.error("GpuIsLost"), pynvml.NVMLError_GpuIsLost)
    assert isinstance(nvml.error("NotSupported"), pynvml.NVMLError_NotSupported)
    assert nvml.error_name(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)) == "Timeout"
    assert {"Unknown", "GpuIsLost", "NotSupported", "Timeout", "FunctionNotFound"} <= nvml.ERROR_NAMES


def test_a_function_the_binding_lacks_raises_function_not_found() -> None:
    lib = nvml.real()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        lib.nvmlDeviceGetSomethingFromTheFuture()  # type: ignore[attr-defined]
    assert lib.nvmlDeviceGetCount is pynvml.nvmlDeviceGetCount


def test_recovery_action_names_match_the_contract() -> None:
    assert nvml.RECOVERY_ACTIONS[pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET] == "GpuReset"
    assert nvml.RECOVERY_ACTIONS[pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET] == "DrainAndReset"
    assert nvml.FI_DEV_GET_GPU_RECOVERY_ACTION == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def test_counting_counts_every_call_and_passes_through() -> None:
    sim = simulated.SimulatedNvml(scenario.parse("gpus: 2\n"), clock=lambda: 0.0, start=0.0)
    lib, counter = nvml.counting(sim)
    assert lib.nvmlDeviceGetCount() == 2
    handle = lib.nvmlDeviceGetHandleByIndex(1)
    assert lib.nvmlDeviceGetUUID(handle) == sim.uuid(1)
    assert counter.calls == 3


def test_same_device_compares_pointers_by_address() -> None:
    target = ctypes.c_int(5)
    a = ctypes.pointer(target)
    b = ctypes.pointer(target)
    assert a is not b and nvml.same_device(a, b)
    assert not nvml.same_device(a, ctypes.pointer(ctypes.c_int(5)))
    assert nvml.same_device(simulated.Handle(1), simulated.Handle(1))


def test_every_recovery_action_pynvml_defines_has_its_contract_name() -> None:
    defined = {
        getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_GPU_RECOVERY_ACTION_")
    }
    assert len(defined) >= 8
    assert set(nvml.RECOVERY_ACTIONS) == set(defined)
    for code, name in defined.items():
        expected = name.removeprefix("NVML_GPU_RECOVERY_ACTION_")
        assert vocabulary.RecoveryAction[expected].value == nvml.RECOVERY_ACTIONS[code]


class _FabricInfoR535(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvidia-ml-py 12.535 declares it: R535's layout (80-byte UUID, partitionId,
    a 4-byte state), not the one drivers since have (16-byte UUID, cliqueId, a 1-byte state)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_char * 80),
        ("status", ctypes.c_uint),
        ("partitionId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    ]


def test_a_binding_whose_fabric_struct_predates_the_drivers_is_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was: with nvidia-ml-py 12.535 the agent passed R535's struct to a newer driver and read its state
    from the wrong offset (0: NotSupported): a GB200's fabric went unreported, silently (issue 50, found
    by `make nvml-bindings`). Now such a binding cannot read fabric info: FunctionNotFound, said."""
    monkeypatch.setattr(pynvml, "c_nvmlGpuFabricInfo_t", _FabricInfoR535)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.fabric_info()


def test_the_recovery_action_field_id_does_not_depend_on_the_binding() -> None:
    """The field id is NVML's ABI (nvml.h: 230); a binding that predates its constant still asks for it,
    and a driver that predates the field answers NOT_SUPPORTED for it (the fact is then absent)."""
    assert nvml.FI_DEV_GET_GPU_RECOVERY_ACTION == 230
