"""NVLink and NVSwitch fabric facts of one GPU: `gpus[].nvlink` and `gpus[].fabric`.

These do not fit the fact table (one NVML call per fact): a GPU has up to
NVML_NVLINK_MAX_LINKS links, each with its own state and error counters.
Read naively (nvmlDeviceGetNvLinkState and three nvmlDeviceGetNvLinkErrorCounter
calls per link) an H100 SXM's 18 links cost 72 calls per GPU per sample, seven
times the agent's whole budget (10 calls per GPU per second). So:

- the links are counted once per GPU (`discover`): nvmlDeviceGetNvLinkState for
  link 0, 1, ... until NVML answers NOT_SUPPORTED or INVALID_ARGUMENT (the
  board has no more); NOT_SUPPORTED on link 0 means no NVLink (a PCIe board):
  the `nvlink` field is absent, never a fault, and never asked again;
- then each sample reads every link's state in ONE nvmlDeviceGetFieldValues call
  (NVML_FI_DEV_NVLINK_GET_STATE, scopeId = link), and on slow samples the same
  call also carries the per-link data-link CRC, replay and recovery counters
  (NVML_FI_DEV_NVLINK_ERROR_DL_*), summed over the links that are up: one call
  per GPU per sample in all;
- a driver that does not answer those fields (older than the field ids) falls
  back to nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkErrorCounter per link,
  on slow samples only (the budget again), and keeps the last reading between.

Fabric info (nvmlDeviceGetGpuFabricInfo) is read on slow samples: state
NotSupported, or the call's NOT_SUPPORTED, leaves `fabric` absent.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
from typing import Any, Final

from gpuhealth_agent import nvml
from gpuhealth_api import status

_END_OF_LINKS: Final = (nvml.NotSupported, nvml.InvalidArgument, nvml.FunctionNotFound)
"""What NVML answers for a link the board does not have."""

COUNTERS: Final[tuple[tuple[str, int | None, int], ...]] = (
    ("crcErrors", nvml.FI_DEV_NVLINK_ERROR_DL_CRC, nvml.NVLINK_ERROR_DL_CRC_FLIT),
    ("replayErrors", nvml.FI_DEV_NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_REPLAY),
    ("recoveryErrors", nvml.FI_DEV_NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_RECOVERY),
)
"""Each status counter: its field id (scoped by link) and its nvmlDeviceGetNvLinkErrorCounter counter."""


class Mode(enum.Enum):
    FIELDS = "fields"
    """States every sample and counters on slow samples, in one field-values call."""
    PER_LINK = "per-link"
    """The driver does not answer the link fields: one call per link and counter, on slow samples only."""


def discover(lib: nvml.Library, handle: Any) -> int:
    """How many NVLinks the GPU has (0: none, a PCIe board or NVLink not supported).

    Raises NVML's error for anything but the end of the links (GpuIsLost, a Timeout, ...).
    """
    for link in range(nvml.NVLINK_MAX_LINKS):
        try:
            lib.nvmlDeviceGetNvLinkState(handle, link)
        except _END_OF_LINKS:
            return link
    return nvml.NVLINK_MAX_LINKS


@dataclasses.dataclass
class NvLinkReader:
    """Reads one GPU's NVLinks (see the module doc); `links` from `discover`."""

    links: int
    mode: Mode = Mode.FIELDS
    last: status.NvLink | None = None

    def read(self, lib: nvml.Library, handle: Any, slow: bool) -> status.NvLink | None:
        """The GPU's `nvlink` facts, or None when it has no NVLink. Raises NVML's errors."""
        if self.links == 0:
            return None
        if self.mode is Mode.FIELDS:
            fields = self._fields(lib, handle, slow)
            if fields is not None:
                self.last = fields
                return fields
            self.mode = Mode.PER_LINK
            slow = True
        if slow or self.last is None:
            self.last = self._per_link(lib, handle)
        return self.last

    def _fields(self, lib: nvml.Library, handle: Any, slow: bool) -> status.NvLink | None:
        """States (and counters when `slow`) in one call; None when the driver lacks the state field."""
        if nvml.FI_DEV_NVLINK_GET_STATE is None:
            return None
        links = range(self.links)
        ids: list[tuple[int, int]] = [(nvml.FI_DEV_NVLINK_GET_STATE, link) for link in links]
        counters = [(key, field) for key, field, _ in COUNTERS if field is not None]
        if slow or self.last is None:
            ids += [(field, link) for _, field in counters for link in links]
        values = lib.nvmlDeviceGetFieldValues(handle, ids)
        states = values[: self.links]
        if all(v.nvmlReturn != nvml.SUCCESS for v in states):
            return None
        up = [
            link for link, v in zip(links, states, strict=True) if _ok(v) and _int(v) in nvml.NVLINK_STATES_UP
        ]
        found = status.NvLink(linksUp=len(up), linksDown=self.links - len(up))
        if len(values) > self.links:
            for position, (key, _) in enumerate(counters):
                start = self.links * (position + 1)
                per_link = values[start : start + self.links]
                answered = [_int(per_link[link]) for link in up if _ok(per_link[link])]
                if answered or not up:
                    found[key] = sum(answered)  # type: ignore[literal-required]
        elif self.last is not None:
            for key, _ in counters:
                if key in self.last:
                    found[key] = self.last[key]  # type: ignore[literal-required]
        return found

    def _per_link(self, lib: nvml.Library, handle: Any) -> status.NvLink:
        up = []
        for link in range(self.links):
            try:
                if lib.nvmlDeviceGetNvLinkState(handle, link) == nvml.FEATURE_ENABLED:
                    up.append(link)
            except nvml.UNSUPPORTED:
                continue
        found = status.NvLink(linksUp=len(up), linksDown=self.links - len(up))
        for key, _, counter in COUNTERS:
            total, answered = 0, False
            for link in up:
                try:
                    total += int(lib.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
                    answered = True
                except nvml.UNSUPPORTED:
                    continue
            if answered or not up:
                found[key] = total  # type: ignore[literal-required]
        return found


def _ok(value: nvml.FieldValue) -> bool:
    return value.nvmlReturn == nvml.SUCCESS


def _int(value: nvml.FieldValue) -> int:
    return int(value.value.ullVal)


def read_fabric(lib: nvml.Library, handle: Any) -> status.Fabric | None:
    """The GPU's fabric registration, or None where NVML does not support it (raises other errors).

    The versioned call first (nvmlDeviceGetGpuFabricInfoV with a version-tagged struct: a driver that
    does not know the version refuses it rather than filling another layout); the plain call where the
    driver or the binding lacks it."""
    info = nvml.fabric_info_v()
    if info is not None:
        try:
            lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except (nvml.FunctionNotFound, nvml.ArgumentVersionMismatch):
            info = None
    if info is None:
        info = nvml.fabric_info()
        lib.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    state = nvml.FABRIC_STATES.get(int(info.state), f"Unknown{int(info.state)}")
    if state == "NotSupported":
        return None
    return status.Fabric(state=state, status=nvml.return_name(int(info.status)), cliqueId=int(info.cliqueId))
