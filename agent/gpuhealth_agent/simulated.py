"""Simulated NVML: the pynvml functions the agent calls, replaying a scenario.

`SimulatedNvml` satisfies `nvml.Library`: same function names, arguments,
return shapes and pynvml error classes as the real library, so the
collector cannot tell the difference. Scenario time is `clock() - start`,
with the clock injected, and the simulation owns no thread and does work
only when called (the fleet simulator runs a thousand of these in one
process). State advances lazily: each call applies the timeline entries
whose time has come, in order, then answers from the current facts.

What each call answers comes from the fact table (`facts.py`): a function
whose answer is one fact's value is served by `__getattr__`, and struct or
tuple answers (memory, utilisation, remapped rows, field values) have a
method each that assembles the facts' parts, encoded as the driver does.

NVLink (`nvlinks`, `nvlinkLinksDown`, `nvlink*Errors`) and fabric info
(`fabric*`) are answered per link and by struct, as NVML does (links.py reads
them). PCIe AER (`pcieAer*`) and the scenario's InfiniBand ports (`nics:`)
live in sysfs, not NVML: the simulation writes the files the kernel would
into a temporary tree (`sysfs_root`), which the agent's sysfs reader reads
as it reads `/sys` (sysfs.py), so one code path serves both.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from gpuhealth_agent import facts, nvml, scenario, sysfs

_BUS_IDS: Final = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_XID_GPU_LOST: Final = 79

GROUP_BY_FUNCTION: Final[dict[str, str]] = {
    **{
        name: fact.group
        for fact in facts.FACTS
        if fact.type is not facts.Type.RECOVERY  # field values answer NOT_SUPPORTED per field instead
        for name in (fact.function, nvml.OLDER_NAMES.get(fact.function, fact.function))
    },
    **{function: group for group, functions in scenario.EXTRA_GROUPS.items() for function in functions},
}
"""Which `notSupported` name silences which NVML function."""
_PLAIN: Final = frozenset(
    {facts.Type.INT, facts.Type.FLOAT, facts.Type.COUNTER, facts.Type.BOOL, facts.Type.REASONS}
)
_SCALAR_FUNCTIONS: Final[frozenset[str]] = frozenset(
    name
    for fact in facts.FACTS
    if fact.part is None and fact.type in _PLAIN
    for name in (fact.function, nvml.OLDER_NAMES.get(fact.function, fact.function))
)
"""Functions whose answer is one fact's value as is: served by `__getattr__` straight from the fact table."""


@dataclasses.dataclass(frozen=True)
class Handle:
    """A device handle; `gpu` is the GPU's index in the scenario (stable even when others vanish)."""

    gpu: int


@dataclasses.dataclass(frozen=True)
class PciInfo:
    busId: str


@dataclasses.dataclass(frozen=True)
class Utilization:
    gpu: int
    memory: int


@dataclasses.dataclass(frozen=True)
class Memory:
    total: int
    used: int
    free: int
    version: int = 0
    """nvmlMemory_v2_t's version tag when asked by version; 0: nvmlMemory_t (which has neither field)."""
    reserved: int = 0


@dataclasses.dataclass(frozen=True)
class Value:
    ullVal: int


@dataclasses.dataclass(frozen=True)
class FieldValue:
    fieldId: int
    nvmlReturn: int
    value: Value
    scopeId: int = 0


_NVLINK_FIELDS: Final[dict[int | None, str]] = {
    nvml.FI_DEV_NVLINK_ERROR_DL_CRC: "nvlinkCrcErrors",
    nvml.FI_DEV_NVLINK_ERROR_DL_REPLAY: "nvlinkReplayErrors",
    nvml.FI_DEV_NVLINK_ERROR_DL_RECOVERY: "nvlinkRecoveryErrors",
}
"""Per-link NVLink error-counter field ids (scopeId = link) and the scenario counter each reads."""
_NVLINK_COUNTERS: Final[dict[int, str]] = {
    nvml.NVLINK_ERROR_DL_CRC_FLIT: "nvlinkCrcErrors",
    nvml.NVLINK_ERROR_DL_REPLAY: "nvlinkReplayErrors",
    nvml.NVLINK_ERROR_DL_RECOVERY: "nvlinkRecoveryErrors",
}
"""nvmlDeviceGetNvLinkErrorCounter counters and the scenario counter each reads."""
_NOT_SUPPORTED: Final = nvml.return_code("NotSupported")
_INVALID_ARGUMENT: Final = nvml.return_code("InvalidArgument")
_FABRIC_CODES: Final[dict[str, int]] = {name: code for code, name in nvml.FABRIC_STATES.items()}
_AER: Final[tuple[tuple[str, str, str], ...]] = (
    ("pcieAerFatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
    ("pcieAerNonFatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("pcieAerCorrectable", "aer_dev_correctable", "TOTAL_ERR_COR"),
)
"""Scenario AER counter, its sysfs file and the file's total line (the kernel's names)."""


@dataclasses.dataclass(frozen=True)
class EventData:
    device: Handle
    eventType: int
    eventData: int
    timeSeconds: float  # scenario time, for tests; pynvml's struct has no such field


@dataclasses.dataclass
class EventSet:
    registered: dict[int, int] = dataclasses.field(default_factory=dict)
    """Event-type mask by GPU."""
    cursor: int = 0
    """Index of the next event of the simulation this set has not looked at."""
    backlog: list[EventData] = dataclasses.field(default_factory=list)
    """Events at scenario time 0 that happened before this set existed, still to deliver (first set only)."""
    freed: bool = False


@dataclasses.dataclass(frozen=True)
class GpuState:
    """One GPU of the replay, for the simulated NVML library's driver (simnvml.py)."""

    facts: dict[str, Any]
    not_supported: frozenset[str]
    failing: dict[str, str]
    """Functions failing now, with their pynvml error name."""
    lost: bool
    expiring: bool
    """A failure runs out by time: the state changes without the timeline moving."""


@dataclasses.dataclass
class _Gpu:
    facts: dict[str, Any]
    not_supported: set[str]
    failures: dict[str, tuple[str, float | None]] = dataclasses.field(default_factory=dict)
    lost: bool = False


class SimulatedNvml:
    """A scripted node's GPUs behind the pynvml function names (see module docstring)."""

    def __init__(
        self,
        plan: scenario.Scenario,
        *,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        identity_seed: str = "gpu-health-sim",
    ) -> None:
        self.plan = plan
        self.clock = clock
        self.start = clock() if start is None else start
        self.sleep = sleep
        self.identity_seed = identity_seed
        self.calls = 0
        """NVML function calls served, for the overhead benchmark."""
        self.initialized = False
        self._events: list[EventData] = []
        self._first_set_created = False
        self._resets: list[tuple[float, frozenset[int]]] = []
        """GPU resets done from outside (`reset_gpus`) at scenario times, replayed with the timeline."""
        self.sysfs_root: Path | None = None
        """The simulation's sysfs tree (PCIe AER, InfiniBand ports); None when the scenario has neither."""
        if plan.uses_sysfs:
            self.sysfs_root = Path(tempfile.mkdtemp(prefix="gpu-health-sim-sysfs-"))
            weakref.finalize(self, shutil.rmtree, self.sysfs_root, True)
        self._reset()

    # --- timeline replay -----------------------------------------------------------------------------

    def _reset(self) -> None:
        self._gpus = [
            _Gpu(facts=dict(self.plan.defaults), not_supported=set(self.plan.not_supported))
            for _ in range(self.plan.gpus)
        ]
        self._next_entry = 0
        self._next_reset = 0
        self._replays = getattr(self, "_replays", -1) + 1
        self._applied_until = float("-inf")
        self._events.clear()
        self._nics = {(n.name, n.port): dict(n.facts) for n in self.plan.nics}
        self._write_sysfs()

    def now_seconds(self) -> float:
        """Scenario time: seconds since start by the injected clock."""
        return self.clock() - self.start

    # --- the state, for the simulated NVML library (simnvml.py drives it from this replay) -------------

    def advance(self) -> float:
        """Apply the timeline up to now (as every NVML call does); returns the scenario time."""
        return self._advance()

    def progress(self) -> tuple[int, int, int]:
        """How far the replay is (entries applied, resets applied, replays from scratch): equal
        progress, equal GPU state, apart from scripted failures that run out by time (`gpu_state`)."""
        return self._next_entry, self._next_reset, self._replays

    def gpu_state(self, gpu: int, now: float) -> GpuState:
        """GPU `gpu` as the replay has it at scenario time `now`."""
        state = self._gpus[gpu]
        failing = {
            function: error
            for function, (error, until) in state.failures.items()
            if until is None or now < until
        }
        expiring = any(until is not None and now < until for _, until in state.failures.values())
        return GpuState(state.facts, frozenset(state.not_supported), failing, state.lost, expiring)

    def next_change_in(self) -> float:
        """Scenario seconds until the next timeline entry applies (inf: none left)."""
        now = self.now_seconds()
        for entry in self.plan.timeline[self._next_entry :]:
            if entry.after_seconds > now:
                return entry.after_seconds - now
        return float("inf")

    def events(self) -> Sequence[EventData]:
        """Every event of the replay so far, in order."""
        return self._events

    def serial(self, gpu: int) -> str:
        """The board serial GPU `gpu` reports."""
        return str(
            self._gpus[gpu].facts.get(
                "serial", f"165{uuid.uuid5(uuid.NAMESPACE_URL, self.identity_seed).int % 10**9:09d}{gpu}"
            )
        )

    def _advance(self) -> float:
        now = self.now_seconds()
        if now < self._applied_until:  # the clock went backwards (a test rewound it): replay from scratch
            self._reset()
        timeline, resets = self.plan.timeline, self._resets
        applied = False
        while True:
            entry = timeline[self._next_entry] if self._next_entry < len(timeline) else None
            reset = resets[self._next_reset] if self._next_reset < len(resets) else None
            if reset is not None and reset[0] <= now and (entry is None or reset[0] < entry.after_seconds):
                for index in reset[1]:
                    self._reset_gpu(self._gpus[index])
                self._next_reset += 1
            elif entry is not None and entry.after_seconds <= now:
                self._apply(entry)
                self._next_entry += 1
            else:
                break
            applied = True
        self._applied_until = now
        if applied:
            self._write_sysfs()
        return now

    def _apply(self, entry: scenario.Entry) -> None:
        if entry.nic is not None:
            for (name, port), values in self._nics.items():
                if name == entry.nic and entry.port in (None, port):
                    values.update(entry.set)
            return
        gpu = self._gpus[entry.gpu]
        if entry.reset:
            gpu.facts.update(scenario.AFTER_RESET)
            gpu.lost = False
        before = gpu.facts.get("eccUncorrectedVolatile", 0)
        gpu.facts.update(entry.set)
        if gpu.facts.get("eccUncorrectedVolatile", 0) > before:
            self._event(entry, nvml.EVENT_TYPE_DOUBLE_BIT_ECC_ERROR, 0)
        if entry.xid is not None:
            self._event(entry, nvml.EVENT_TYPE_XID_CRITICAL_ERROR, entry.xid)
            if entry.xid == _XID_GPU_LOST:
                gpu.lost = True
        gpu.not_supported |= entry.not_supported
        if entry.fail is not None:
            until = None if entry.fail.for_seconds is None else entry.after_seconds + entry.fail.for_seconds
            gpu.failures[entry.fail.function] = (entry.fail.error, until)

    @staticmethod
    def _reset_gpu(gpu: _Gpu) -> None:
        """What a GPU reset does: volatile ECC counts, pending retirements/remaps and the recovery action
        reset (scenario.AFTER_RESET), a lost GPU back, scripted NVML failures over. Aggregate counters,
        retired pages and remapped rows stay, as on a real GPU."""
        gpu.facts.update(scenario.AFTER_RESET)
        gpu.lost = False
        gpu.failures.clear()

    def reset_gpus(self, gpus: Sequence[int] | None = None) -> None:
        """Reset GPUs now (by scenario index; None: all), as `nvidia-smi --gpu-reset` or a reboot would.

        The fleet simulator's repair executor calls this for a repair Job's effect. A rewound clock
        replays it at the scenario time it happened. NVML has no reset event: the agent infers the reset
        from its next reading (history.looks_reset).
        """
        now = self._advance()
        chosen = frozenset(range(len(self._gpus)) if gpus is None else gpus)
        unknown = sorted(i for i in chosen if not 0 <= i < len(self._gpus))
        if unknown:
            raise ValueError(f"no simulated GPU {unknown[0]} (the node has {len(self._gpus)})")
        self._resets.append((now, chosen))
        self._advance()

    def _event(self, entry: scenario.Entry, event_type: int, data: int) -> None:
        self._events.append(EventData(Handle(entry.gpu), event_type, data, entry.after_seconds))

    def _device(self, handle: Handle, function: str) -> dict[str, Any]:
        """The facts of a GPU, or the error this call must raise."""
        self.calls += 1
        now = self._advance()
        gpu = self._gpus[handle.gpu]
        if gpu.lost:
            raise nvml.error("GpuIsLost")
        failure = gpu.failures.get(function)
        if failure is not None:
            error, until = failure
            if until is None or now < until:
                raise nvml.error(error)
        optional = GROUP_BY_FUNCTION.get(function)
        if optional is not None and optional in gpu.not_supported:
            raise nvml.error("NotSupported")
        return gpu.facts

    def _visible(self) -> list[int]:
        """GPU indexes the driver enumerates: all (a lost GPU stays enumerated, as with the driver),
        but no more than the container runtime shows the agent (`visibleGpus`)."""
        return list(range(min(len(self._gpus), self.plan.visible_gpus)))

    # --- system --------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls += 1
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls += 1
        return self.plan.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self.calls += 1
        self._advance()
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self.calls += 1
        self._advance()
        visible = self._visible()
        if not 0 <= index < len(visible):
            raise nvml.error("InvalidArgument")
        return Handle(visible[index])

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self.calls += 1
        self._advance()
        visible = self._visible()
        if handle.gpu not in visible:
            raise nvml.error("GpuIsLost")
        return visible.index(handle.gpu)

    # --- identity --------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._device(handle, "nvmlDeviceGetName")
        return self.plan.model

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._device(handle, "nvmlDeviceGetUUID")
        return self.uuid(handle.gpu)

    def uuid(self, gpu: int) -> str:
        """The UUID of scenario GPU `gpu`: stable per identity seed (node), distinct across nodes."""
        return gpu_uuid(self.identity_seed, gpu)

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        self._device(handle, "nvmlDeviceGetSerial")
        return self.serial(handle.gpu)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        self._device(handle, "nvmlDeviceGetPciInfo")
        return PciInfo(busId=bus_id(handle.gpu))

    # --- sysfs (AER, InfiniBand): the files the kernel would show -------------------------------------

    def _write_sysfs(self) -> None:
        """Write the current AER totals and port facts where sysfs.py reads them (only what changed)."""
        root = self.sysfs_root
        if root is None:
            return
        for index, gpu in enumerate(self._gpus):
            name = sysfs.sysfs_bus_id(bus_id(index))
            assert name is not None
            device = root.joinpath(*sysfs.PCI_DEVICES, name)
            for key, filename, total in _AER:
                _write(device / filename, f"Undefined 0\n{total} {gpu.facts.get(key, 0)}\n")
        for (name, port), values in self._nics.items():
            port_dir = root.joinpath(*sysfs.INFINIBAND, name, "ports", str(port))
            _write(port_dir / "state", f"{scenario.NIC_STATES[values['state']]}: {values['state']}\n")
            phys = values["physState"]
            _write(port_dir / "phys_state", f"{scenario.NIC_PHYS_STATES[phys]}: {phys}\n")
            _write(port_dir / "rate", f"{values['rateGbps']:g} Gb/sec (4X)\n")
            for key, filename in sysfs.NIC_COUNTERS:
                _write(port_dir / "counters" / filename, f"{values[key]}\n")

    # --- NVLink and fabric ------------------------------------------------------------------------------

    def _link_state(self, current: dict[str, Any], link: int) -> bool:
        """Whether `link` is up; raises what NVML raises for a link the board does not have."""
        links = int(current.get("nvlinks", 0))
        if links == 0:
            raise nvml.error("NotSupported")
        if not 0 <= link < links:
            raise nvml.error("InvalidArgument")
        return link < links - min(links, int(current.get("nvlinkLinksDown", 0)))

    def _link_counter(self, current: dict[str, Any], link: int, key: str) -> int:
        """A link's share of the GPU's counter: all of it on the first link that is up."""
        up = self._link_state(current, link)
        first_up = 0 if self._link_state(current, 0) else None
        return int(current.get(key, 0)) if up and link == first_up else 0

    def nvmlDeviceGetNvLinkState(self, device: Handle, link: int) -> int:
        current = self._device(device, "nvmlDeviceGetNvLinkState")
        return nvml.FEATURE_ENABLED if self._link_state(current, link) else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Handle, link: int, counter: int) -> int:
        current = self._device(device, "nvmlDeviceGetNvLinkErrorCounter")
        key = _NVLINK_COUNTERS.get(counter)
        if key is None:
            self._link_state(current, link)
            return 0  # a counter the agent does not read (CRC data, ECC)
        return self._link_counter(current, link, key)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Handle, gpuFabricInfo: Any) -> int:
        """The versioned call: fills the nvmlGpuFabricInfo_v2_t/_v3_t passed, as the driver does."""
        return self._fabric(device, gpuFabricInfo, "nvmlDeviceGetGpuFabricInfoV")

    def nvmlDeviceGetGpuFabricInfo(self, device: Handle, gpuFabricInfo: Any) -> int:
        """Fills the nvmlGpuFabricInfo_t passed (by `ctypes.byref` or as is), as the driver does."""
        return self._fabric(device, gpuFabricInfo, "nvmlDeviceGetGpuFabricInfo")

    def _fabric(self, device: Handle, gpuFabricInfo: Any, function: str) -> int:
        current = self._device(device, function)
        state = current.get("fabricState", "NotSupported")
        if state == "NotSupported":
            raise nvml.error("NotSupported")
        info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)
        info.state = _FABRIC_CODES[state]
        info.status = nvml.return_code(current.get("fabricStatus", "Success"))
        info.cliqueId = int(current.get("fabricCliqueId", 0))
        return nvml.SUCCESS

    # --- facts ---------------------------------------------------------------------------------------

    def _answer(self, function: str, handle: Handle, args: tuple[Any, ...]) -> list[Any]:
        """What the driver returns for each fact one call answers (facts.answered_by), in table order."""
        return list(self._parts(function, handle, args).values())

    def _parts(self, function: str, handle: Handle, args: tuple[Any, ...]) -> dict[Any, Any]:
        """The same, by the part of the result (struct attribute, tuple position) each fact is."""
        current = self._device(handle, function)
        return {f.part: facts.encode(f, current[f.key]) for f in facts.answered_by(function, args)}

    def __getattr__(self, name: str) -> Any:
        """The NVML functions that return one fact's value (temperature, power, clocks, ECC counts, ...)."""
        if name not in _SCALAR_FUNCTIONS:
            raise AttributeError(name)

        def scalar(handle: Handle, *args: Any) -> Any:
            values = self._answer(name, handle, args)
            if not values:  # arguments no fact is read with (another sensor, counter type, ...)
                raise nvml.error("InvalidArgument")
            return values[0]

        return scalar

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:
        parts = self._parts("nvmlDeviceGetUtilizationRates", handle, ())
        return Utilization(gpu=parts["gpu"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Memory:
        """nvmlMemory_t, or nvmlMemory_v2_t when asked by version (no memory is reserved here)."""
        parts = self._parts("nvmlDeviceGetMemoryInfo", handle, ())
        total, used = parts["total"], parts["used"]
        return Memory(total=total, used=used, free=max(total - used, 0), version=version or 0, reserved=0)

    def nvmlDeviceGetRetiredPages(self, device: Handle, sourceFilter: int) -> list[int]:
        pages = self._answer("nvmlDeviceGetRetiredPages", device, (sourceFilter,))
        return list(pages[0]) if pages else []

    def nvmlDeviceGetRemappedRows(self, device: Handle) -> tuple[int, int, int, int]:
        parts = self._parts("nvmlDeviceGetRemappedRows", device, ())
        return parts[0], parts[1], parts[2], parts[3]  # correctable, uncorrectable, pending, failure

    def nvmlDeviceGetFieldValues(
        self, handle: Handle, fieldIds: Sequence[int | tuple[int, int]]
    ) -> Sequence[FieldValue]:
        """Each field's value or its own error, as the driver answers field values (ids or (id, scope))."""
        current = self._device(handle, "nvmlDeviceGetFieldValues")
        not_supported = self._gpus[handle.gpu].not_supported
        values = []
        for requested in fieldIds:
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            if field_id == nvml.FI_DEV_NVLINK_GET_STATE or field_id in _NVLINK_FIELDS:
                values.append(self._nvlink_field(current, "nvlink" in not_supported, field_id, scope))
                continue
            found = [
                f
                for f in facts.answered_by("nvmlDeviceGetFieldValues", (field_id,))
                if f.group not in not_supported
            ]
            if found:
                code = facts.encode(found[0], current[found[0].key])
                values.append(FieldValue(field_id, nvml.SUCCESS, Value(code)))
            else:
                values.append(FieldValue(field_id, nvml.ERROR_NOT_SUPPORTED, Value(0)))
        return values

    def _nvlink_field(
        self, current: dict[str, Any], unsupported: bool, field_id: int, link: int
    ) -> FieldValue:
        """One link's state (NVML_NVLINK_STATE_*) or error counter, or the error the driver gives
        (the same answers as _link_state and _link_counter, without raising on the common path)."""
        links = int(current.get("nvlinks", 0))
        if unsupported or links == 0:
            return FieldValue(field_id, _NOT_SUPPORTED, Value(0), link)
        if not 0 <= link < links:
            return FieldValue(field_id, _INVALID_ARGUMENT, Value(0), link)
        up = link < links - min(links, int(current.get("nvlinkLinksDown", 0)))
        if field_id == nvml.FI_DEV_NVLINK_GET_STATE:
            value = 1 if up else 0  # NVML_NVLINK_STATE_ACTIVE / _INACTIVE
        else:
            value = int(current.get(_NVLINK_FIELDS[field_id], 0)) if up and link == 0 else 0
        return FieldValue(field_id, nvml.SUCCESS, Value(value), link)

    # --- events --------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> EventSet:
        self.calls += 1
        self._advance()
        # Like the driver, a new set sees only events that happen after it exists. Entries `after: 0s`
        # are the exception: they happen as the agent starts, so the agent's first set gets them;
        # otherwise a scenario's XID at 0s could never be seen.
        backlog = [] if self._first_set_created else [e for e in self._events if e.timeSeconds <= 0]
        self._first_set_created = True
        return EventSet(cursor=len(self._events), backlog=backlog)

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: EventSet) -> None:
        self._device(handle, "nvmlDeviceRegisterEvents")
        eventSet.registered[handle.gpu] = eventSet.registered.get(handle.gpu, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: EventSet, timeoutms: int) -> EventData:
        """Next registered event, waiting up to `timeoutms` by the injected sleep; else NVMLError_Timeout."""
        self.calls += 1
        deadline = self._advance() + max(timeoutms, 0) / 1000
        while True:
            if eventSet.freed:
                raise nvml.error("Uninitialized")
            found = self._next_event(eventSet)
            if found is not None:
                return found
            now = self.now_seconds()
            if now >= deadline:
                raise nvml.error("Timeout")
            self.sleep(min(deadline, self._next_event_time(now)) - now)
            self._advance()

    def _next_event(self, eventSet: EventSet) -> EventData | None:
        while eventSet.backlog:
            event = eventSet.backlog.pop(0)
            if eventSet.registered.get(event.device.gpu, 0) & event.eventType:
                return event
        while eventSet.cursor < len(self._events):
            event = self._events[eventSet.cursor]
            eventSet.cursor += 1
            if eventSet.registered.get(event.device.gpu, 0) & event.eventType:
                return event
        return None

    def _next_event_time(self, now: float) -> float:
        for entry in self.plan.timeline[self._next_entry :]:
            if entry.after_seconds > now and (entry.xid is not None or "eccUncorrectedVolatile" in entry.set):
                return entry.after_seconds
        return float("inf")

    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        self.calls += 1
        eventSet.freed = True


def bus_id(gpu: int) -> str:
    """NVML's PCI bus id of simulated GPU `gpu` (`00000000:18:00.0`)."""
    bus = _BUS_IDS[gpu % len(_BUS_IDS)]
    domain = gpu // len(_BUS_IDS)
    return f"{domain:08X}:{bus}:00.0"


def _write(path: Path, text: str) -> None:
    """Write a sysfs-like file if its text changed (the agent may be reading the tree meanwhile)."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(text)
    scratch.replace(path)


def sysfs_root(lib: object) -> Path | None:
    """The sysfs tree of a simulated library (None for the real one, or a scenario without one)."""
    return lib.sysfs_root if isinstance(lib, SimulatedNvml) else None


def gpu_uuid(identity_seed: str, gpu: int) -> str:
    """The UUID simulated GPU `gpu` reports under `identity_seed` (the simulator uses the node name).

    Public so the simulator's fake DRA driver publishes the very UUIDs the agent reports.
    """
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{identity_seed}/{gpu}')}"


def library(plan: scenario.Scenario, **kwargs: Any) -> nvml.Library:
    """A SimulatedNvml typed as the Library protocol the collector expects."""
    sim: nvml.Library = SimulatedNvml(plan, **kwargs)
    return sim
