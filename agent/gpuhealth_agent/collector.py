"""One sample of every GPU on the node, as `status.gpus[]` facts.

The collector talks only to `nvml.Library`, so the same code reads real GPUs
and simulated ones. Each NVML query stands alone: a query the GPU does not
support leaves its field absent, a transient error keeps the field's last
value (and is counted), `GPU_IS_LOST` marks that GPU lost, and nothing fails
the sample as a whole.

Queries come in three tiers to keep NVML traffic low (the agent must stay
under 10 calls per GPU per second at a 1 s interval): *static* facts
(identity, thresholds, maximums) are read when the GPU set changes; *fast*
facts (temperature, power, clocks, throttle reasons, uncorrectable ECC,
recovery action) every sample; *slow* counters (other ECC counters, retired
pages, remapped rows, PCIe) at most every `slow_period_seconds`, at once
after an XID or double-bit ECC event, and every sample on a GPU with a pending
page retirement or row remap (`awaits_reset`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from gpuhealth_agent import changes, nvml, timefmt, xids
from gpuhealth_api import faults, status

log = logging.getLogger(__name__)

Partial = dict[str, Any]
"""A piece of a GPUStatus, possibly nested ({"ecc": {"uncorrectedVolatile": 1}}), merged into the whole."""


class Tier(enum.Enum):
    STATIC = "static"
    FAST = "fast"
    SLOW = "slow"


@dataclasses.dataclass(frozen=True)
class Query:
    function: str
    """The NVML function, for error counts and logs."""
    tier: Tier
    read: Callable[[nvml.Library, Any], Partial]


def _temperature(lib: nvml.Library, h: Any) -> Partial:
    try:
        value = lib.nvmlDeviceGetTemperatureV(h, nvml.TEMPERATURE_GPU)
    except nvml.FunctionNotFound:  # drivers before the V call
        value = lib.nvmlDeviceGetTemperature(h, nvml.TEMPERATURE_GPU)
    return {"temperatureCelsius": int(value)}


def _clock_event_reasons(lib: nvml.Library, h: Any) -> Partial:
    try:
        mask = lib.nvmlDeviceGetCurrentClocksEventReasons(h)
    except nvml.FunctionNotFound:  # drivers before the rename from "throttle reasons"
        mask = lib.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    return {"clockEventReasons": [name for bit, name in status.CLOCK_EVENT_REASONS.items() if mask & bit]}


def _recovery_action(lib: nvml.Library, h: Any) -> Partial:
    field_id = nvml.FI_DEV_GET_GPU_RECOVERY_ACTION
    if field_id is None:
        raise nvml.error("FunctionNotFound")
    (value,) = lib.nvmlDeviceGetFieldValues(h, [field_id])
    if value.nvmlReturn != nvml.SUCCESS:
        raise nvml.NVMLError(value.nvmlReturn)  # pynvml maps the code to its class
    code = int(value.value.ullVal)
    return {"recoveryAction": nvml.RECOVERY_ACTIONS.get(code, f"Unknown{code}")}


def _ecc(kind: int, counter: int, key: str) -> Callable[[nvml.Library, Any], Partial]:
    def read(lib: nvml.Library, h: Any) -> Partial:
        return {"ecc": {key: int(lib.nvmlDeviceGetTotalEccErrors(h, kind, counter))}}

    return read


def _remapped_rows(lib: nvml.Library, h: Any) -> Partial:
    corr, unc, pending, failure = lib.nvmlDeviceGetRemappedRows(h)
    return {
        "remappedRows": {
            "correctable": int(corr),
            "uncorrectable": int(unc),
            "pending": bool(pending),
            "failure": bool(failure),
        }
    }


def _memory(lib: nvml.Library, h: Any) -> Partial:
    info = lib.nvmlDeviceGetMemoryInfo(h)
    return {"memoryUsedMiB": int(info.used) // 2**20, "memoryTotalMiB": int(info.total) // 2**20}


QUERIES: Final[tuple[Query, ...]] = (
    Query("nvmlDeviceGetSerial", Tier.STATIC, lambda lib, h: {"serial": lib.nvmlDeviceGetSerial(h)}),
    Query(
        "nvmlDeviceGetTemperatureThreshold",
        Tier.STATIC,
        lambda lib, h: {
            "slowdownTemperatureCelsius": int(
                lib.nvmlDeviceGetTemperatureThreshold(h, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
            )
        },
    ),
    Query(
        "nvmlDeviceGetMaxClockInfo",
        Tier.STATIC,
        lambda lib, h: {"maxSmClockMHz": int(lib.nvmlDeviceGetMaxClockInfo(h, nvml.CLOCK_SM))},
    ),
    Query(
        "nvmlDeviceGetMaxPcieLinkGeneration",
        Tier.STATIC,
        lambda lib, h: {"pcie": {"maxGeneration": int(lib.nvmlDeviceGetMaxPcieLinkGeneration(h))}},
    ),
    Query(
        "nvmlDeviceGetMaxPcieLinkWidth",
        Tier.STATIC,
        lambda lib, h: {"pcie": {"maxWidth": int(lib.nvmlDeviceGetMaxPcieLinkWidth(h))}},
    ),
    Query("nvmlDeviceGetTemperatureV", Tier.FAST, _temperature),
    Query(
        "nvmlDeviceGetPowerUsage",
        Tier.FAST,
        lambda lib, h: {"powerWatts": round(lib.nvmlDeviceGetPowerUsage(h) / 1000, 1)},
    ),
    Query(
        "nvmlDeviceGetClockInfo",
        Tier.FAST,
        lambda lib, h: {"smClockMHz": int(lib.nvmlDeviceGetClockInfo(h, nvml.CLOCK_SM))},
    ),
    Query(
        "nvmlDeviceGetUtilizationRates",
        Tier.FAST,
        lambda lib, h: {"utilizationPercent": int(lib.nvmlDeviceGetUtilizationRates(h).gpu)},
    ),
    Query("nvmlDeviceGetCurrentClocksEventReasons", Tier.FAST, _clock_event_reasons),
    Query(
        "nvmlDeviceGetTotalEccErrors",
        Tier.FAST,
        _ecc(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC, "uncorrectedVolatile"),
    ),
    Query("nvmlDeviceGetFieldValues", Tier.FAST, _recovery_action),
    Query(
        "nvmlDeviceGetEnforcedPowerLimit",
        Tier.SLOW,
        lambda lib, h: {"powerLimitWatts": round(lib.nvmlDeviceGetEnforcedPowerLimit(h) / 1000, 1)},
    ),
    Query("nvmlDeviceGetMemoryInfo", Tier.SLOW, _memory),
    Query(
        "nvmlDeviceGetTotalEccErrors",
        Tier.SLOW,
        _ecc(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC, "correctedVolatile"),
    ),
    Query(
        "nvmlDeviceGetTotalEccErrors",
        Tier.SLOW,
        _ecc(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC, "correctedAggregate"),
    ),
    Query(
        "nvmlDeviceGetTotalEccErrors",
        Tier.SLOW,
        _ecc(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC, "uncorrectedAggregate"),
    ),
    Query(
        "nvmlDeviceGetRetiredPages",
        Tier.SLOW,
        lambda lib, h: {
            "retiredPages": {
                "doubleBit": len(
                    lib.nvmlDeviceGetRetiredPages(h, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
                )
            }
        },
    ),
    Query(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        Tier.SLOW,
        lambda lib, h: {"retiredPages": {"pending": bool(lib.nvmlDeviceGetRetiredPagesPendingStatus(h))}},
    ),
    Query("nvmlDeviceGetRemappedRows", Tier.SLOW, _remapped_rows),
    Query(
        "nvmlDeviceGetPcieReplayCounter",
        Tier.SLOW,
        lambda lib, h: {"pcie": {"replayCounter": int(lib.nvmlDeviceGetPcieReplayCounter(h))}},
    ),
    Query(
        "nvmlDeviceGetCurrPcieLinkGeneration",
        Tier.SLOW,
        lambda lib, h: {"pcie": {"generation": int(lib.nvmlDeviceGetCurrPcieLinkGeneration(h))}},
    ),
    Query(
        "nvmlDeviceGetCurrPcieLinkWidth",
        Tier.SLOW,
        lambda lib, h: {"pcie": {"width": int(lib.nvmlDeviceGetCurrPcieLinkWidth(h))}},
    ),
)


def looks_reset(before: status.GPUStatus, after: status.GPUStatus) -> bool:
    """Whether a GPU was reset between two readings (NVML has no reset event, so infer it).

    A reset brings a lost GPU back, zeroes the volatile ECC counts, activates
    pending page retirements and row remaps, and clears the recovery action.
    """
    if after.get("lost", False):
        return False
    if before.get("lost", False):
        return True
    old_ecc, new_ecc = before.get("ecc", {}), after.get("ecc", {})
    if new_ecc.get("correctedVolatile", 0) < old_ecc.get("correctedVolatile", 0) or (
        new_ecc.get("uncorrectedVolatile", 0) < old_ecc.get("uncorrectedVolatile", 0)
    ):
        return True
    if (
        before.get("retiredPages", {}).get("pending")
        and after.get("retiredPages", {}).get("pending") is False
    ):
        return True
    if (
        before.get("remappedRows", {}).get("pending")
        and after.get("remappedRows", {}).get("pending") is False
    ):
        return True
    return before.get("recoveryAction", "None") != "None" and after.get("recoveryAction") == "None"


def awaits_reset(gpu: status.GPUStatus) -> bool:
    """Whether the GPU holds evidence that only a reset clears and only a slow counter shows.

    A pending page retirement or row remap makes the node Unhealthy until the GPU
    is reset; reading the slow tier every sample while it lasts lets the repair
    show within one interval, not up to `slow_period_seconds` later, before the
    operator drains a node that was already mended. It costs NVML calls only on
    such a GPU.
    """
    return bool(gpu.get("retiredPages", {}).get("pending") or gpu.get("remappedRows", {}).get("pending"))


def merge(into: dict[str, Any], part: Partial) -> None:
    """Deep-merge a partial into a status dict (nested dicts merge, other values replace)."""
    for key, value in part.items():
        if isinstance(value, dict):
            merge(into.setdefault(key, {}), value)
        else:
            into[key] = value


@dataclasses.dataclass
class _Identity:
    index: int
    handle: Any
    uuid: str
    model: str | None
    pci_bus_id: str | None


@dataclasses.dataclass
class _Track:
    """What the collector remembers about one GPU (by UUID) between samples."""

    identity: _Identity
    partials: dict[int, Partial] = dataclasses.field(default_factory=dict)
    """Last good result of each query (by position in QUERIES); {} when unsupported."""
    view: dict[str, Any] | None = None
    observed_time: str | None = None
    throttled_since: str | None = None
    lost: bool = False
    last_status: status.GPUStatus | None = None


@dataclasses.dataclass
class Sample:
    time: float
    """Epoch seconds when the sample started."""
    driver_version: str | None
    gpus: list[status.GPUStatus]
    expected_gpus: int
    errors: collections.Counter[tuple[str, str]]
    """NVML errors of this sample by (function, error name); NOT_SUPPORTED excluded."""
    duration_seconds: float
    max_gpus_seen: int = 0
    """The most GPUs that answered at once, here or (restored) in an earlier agent's status."""


class Collector:
    """Reads all GPUs through an nvml.Library; keeps per-GPU memory across samples (see module doc)."""

    def __init__(
        self,
        lib: nvml.Library,
        *,
        expected_gpus: int | None = None,
        slow_period_seconds: float = 10.0,
        xid_log: xids.XidLog | None = None,
        perf_counter: Callable[[], float] = time.perf_counter,
        enrich: Callable[[list[status.GPUStatus], float], None] | None = None,
    ) -> None:
        self.lib = lib
        self.expected_gpus = expected_gpus
        self.max_gpus_seen = 0
        """The most GPUs that answered at once (the runner restores it from the earlier status)."""
        self.slow_period_seconds = slow_period_seconds
        self.xid_log = xid_log or xids.XidLog()
        self.perf_counter = perf_counter
        self.enrich = enrich
        """Called with the raw facts of each sample before they are stamped (DCGM folds in here)."""
        self._missing_since: dict[int, str] = {}
        self._identities: list[_Identity] | None = None
        self._answering: list[_Identity] = []
        """The GPUs that answered the last enumeration, even when some did not (_identities is then None)."""
        self._tracks: dict[str, _Track] = {}
        self._last_slow: float | None = None
        self._slow_requested = False
        self._driver_version: str | None = None

    # --- events from outside the poll --------------------------------------------------------------------

    def request_full_sample(self) -> None:
        """Read the slow counters on the next sample too (an XID or DBE event just arrived)."""
        self._slow_requested = True

    def record_xid(self, nvml_index: int | None, code: int, now: float) -> None:
        """Count an XID for the GPU at an NVML index (None: the event did not say which GPU)."""
        identity = self._identity_at(nvml_index)
        key = identity.uuid if identity is not None else f"index-{nvml_index}"
        self.xid_log.record(key, code, timefmt.rfc3339(now))
        self._slow_requested = True

    def gpu_index_of(self, handle: Any) -> int | None:
        """The NVML index of a device handle from an event, or None if that cannot be told."""
        try:
            return int(self.lib.nvmlDeviceGetIndex(handle))
        except nvml.NVMLError:
            for track in self._tracks.values():
                if nvml.same_device(track.identity.handle, handle):
                    return track.identity.index
            return None

    def handles(self) -> list[Any]:
        """Device handles of the GPUs that answered the last enumeration (for event registration).

        Not only a complete enumeration: a node that boots with one GPU off the
        bus must still get XID events from the others.
        """
        return [identity.handle for identity in self._answering]

    def uuid_of(self, index: int | None) -> str | None:
        identity = self._identity_at(index)
        return identity.uuid if identity is not None else None

    def _identity_at(self, index: int | None) -> _Identity | None:
        for identity in self._identities or []:
            if identity.index == index:
                return identity
        for track in self._tracks.values():
            if track.identity.index == index:
                return track.identity
        return None

    # --- the sample -------------------------------------------------------------------------------------

    def sample(self, now: float) -> Sample:
        started = self.perf_counter()
        errors: collections.Counter[tuple[str, str]] = collections.Counter()
        identities = self._refresh_identities(errors)
        slow = (
            self._slow_requested
            or self._last_slow is None
            or now - self._last_slow >= self.slow_period_seconds
        )
        if slow:
            self._last_slow = now
            self._slow_requested = False
        seen: set[str] = set()
        pending: list[tuple[_Track, status.GPUStatus]] = []
        for identity in identities:
            seen.add(identity.uuid)
            pending.append(self._sample_gpu(identity, slow, errors))
        taken = {gpu["index"] for _, gpu in pending}
        for track in self._tracks.values():
            if track.identity.uuid not in seen and track.identity.index not in taken:
                # Was here, is gone (the driver re-enumerated without it): it fell off the bus.
                pending.append(self._lost_status(track))
                taken.add(track.identity.index)
        if self.enrich is not None:
            self.enrich([gpu for _, gpu in pending], now)
        gpus = [self._finish(track, gpu, now) for track, gpu in pending]
        # Padded with lost entries up to the physical count, never beyond: not the shared capacity.
        self.max_gpus_seen = min(faults.MAX_GPUS, max(self.max_gpus_seen, len(identities)))
        expected = min(faults.MAX_GPUS, max(self.expected_gpus or 0, self.max_gpus_seen))
        for index in range(expected):
            if index not in taken:
                since = self._missing_since.setdefault(index, timefmt.rfc3339(now))
                gpus.append(status.GPUStatus(index=index, lost=True, observedTime=since))
            else:
                self._missing_since.pop(index, None)
        gpus.sort(key=lambda g: g["index"])
        return Sample(
            time=now,
            driver_version=self._driver_version,
            gpus=gpus,
            expected_gpus=expected,
            errors=errors,
            duration_seconds=self.perf_counter() - started,
            max_gpus_seen=self.max_gpus_seen,
        )

    def _call(
        self,
        function: str,
        errors: collections.Counter[tuple[str, str]],
        call: Callable[..., Any],
        *args: Any,
    ) -> Any:
        try:
            return call(*args)
        except nvml.NVMLError as exc:
            errors[(function, nvml.error_name(exc))] += 1
            raise

    def _refresh_identities(self, errors: collections.Counter[tuple[str, str]]) -> list[_Identity]:
        lib = self.lib
        try:
            count = int(self._call("nvmlDeviceGetCount", errors, lib.nvmlDeviceGetCount))
        except nvml.NVMLError:
            log.warning("nvmlDeviceGetCount failed; reporting the GPUs known so far")
            return list(self._identities or [])
        if self._identities is not None and len(self._identities) == count:
            return self._identities
        if self._driver_version is None:
            with contextlib.suppress(nvml.NVMLError):
                self._driver_version = nvml.text(
                    self._call("nvmlSystemGetDriverVersion", errors, lib.nvmlSystemGetDriverVersion)
                )
        identities = []
        for index in range(count):
            try:
                handle = self._call(
                    "nvmlDeviceGetHandleByIndex", errors, lib.nvmlDeviceGetHandleByIndex, index
                )
                uuid = nvml.text(self._call("nvmlDeviceGetUUID", errors, lib.nvmlDeviceGetUUID, handle))
            except nvml.NVMLError:
                continue  # lost or unreadable: reported from the last known identity, or as missing
            model = pci = None
            try:
                model = nvml.text(self._call("nvmlDeviceGetName", errors, lib.nvmlDeviceGetName, handle))
                info = self._call("nvmlDeviceGetPciInfo", errors, lib.nvmlDeviceGetPciInfo, handle)
                pci = nvml.text(info.busId)
            except nvml.NVMLError:
                pass
            identities.append(_Identity(index, handle, uuid, model, pci))
        # Identity reads that failed leave the list short; retry the full read on the next sample.
        self._identities = identities if len(identities) == count else None
        self._answering = identities
        return identities

    def _sample_gpu(
        self, identity: _Identity, slow: bool, errors: collections.Counter[tuple[str, str]]
    ) -> tuple[_Track, status.GPUStatus]:
        track = self._tracks.get(identity.uuid)
        fresh = track is None or track.lost or not nvml.same_device(track.identity.handle, identity.handle)
        if track is None:
            track = self._tracks[identity.uuid] = _Track(identity)
        track.identity = identity
        lost = False
        slow = slow or (track.last_status is not None and awaits_reset(track.last_status))
        for position, query in enumerate(QUERIES):
            due = (
                query.tier is Tier.FAST
                or fresh
                or (slow and query.tier is Tier.SLOW)
                or position not in track.partials
            )
            if not due:
                continue
            try:
                track.partials[position] = query.read(self.lib, identity.handle)
            except nvml.GpuIsLost:
                errors[(query.function, "GpuIsLost")] += 1
                lost = True
                break
            except nvml.UNSUPPORTED:
                track.partials[position] = {}
            except nvml.NVMLError as exc:
                # Transient: keep the last good value (if any) rather than flapping the field.
                errors[(query.function, nvml.error_name(exc))] += 1
                log.debug("%s failed on GPU %d: %s", query.function, identity.index, exc)
        if lost:
            # Forget the handle set: the driver may re-enumerate when the GPU comes back.
            self._identities = None
            return self._lost_status(track)
        gpu: dict[str, Any] = {"index": identity.index, "uuid": identity.uuid}
        if identity.model:
            gpu["model"] = identity.model
        if identity.pci_bus_id:
            gpu["pciBusId"] = identity.pci_bus_id
        for position in range(len(QUERIES)):
            merge(gpu, track.partials.get(position, {}))
        result: status.GPUStatus = gpu  # type: ignore[assignment]
        self._note_reset(track, result)
        track.lost = False
        return track, result

    def _note_reset(self, track: _Track, gpu: status.GPUStatus) -> None:
        """Clear the GPU's XIDs when it shows signs of a reset (XID counts are "since the last reset")."""
        if track.last_status is not None and looks_reset(track.last_status, gpu):
            self.xid_log.clear(track.identity.uuid)

    def restore(self, previous: list[status.GPUStatus]) -> int:
        """Carry XIDs over from the status an earlier agent process reported (an agent restart).

        NVML tells of an XID only once, so without this an agent upgrade would
        erase a fatal XID from the GPUNode. A GPU that was reset meanwhile (a
        node reboot brings a lost GPU back, a driver reload clears volatile ECC
        counts, ...) starts again from zero. Returns how many GPUs got XIDs back.
        """
        restored = 0
        for gpu in previous:
            uuid, records = gpu.get("uuid"), gpu.get("xids")
            if not uuid or not records:
                continue
            track = self._tracks.get(uuid)
            if track is None and "index" in gpu:
                # Not enumerated now (lost since before this process started): remember who it was,
                # so it is reported lost under its UUID, with its XIDs, not as an anonymous gap.
                identity = _Identity(gpu["index"], None, uuid, gpu.get("model"), gpu.get("pciBusId"))
                track = self._tracks[uuid] = _Track(identity, lost=bool(gpu.get("lost")), last_status=gpu)
            elif track is not None and track.last_status is not None and looks_reset(gpu, track.last_status):
                continue
            self.xid_log.restore(uuid, records)
            restored += 1
        return restored

    def _lost_status(self, track: _Track) -> tuple[_Track, status.GPUStatus]:
        identity = track.identity
        gpu = status.GPUStatus(index=identity.index, uuid=identity.uuid, lost=True)
        if identity.model:
            gpu["model"] = identity.model
        if identity.pci_bus_id:
            gpu["pciBusId"] = identity.pci_bus_id
        track.lost = True
        track.partials.clear()
        return track, gpu

    def _finish(self, track: _Track, gpu: status.GPUStatus, now: float) -> status.GPUStatus:
        stamp = timefmt.rfc3339(now)
        records = self.xid_log.records(track.identity.uuid)
        if records:
            gpu["xids"] = records
        throttling = changes.throttle_reasons(gpu)
        if not throttling:
            track.throttled_since = None
        elif track.throttled_since is None:
            track.throttled_since = stamp
        if track.throttled_since is not None:
            gpu["throttledSince"] = track.throttled_since
        view = changes.gpu_view(gpu)
        if view != track.view:
            track.view = view
            track.observed_time = stamp
        gpu["observedTime"] = track.observed_time or stamp
        track.last_status = gpu
        return gpu
