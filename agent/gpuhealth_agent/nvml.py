"""The pynvml surface the agent uses, and the only module that imports pynvml.

The collector talks to a `Library`: a Protocol listing exactly the pynvml
functions it calls, with pynvml's names and signatures. The real backend is
the pynvml module itself (behind a thin shim for functions older bindings
lack); the simulated backend (`simulated.py`) implements the same functions
and raises pynvml's own error classes, obtained here. So one collector code
path serves a real H100 and a scripted scenario.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Final, Protocol

import pynvml

from gpuhealth_api import vocabulary

# --- errors (pynvml's own classes, re-exported) -----------------------------------------------------------

NVMLError: Final[type[Exception]] = pynvml.NVMLError
NotSupported: Final[type[Exception]] = pynvml.NVMLError_NotSupported
FunctionNotFound: Final[type[Exception]] = pynvml.NVMLError_FunctionNotFound
NoPermission: Final[type[Exception]] = pynvml.NVMLError_NoPermission
GpuIsLost: Final[type[Exception]] = pynvml.NVMLError_GpuIsLost
Timeout: Final[type[Exception]] = pynvml.NVMLError_Timeout
InvalidArgument: Final[type[Exception]] = pynvml.NVMLError_InvalidArgument
Unknown: Final[type[Exception]] = pynvml.NVMLError_Unknown
ArgumentVersionMismatch: Final[type[Exception]] = getattr(
    pynvml, "NVMLError_ArgumentVersionMismatch", pynvml.NVMLError_FunctionNotFound
)

UNSUPPORTED: Final[tuple[type[Exception], ...]] = (NotSupported, FunctionNotFound, NoPermission)
"""Errors meaning "this GPU or driver cannot answer that": the field is absent, the sample goes on."""

_ERROR_PREFIX: Final = "NVMLError_"
ERROR_NAMES: Final[frozenset[str]] = frozenset(
    name.removeprefix(_ERROR_PREFIX) for name in dir(pynvml) if name.startswith(_ERROR_PREFIX)
)
"""Short names of pynvml's error classes (`Unknown`, `GpuIsLost`, ...), as scenario files spell them."""


def error(name: str) -> Exception:
    """A pynvml error instance by short name (`"GpuIsLost"` → NVMLError_GpuIsLost())."""
    cls: type[Exception] = getattr(pynvml, _ERROR_PREFIX + name)
    return cls()


def error_name(exc: BaseException) -> str:
    """Short name of a pynvml error, for metrics labels and logs."""
    return type(exc).__name__.removeprefix(_ERROR_PREFIX)


def return_name(code: int) -> str:
    """An nvmlReturn_t as its short name: `Success`, or the error class's (`NotReady`, `Unknown`, ...)."""
    if code == SUCCESS:
        return "Success"
    return error_name(NVMLError(code))


def return_code(name: str) -> int:
    """The nvmlReturn_t of a short name (the inverse of `return_name`, for the simulated backend)."""
    if name == "Success":
        return SUCCESS
    code: int = getattr(error(name), "value")  # noqa: B009 - pynvml sets it in __new__, untyped
    return code


# --- constants -------------------------------------------------------------------------------------------

TEMPERATURE_GPU: Final[int] = pynvml.NVML_TEMPERATURE_GPU
TEMPERATURE_THRESHOLD_SLOWDOWN: Final[int] = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
CLOCK_SM: Final[int] = pynvml.NVML_CLOCK_SM
MEMORY_ERROR_TYPE_CORRECTED: Final[int] = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
MEMORY_ERROR_TYPE_UNCORRECTED: Final[int] = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC: Final[int] = pynvml.NVML_VOLATILE_ECC
AGGREGATE_ECC: Final[int] = pynvml.NVML_AGGREGATE_ECC
PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: Final[int] = (
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
)
EVENT_TYPE_XID_CRITICAL_ERROR: Final[int] = pynvml.nvmlEventTypeXidCriticalError
EVENT_TYPE_DOUBLE_BIT_ECC_ERROR: Final[int] = pynvml.nvmlEventTypeDoubleBitEccError
SUCCESS: Final[int] = pynvml.NVML_SUCCESS
ERROR_NOT_SUPPORTED: Final[int] = pynvml.NVML_ERROR_NOT_SUPPORTED

NVLINK_MAX_LINKS: Final[int] = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
NVLINK_ERROR_DL_REPLAY: Final[int] = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
NVLINK_ERROR_DL_RECOVERY: Final[int] = pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
NVLINK_ERROR_DL_CRC_FLIT: Final[int] = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
FI_DEV_NVLINK_GET_STATE: Final[int | None] = getattr(pynvml, "NVML_FI_DEV_NVLINK_GET_STATE", None)
"""Field id of one link's state (scopeId = link); None with bindings that predate it."""
FI_DEV_NVLINK_ERROR_DL_REPLAY: Final[int | None] = getattr(pynvml, "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", None)
FI_DEV_NVLINK_ERROR_DL_RECOVERY: Final[int | None] = getattr(
    pynvml, "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", None
)
FI_DEV_NVLINK_ERROR_DL_CRC: Final[int | None] = getattr(pynvml, "NVML_FI_DEV_NVLINK_ERROR_DL_CRC", None)
NVLINK_STATES_UP: Final[frozenset[int]] = frozenset(
    {getattr(pynvml, "NVML_NVLINK_STATE_ACTIVE", 1), getattr(pynvml, "NVML_NVLINK_STATE_SLEEP", 2)}
)
"""NVML_FI_DEV_NVLINK_GET_STATE values of a link that is up (a sleeping link is up, in low power)."""
FEATURE_ENABLED: Final[int] = pynvml.NVML_FEATURE_ENABLED
"""nvmlDeviceGetNvLinkState's answer for an active link."""
FABRIC_STATES: Final[dict[int, str]] = {
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED", 0): "NotSupported",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_NOT_STARTED", 1): "NotStarted",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_IN_PROGRESS", 2): "InProgress",
    getattr(pynvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3): "Completed",
}
"""nvmlGpuFabricState_t values by their contract name (`gpus[].fabric.state`)."""
FI_DEV_GET_GPU_RECOVERY_ACTION: Final[int | None] = getattr(
    pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230
)
"""Field id of the driver's recommended recovery action (nvml.h's 230: the id is NVML's ABI, so a
binding that predates the constant still asks; a driver that predates the field answers NOT_SUPPORTED)."""

RECOVERY_ACTIONS: Final[dict[int, str]] = {
    getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{action.name}", code): action.value
    for code, action in enumerate(vocabulary.RecoveryAction)
}
"""NVML_GPU_RECOVERY_ACTION_* values (pynvml's, where the binding defines them) by their contract name.

gpuhealth_api.vocabulary.RecoveryAction lists NVML's actions in NVML's order, so a binding that
predates one still decodes it; a code neither knows is reported as `Unknown<code>` (facts.decode)."""

MEMORY_V2: Final[int | None] = getattr(pynvml, "nvmlMemory_v2", None)
"""Version tag of nvmlMemory_v2_t (`used` without the driver's reserved memory); None with older bindings."""

OLDER_NAMES: Final[dict[str, str]] = {
    "nvmlDeviceGetTemperatureV": "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksThrottleReasons",
}
"""The same call under the name drivers had before (same arguments), tried on FunctionNotFound."""
NEWER_NAMES: Final[dict[str, str]] = {old: new for new, old in OLDER_NAMES.items()}


# --- the surface the collector calls ---------------------------------------------------------------------


class PciInfo(Protocol):
    @property
    def busId(self) -> bytes | str: ...


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...


class Memory(Protocol):
    @property
    def total(self) -> int: ...

    @property
    def used(self) -> int: ...


class Value(Protocol):
    @property
    def ullVal(self) -> int: ...


class FieldValue(Protocol):
    @property
    def nvmlReturn(self) -> int: ...

    @property
    def value(self) -> Value: ...


class EventData(Protocol):
    @property
    def device(self) -> Any: ...

    @property
    def eventType(self) -> int: ...

    @property
    def eventData(self) -> int: ...


class FabricInfo(Protocol):
    """nvmlGpuFabricInfo_t: the collector passes one by reference and reads these fields back."""

    @property
    def status(self) -> int: ...

    @property
    def cliqueId(self) -> int: ...

    @property
    def state(self) -> int: ...


_FABRIC_INFO_OFFSETS: Final[dict[str, int]] = {"status": 16, "cliqueId": 20, "state": 24}
"""Where the driver writes nvmlGpuFabricInfo_t's fields (nvml.h since cliques: a 16-byte UUID first).
The state is an unsigned char there; pynvml 13 reads it as a c_uint at the same offset, which reads
the same (ctypes zero-fills the struct, and the rest of that word is padding)."""


def fabric_info() -> Any:
    """An empty nvmlGpuFabricInfo_t for nvmlDeviceGetGpuFabricInfo to fill (pass `ctypes.byref` of it).

    Raises FunctionNotFound with bindings that predate fabric info (as the call itself would), and with
    bindings whose struct is R535's layout (nvidia-ml-py 12.535: an 80-byte UUID, `partitionId`, a 4-byte
    state): a newer driver fills its own layout, so every field would be read from the wrong offset
    (the state read as 0, NotSupported: a GB200's fabric silently unreported). Not read is said as such.
    """
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None:
        raise error("FunctionNotFound")
    declared = {name: getattr(struct, name).offset for name, *_ in struct._fields_}
    if any(declared.get(name) != offset for name, offset in _FABRIC_INFO_OFFSETS.items()):
        raise error("FunctionNotFound")
    return struct()


def fabric_info_v() -> Any:
    """An empty, version-tagged nvmlGpuFabricInfo_v3_t (or _v2_t) for nvmlDeviceGetGpuFabricInfoV;
    None where the binding declares neither (nvidia-ml-py before 13)."""
    for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
        struct = getattr(pynvml, name, None)
        if struct is not None and hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV"):
            return struct()  # its __init__ sets the version tag
    return None


class Library(Protocol):
    """The pynvml functions the agent calls (same names and signatures as pynvml).

    The collector calls the fact table's functions by name (`call`), so a new
    fact needs no line here; they are listed for readers and type checks.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetSerial(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo: ...
    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Memory: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetFieldValues(
        self, handle: Any, fieldIds: Sequence[int | tuple[int, int]]
    ) -> Sequence[FieldValue]: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int: ...
    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int: ...
    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> EventData: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...


class _Real:
    """pynvml itself, with stand-ins for functions that older bindings do not define.

    A driver too old for a function raises FunctionNotFound at call time, which
    the collector already treats as "not supported"; a *binding* too old for it
    has no attribute at all, so we raise the same error here.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(pynvml, name)
        except AttributeError:

            def missing(*_: Any) -> Any:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing


def real() -> Library:
    """The real NVML library (call `nvmlInit()` on it before use)."""
    lib: Library = _Real()
    return lib


class Counting:
    """Wraps a Library and counts the calls made into it (the agent's NVML traffic, for metrics)."""

    def __init__(self, lib: Library) -> None:
        self.wrapped = lib
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.wrapped, name)
        if not callable(target):
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return target(*args, **kwargs)

        self.__dict__[name] = counted  # later lookups skip __getattr__
        return counted


def counting(lib: Library) -> tuple[Library, Counting]:
    """The same library, counting calls: use the first as the Library, read `.calls` on the second."""
    counter = Counting(lib)
    typed: Library = counter
    return typed, counter


def call(lib: Library, function: str, handle: Any, *args: Any) -> Any:
    """Call a per-device NVML function by name, the way the driver at hand can answer it.

    Falls back to the older name of a renamed function, asks for v2 memory
    info where the driver has it, and reads one field value (`args` is the
    field id) as a plain integer, raising the field's own error.
    """
    if function == "nvmlDeviceGetFieldValues":
        (field_id,) = args
        if field_id is None:  # bindings that predate the field
            raise error("FunctionNotFound")
        (value,) = lib.nvmlDeviceGetFieldValues(handle, [field_id])
        if value.nvmlReturn != SUCCESS:
            raise NVMLError(value.nvmlReturn)  # pynvml maps the code to its class
        return int(value.value.ullVal)
    if function == "nvmlDeviceGetMemoryInfo" and MEMORY_V2 is not None:
        try:
            return lib.nvmlDeviceGetMemoryInfo(handle, version=MEMORY_V2)
        except (FunctionNotFound, ArgumentVersionMismatch):  # a driver before nvmlDeviceGetMemoryInfo_v2
            return lib.nvmlDeviceGetMemoryInfo(handle)
    try:
        return getattr(lib, function)(handle, *args)
    except FunctionNotFound:
        older = OLDER_NAMES.get(function)
        if older is None:
            raise
        return getattr(lib, older)(handle, *args)


def same_device(a: Any, b: Any) -> bool:
    """Whether two device handles name the same GPU.

    pynvml handles are ctypes pointers, which compare by object identity, not
    by address; an event's handle is a new object for the same device.
    """
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    return bool(a == b)


def text(value: bytes | str) -> str:
    """pynvml returns char arrays as bytes in some structs and str elsewhere."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
