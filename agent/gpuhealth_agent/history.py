"""What the agent remembers about each GPU between samples, beyond what it just read.

NVML tells of an XID exactly once and has no reset event, so the agent keeps
per-GPU memory: the XID log (counts since the last reset), reset inference
(a reset clears that log), the carry-over of XIDs from an earlier agent
process, and the time stamps of the status (`observedTime`, when a fact worth
a write last changed; `throttledSince`; since when a GPU has been missing).
The collector (which reads) hands each reading here; nothing else writes
this memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuhealth_agent import changes, xids
from gpuhealth_api import status, timestamps


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
    # Both read: a count that cannot be read now (absent, unreadable) is no count of 0.
    for old, new in (
        (old_ecc.get("correctedVolatile"), new_ecc.get("correctedVolatile")),
        (old_ecc.get("uncorrectedVolatile"), new_ecc.get("uncorrectedVolatile")),
    ):
        if old is not None and new is not None and new < old:
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


@dataclasses.dataclass
class _Memory:
    """What is remembered of one GPU (by UUID)."""

    view: dict[str, Any] | None = None
    """The significant facts last reported (changes.gpu_view), to tell when observedTime moves."""
    observed_time: str | None = None
    throttled_since: str | None = None
    last_status: status.GPUStatus | None = None
    """The last status reported (or carried over from an earlier process)."""


class History:
    """Per-GPU memory across samples (see module doc); the only writer of the XID log."""

    def __init__(self, xid_log: xids.XidLog | None = None) -> None:
        self.xid_log = xid_log or xids.XidLog()
        self._gpus: dict[str, _Memory] = {}
        self._missing_since: dict[int, str] = {}

    def last_status(self, uuid: str) -> status.GPUStatus | None:
        memory = self._gpus.get(uuid)
        return memory.last_status if memory is not None else None

    def record_xid(self, uuid: str | None, index: int | None, code: int, now: float) -> None:
        """Count an XID for a GPU (by UUID; by NVML index when the UUID is not known)."""
        key = uuid if uuid is not None else f"index-{index}"
        self.xid_log.record(key, code, timestamps.rfc3339(now))

    def note_reading(self, uuid: str, gpu: status.GPUStatus) -> None:
        """Clear the GPU's XIDs when a fresh reading shows signs of a reset (they count since the last)."""
        last = self.last_status(uuid)
        if last is not None and looks_reset(last, gpu):
            self.xid_log.clear(uuid)

    def stamp(self, uuid: str, gpu: status.GPUStatus, now: float) -> status.GPUStatus:
        """Add the remembered parts (xids, throttledSince, observedTime) to a GPU's status and remember it."""
        memory = self._gpus.setdefault(uuid, _Memory())
        stamp = timestamps.rfc3339(now)
        records = self.xid_log.records(uuid)
        if records:
            gpu["xids"] = records
        throttling = changes.throttle_reasons(gpu)
        if not throttling:
            memory.throttled_since = None
        elif memory.throttled_since is None:
            memory.throttled_since = stamp
        if memory.throttled_since is not None:
            gpu["throttledSince"] = memory.throttled_since
        view = changes.gpu_view(gpu)
        if view != memory.view:
            memory.view = view
            memory.observed_time = stamp
        gpu["observedTime"] = memory.observed_time or stamp
        memory.last_status = gpu
        return gpu

    def missing_since(self, index: int, now: float) -> str:
        """Since when the GPU at an index has been missing (the first sample without it)."""
        return self._missing_since.setdefault(index, timestamps.rfc3339(now))

    def present(self, index: int) -> None:
        self._missing_since.pop(index, None)

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
            memory = self._gpus.get(uuid)
            if memory is None:
                if "index" in gpu:
                    # Not read by this process yet (lost since before it started): its earlier status
                    # is what a later reading is compared with to see a reset.
                    self._gpus[uuid] = _Memory(last_status=gpu)
            elif memory.last_status is not None and looks_reset(gpu, memory.last_status):
                continue
            self.xid_log.restore(uuid, records)
            restored += 1
        return restored
