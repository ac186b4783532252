"""One sample of every GPU on the node, as `status.gpus[]` facts.

The collector talks only to `nvml.Library`, so the same code reads real GPUs
and simulated ones. Each NVML query stands alone: a query the GPU does not
support leaves its field absent, a transient error keeps the field's last
value (and is counted) for up to UNREADABLE_AFTER_FAILURES failed reads, after
which the field is absent and named in the GPU's `unreadable` list (never a
silent old value), `GPU_IS_LOST` marks that GPU lost, and nothing fails the
sample as a whole.

Queries come in three tiers to keep NVML traffic low (the agent must stay
under 10 calls per GPU per second at a 1 s interval): *static* facts
(identity, thresholds, maximums) are read when the GPU set changes; *fast*
facts (temperature, power, clocks, throttle reasons, uncorrectable ECC,
recovery action) every sample; *slow* counters (other ECC counters, retired
pages, remapped rows, PCIe) at most every `slow_period_seconds`, at once
after an XID or double-bit ECC event, and every sample on a GPU with a pending
page retirement or row remap (`awaits_reset`). Which facts exist, and in
which tier, is the fact table's (`facts.py`); what the agent remembers
beyond the last reading (XIDs, resets, time stamps) is `history.py`'s.

Facts outside the table: NVLink (`links.py`: one field-values call per GPU
per sample, links counted once) and fabric info (slow tier), PCIe AER per GPU
(`sysfs.py`, slow tier) and the node's InfiniBand/RoCE ports (`sysfs.py`:
each port's state every sample, a port going down is worth a write at once;
the rest on the slow tier). Sysfs facts need
a `sysfs_root`; without one (the fleet simulator's default) they are absent.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from gpuhealth_agent import facts, history, links, nvml, sysfs, xids
from gpuhealth_api import faults, status

log = logging.getLogger(__name__)

UNREADABLE_AFTER_FAILURES: Final = 3
"""Failed reads in a row after which a fact's last good value is no longer reported (it is `unreadable`).

A single Timeout should not flap a field; a query that keeps failing must not report a healthy
value read minutes ago: an ECC count that cannot be read is not a count of 0."""

Partial = dict[str, Any]
"""A piece of a GPUStatus, possibly nested ({"ecc": {"uncorrectedVolatile": 1}}), merged into the whole."""


@dataclasses.dataclass(frozen=True)
class Query:
    """One NVML call and the facts it answers (several for a struct or tuple result)."""

    function: str
    """The NVML function, for error counts and logs."""
    args: tuple[Any, ...]
    tier: facts.Tier
    facts: tuple[facts.Fact, ...]

    def read(self, lib: nvml.Library, handle: Any) -> Partial:
        result = nvml.call(lib, self.function, handle, *self.args)
        part: dict[str, Any] = {}
        for fact in self.facts:
            raw = result
            if isinstance(fact.part, str):
                raw = getattr(result, fact.part)
            elif isinstance(fact.part, int):
                raw = result[fact.part]
            *parents, leaf = fact.path
            node = part
            for name in parents:
                node = node.setdefault(name, {})
            node[leaf] = facts.decode(fact, raw)
        return part


def _queries() -> tuple[Query, ...]:
    """The fact table as NVML calls: facts one call answers share it (in table order)."""
    calls: dict[tuple[str, tuple[Any, ...]], list[facts.Fact]] = {}
    for fact in facts.FACTS:
        calls.setdefault((fact.function, fact.args), []).append(fact)
    return tuple(
        Query(function, args, group[0].tier, tuple(group)) for (function, args), group in calls.items()
    )


QUERIES: Final[tuple[Query, ...]] = _queries()
EXTRAS: Final[dict[str, str]] = {
    "nvlink": "nvmlDeviceGetFieldValues",
    "fabric": "nvmlDeviceGetGpuFabricInfo",
    "aer": "sysfs",
}
"""Facts outside the fact table (module doc), in merge order, with the call that reads them."""


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
    """What the collector last read of one GPU (by UUID); the rest of its memory is in history.py."""

    identity: _Identity
    partials: dict[int, Partial] = dataclasses.field(default_factory=dict)
    """Last good result of each query (by position in QUERIES); {} when unsupported."""
    failures: dict[int, int] = dataclasses.field(default_factory=dict)
    """Failed reads in a row of each query (by position) whose last read failed."""
    lost: bool = False
    nvlink: links.NvLinkReader | None = None
    """The GPU's links (counted once per handle); None until counted."""
    extra: dict[str, Partial] = dataclasses.field(default_factory=dict)
    """Last good reading of each fact outside the table (nvlink, fabric, aer); {} when unsupported."""
    extra_failures: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """Which GPU an event or a DCGM record names, resolved once (either part may be unknown)."""

    index: int | None
    uuid: str | None


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
    blind: bool = False
    """No GPU answers and this process has never seen one: NVML cannot see the node's GPUs (a
    container runtime that hides them). `gpus` is then empty: the agent cannot tell a GPU lost."""
    nics: list[status.Nic] | None = None
    """The node's InfiniBand/RoCE ports; None without a sysfs root or /sys/class/infiniband."""


class Collector:
    """Reads all GPUs through an nvml.Library; hands each reading to a History (see module doc)."""

    def __init__(
        self,
        lib: nvml.Library,
        *,
        expected_gpus: int | None = None,
        slow_period_seconds: float = 10.0,
        xid_log: xids.XidLog | None = None,
        perf_counter: Callable[[], float] = time.perf_counter,
        enrich: Callable[[list[status.GPUStatus], float], None] | None = None,
        sysfs_root: Path | None = None,
    ) -> None:
        self.lib = lib
        self.expected_gpus = expected_gpus
        self.max_gpus_seen = 0
        """The most GPUs that answered at once (the runner restores it from the earlier status)."""
        self.seen_here = 0
        """The most GPUs that answered at once in this process (never restored)."""
        self.slow_period_seconds = slow_period_seconds
        self.history = history.History(xid_log)
        self.perf_counter = perf_counter
        self.enrich = enrich
        self.sysfs_root = sysfs_root
        """Where sysfs is (`/sys`, a test's or the simulation's tree); None: no sysfs facts."""
        self._nics = None if sysfs_root is None else sysfs.NicReader(sysfs_root)
        """Called with the raw facts of each sample before they are stamped (DCGM folds in here)."""
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

    def record_xid(self, gpu: Gpu, code: int, now: float) -> None:
        """Count an XID for a GPU and read the slow counters on the next sample too."""
        self.history.record_xid(gpu.uuid, gpu.index, code, now)
        self._slow_requested = True

    def identify(self, handle: Any) -> Gpu:
        """Which GPU a device handle from an event names (index and UUID, as far as they can be told)."""
        try:
            index: int | None = int(self.lib.nvmlDeviceGetIndex(handle))
        except nvml.NVMLError:
            index = next(
                (
                    t.identity.index
                    for t in self._tracks.values()
                    if nvml.same_device(t.identity.handle, handle)
                ),
                None,
            )
        return self.gpu_at(index)

    def gpu_at(self, index: int | None) -> Gpu:
        """The GPU at an NVML index (None: the event did not say which GPU)."""
        identity = self._identity_at(index)
        return Gpu(index, identity.uuid if identity is not None else None)

    def forget_handles(self) -> None:
        """NVML was shut down (a release for a reset): its handles die with it, the next sample after a
        new nvmlInit enumerates again. What the GPUs reported (tracks, XIDs) is kept."""
        self._identities = None
        self._answering = []

    def handles(self) -> list[Any]:
        """Device handles of the GPUs that answered the last enumeration (for event registration).

        Not only a complete enumeration: a node that boots with one GPU off the
        bus must still get XID events from the others.
        """
        return [identity.handle for identity in self._answering]

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
        nics = None if self._nics is None else self._nics.read(full=self._slow_due(now))
        self.seen_here = max(self.seen_here, len(identities))
        if not identities and self.seen_here == 0:
            # Nothing answers and nothing ever did in this process: NVML cannot see the GPUs (a
            # runtime that hides them, a count that fails). That says nothing about the GPUs, so
            # none is reported, and none lost (not even one an earlier agent knew): the runner
            # reports the agent's error instead (issue 24: this drained whole fleets as GPULost).
            blind = self.blind(now, errors, started)
            blind.nics = nics
            return blind
        slow = self._slow_due(now)
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
        gpus = [self.history.stamp(track.identity.uuid, gpu, now) for track, gpu in pending]
        # Padded with lost entries up to the physical count, never beyond: not the shared capacity.
        self.max_gpus_seen = min(faults.MAX_GPUS, max(self.max_gpus_seen, len(identities)))
        expected = min(faults.MAX_GPUS, max(self.expected_gpus or 0, self.max_gpus_seen))
        for index in range(expected):
            if index not in taken:
                since = self.history.missing_since(index, now)
                gpus.append(status.GPUStatus(index=index, lost=True, observedTime=since))
            else:
                self.history.present(index)
        gpus.sort(key=lambda g: g["index"])
        return Sample(
            time=now,
            driver_version=self._driver_version,
            gpus=gpus,
            expected_gpus=expected,
            errors=errors,
            duration_seconds=self.perf_counter() - started,
            max_gpus_seen=self.max_gpus_seen,
            nics=nics,
        )

    def _slow_due(self, now: float) -> bool:
        """Whether this sample reads the slow tier (see the module doc)."""
        return (
            self._slow_requested
            or self._last_slow is None
            or now - self._last_slow >= self.slow_period_seconds
        )

    def blind(
        self, now: float, errors: collections.Counter[tuple[str, str]], started: float | None = None
    ) -> Sample:
        """A sample of no GPU, none lost, marked `blind`: NVML cannot see the node's GPUs (or start)."""
        expected = min(faults.MAX_GPUS, max(self.expected_gpus or 0, self.max_gpus_seen))
        return Sample(
            time=now,
            driver_version=self._driver_version,
            gpus=[],
            expected_gpus=expected,
            errors=errors,
            duration_seconds=0.0 if started is None else self.perf_counter() - started,
            max_gpus_seen=self.max_gpus_seen,
            blind=True,
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
        last = self.history.last_status(identity.uuid)
        slow = slow or (last is not None and awaits_reset(last))
        for position, query in enumerate(QUERIES):
            due = (
                query.tier is facts.Tier.FAST
                or fresh
                or (slow and query.tier is facts.Tier.SLOW)
                or position not in track.partials
            )
            if not due:
                continue
            try:
                track.partials[position] = query.read(self.lib, identity.handle)
                track.failures.pop(position, None)
            except nvml.GpuIsLost:
                errors[(query.function, "GpuIsLost")] += 1
                lost = True
                break
            except nvml.UNSUPPORTED:
                track.partials[position] = {}
                track.failures.pop(position, None)
            except nvml.NVMLError as exc:
                # Keep the last good value (if any) through a short outage rather than flapping the
                # field; past UNREADABLE_AFTER_FAILURES the field is absent and listed as unreadable.
                errors[(query.function, nvml.error_name(exc))] += 1
                failed = track.failures[position] = track.failures.get(position, 0) + 1
                if failed >= UNREADABLE_AFTER_FAILURES:
                    track.partials.pop(position, None)
                log.debug(
                    "%s failed on GPU %d (%d in a row): %s", query.function, identity.index, failed, exc
                )
        if not lost:
            lost = self._sample_extras(track, fresh, slow, errors)
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
        for name in EXTRAS:
            merge(gpu, track.extra.get(name, {}))
        unreadable = sorted(
            [
                ".".join(fact.path)
                for position in track.failures
                if position not in track.partials
                for fact in QUERIES[position].facts
            ]
            + [name for name in track.extra_failures if name not in track.extra]
        )
        if unreadable:
            gpu["unreadable"] = unreadable
        result: status.GPUStatus = gpu  # type: ignore[assignment]
        self.history.note_reading(identity.uuid, result)
        track.lost = False
        return track, result

    def restore(self, previous: list[status.GPUStatus]) -> int:
        """Carry XIDs over from an earlier agent process's status (history.History.restore).

        A GPU with XIDs that this process has not enumerated (lost since before
        it started) is remembered by identity, so it is reported lost under its
        UUID, with its XIDs, not as an anonymous gap.
        """
        for gpu in previous:
            uuid = gpu.get("uuid")
            if uuid and gpu.get("xids") and uuid not in self._tracks and "index" in gpu:
                identity = _Identity(gpu["index"], None, uuid, gpu.get("model"), gpu.get("pciBusId"))
                self._tracks[uuid] = _Track(identity, lost=bool(gpu.get("lost")))
        return self.history.restore(previous)

    def _lost_status(self, track: _Track) -> tuple[_Track, status.GPUStatus]:
        identity = track.identity
        gpu = status.GPUStatus(index=identity.index, uuid=identity.uuid, lost=True)
        if identity.model:
            gpu["model"] = identity.model
        if identity.pci_bus_id:
            gpu["pciBusId"] = identity.pci_bus_id
        track.lost = True
        track.partials.clear()
        track.failures.clear()
        track.nvlink = None
        track.extra.clear()
        track.extra_failures.clear()
        return track, gpu

    def _sample_extras(
        self, track: _Track, fresh: bool, slow: bool, errors: collections.Counter[tuple[str, str]]
    ) -> bool:
        """Read NVLink, fabric and AER into `track.extra` (module doc); True if the GPU is lost."""
        identity = track.identity
        handle = identity.handle
        try:
            if fresh or track.nvlink is None:
                track.nvlink = None
                count = self._call("nvmlDeviceGetNvLinkState", errors, links.discover, self.lib, handle)
                track.nvlink = links.NvLinkReader(count)
        except nvml.GpuIsLost:
            return True
        except nvml.NVMLError:
            pass  # counted; tried again next sample
        reader = track.nvlink
        if reader is not None and reader.links:
            lost = self._extra(track, "nvlink", errors, lambda: reader.read(self.lib, handle, slow))
            if lost:
                return True
        if slow or fresh or "fabric" not in track.extra:
            lost = self._extra(track, "fabric", errors, lambda: links.read_fabric(self.lib, handle))
            if lost:
                return True
        if (
            self.sysfs_root is not None
            and identity.pci_bus_id
            and (slow or fresh or "aer" not in track.extra)
        ):
            aer = sysfs.read_aer(self.sysfs_root, identity.pci_bus_id)
            track.extra["aer"] = {} if aer is None else {"pcie": {"aer": aer}}
        return False

    def _extra(
        self,
        track: _Track,
        name: str,
        errors: collections.Counter[tuple[str, str]],
        read: Callable[[], Any],
    ) -> bool:
        """One read of a fact outside the table, kept as a query's is; True if the GPU is lost."""
        function = EXTRAS[name]
        try:
            value = read()
        except nvml.GpuIsLost:
            errors[(function, "GpuIsLost")] += 1
            return True
        except nvml.UNSUPPORTED:
            track.extra[name] = {}
            track.extra_failures.pop(name, None)
            return False
        except nvml.NVMLError as exc:
            errors[(function, nvml.error_name(exc))] += 1
            failed = track.extra_failures[name] = track.extra_failures.get(name, 0) + 1
            if failed >= UNREADABLE_AFTER_FAILURES:
                track.extra.pop(name, None)
            return False
        track.extra[name] = {} if value is None else {name: value}
        track.extra_failures.pop(name, None)
        return False
