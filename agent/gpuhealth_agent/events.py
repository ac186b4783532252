"""NVML events (critical XIDs, double-bit ECC errors) without waiting for the next poll.

NVML reports an XID exactly once, as an event; polling cannot see it. The
`EventWatcher` registers every GPU for XID and DBE events and offers two
ways to drain them: a blocking thread (`run`, production: wakes the agent
loop so the fault is reported within milliseconds) and a non-blocking
`poll` (the fleet simulator, which has no thread per agent). Events travel
to the agent loop through a queue, so only the loop touches collector state.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from gpuhealth_agent import nvml

log = logging.getLogger(__name__)

EVENT_TYPES: Final = nvml.EVENT_TYPE_XID_CRITICAL_ERROR | nvml.EVENT_TYPE_DOUBLE_BIT_ECC_ERROR
WAIT_MILLISECONDS: Final = 500
"""How long one blocking wait lasts; bounds how long stopping the thread takes."""


class Kind(enum.StrEnum):
    XID = "xid"
    DBE = "dbe"


@dataclasses.dataclass(frozen=True)
class Event:
    kind: Kind
    handle: Any
    code: int
    """The XID code for Kind.XID; 0 for DBE."""


class EventWatcher:
    """One NVML event set covering all GPUs of the node."""

    def __init__(self, lib: nvml.Library, wake: Callable[[], None] = lambda: None) -> None:
        self.lib = lib
        self.wake = wake
        self.queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._set: Any = None
        self._registered: list[Any] = []
        self._refused: list[Any] = []
        """Handles whose registration failed: not asked again."""

    def open(self, handles: Sequence[Any]) -> int:
        """Create the event set and register each GPU; returns how many GPUs are registered."""
        self._set = self.lib.nvmlEventSetCreate()
        return self.register(handles)

    def register(self, handles: Sequence[Any]) -> int:
        """Register the GPUs not registered yet (one that answers only later); returns how many are."""
        if self._set is None:
            return 0
        for handle in handles:
            if any(nvml.same_device(handle, known) for known in self._registered + self._refused):
                continue  # refused once (NOT_SUPPORTED, say): asking again every turn costs NVML calls
            try:
                self.lib.nvmlDeviceRegisterEvents(handle, EVENT_TYPES, self._set)
            except nvml.NVMLError as exc:
                self._refused.append(handle)
                log.warning(
                    "GPU cannot deliver XID/DBE events (%s); its faults are seen by polling only", exc
                )
                continue
            self._registered.append(handle)
        return len(self._registered)

    @property
    def registered(self) -> int:
        """How many GPUs deliver events to this set."""
        return len(self._registered)

    def _convert(self, data: nvml.EventData) -> Event:
        if data.eventType & nvml.EVENT_TYPE_XID_CRITICAL_ERROR:
            return Event(Kind.XID, data.device, int(data.eventData))
        return Event(Kind.DBE, data.device, 0)

    def poll(self) -> int:
        """Move every event already waiting into the queue without blocking; returns how many."""
        if self._set is None:
            return 0
        count = 0
        while True:
            try:
                data = self.lib.nvmlEventSetWait_v2(self._set, 0)
            except nvml.Timeout:
                return count
            except nvml.NVMLError as exc:
                log.warning("nvmlEventSetWait_v2 failed: %s", exc)
                return count
            self.queue.put(self._convert(data))
            count += 1

    def run(self, stop: threading.Event) -> None:
        """Thread body: block on the event set, queue each event and wake the agent loop."""
        while not stop.is_set() and self._set is not None:
            try:
                data = self.lib.nvmlEventSetWait_v2(self._set, WAIT_MILLISECONDS)
            except nvml.Timeout:
                continue
            except nvml.NVMLError as exc:
                log.warning("nvmlEventSetWait_v2 failed: %s; retrying in 1s", exc)
                stop.wait(1.0)
                continue
            self.queue.put(self._convert(data))
            self.wake()

    def start_thread(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="nvml-events", daemon=True)
        thread.start()
        return thread

    def drain(self) -> list[Event]:
        events = []
        while True:
            try:
                events.append(self.queue.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        if self._set is not None:
            try:
                self.lib.nvmlEventSetFree(self._set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._set = None
            self._registered.clear()
            self._refused.clear()
