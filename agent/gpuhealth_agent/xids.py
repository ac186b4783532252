"""XIDs: the driver's error codes, what they mean, and how many each GPU has seen.

The meaning of each code lives in data (`xid_catalogue.yaml`, from NVIDIA's
XID catalogue), not in an if-chain, so a new driver's codes are a one-line
change. `XidLog` keeps per-GPU counts and last-seen times across reports:
NVML only tells us about an XID once, as an event, so forgetting it would
lose the fault.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.resources
from collections.abc import Mapping
from typing import Final

import yaml

from gpuhealth_api import status
from gpuhealth_api import timestamps as timefmt


class Severity(enum.StrEnum):
    FATAL = "fatal"
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    description: str
    severity: Severity
    action: str
    """NVIDIA's immediate resolution bucket: RESTART_APP, RESET_GPU, RESTART_BM, ..."""


UNKNOWN_SEVERITY: Final = Severity.WARNING
UNKNOWN_ACTION: Final = "CONTACT_SUPPORT"


class Catalogue:
    """XID code → meaning, loaded from the packaged YAML (or any mapping, for tests)."""

    def __init__(self, entries: Mapping[int, XidInfo]) -> None:
        self._entries = dict(entries)

    @classmethod
    def packaged(cls) -> Catalogue:
        text = importlib.resources.files("gpuhealth_agent").joinpath("xid_catalogue.yaml").read_text()
        data = yaml.safe_load(text)
        entries = {
            int(item["code"]): XidInfo(
                code=int(item["code"]),
                name=str(item["name"]),
                description=str(item["description"]),
                severity=Severity(item["severity"]),
                action=str(item["action"]),
            )
            for item in data["xids"]
        }
        return cls(entries)

    def lookup(self, code: int) -> XidInfo:
        found = self._entries.get(code)
        if found is not None:
            return found
        return XidInfo(
            code, f"XID_{code}", f"XID {code} (not in the catalogue)", UNKNOWN_SEVERITY, UNKNOWN_ACTION
        )

    def __len__(self) -> int:
        return len(self._entries)


@dataclasses.dataclass
class _Seen:
    count: int
    last_seen: str


class XidLog:
    """Per-GPU (by UUID) XID counts and last-seen times, since the GPU's last reset."""

    def __init__(self) -> None:
        self._by_gpu: dict[str, dict[int, _Seen]] = {}

    def record(self, gpu_uuid: str, code: int, when: str) -> None:
        seen = self._by_gpu.setdefault(gpu_uuid, {}).get(code)
        if seen is None:
            self._by_gpu[gpu_uuid][code] = _Seen(1, when)
        else:
            seen.count += 1
            seen.last_seen = when

    def restore(self, gpu_uuid: str, records: list[status.XidRecord]) -> None:
        """Add counts reported earlier (by a previous agent process) to what this one has seen."""
        seen = self._by_gpu.setdefault(gpu_uuid, {})
        for record in records:
            code, count, last = int(record["code"]), int(record["count"]), str(record["lastSeen"])
            mine = seen.get(code)
            if mine is None:
                seen[code] = _Seen(count, last)
            else:
                mine.count += count
                if timefmt.parse(last) > timefmt.parse(mine.last_seen):
                    mine.last_seen = last

    def clear(self, gpu_uuid: str) -> None:
        """Forget a GPU's XIDs: it was reset, so "since the last reset" starts again."""
        self._by_gpu.pop(gpu_uuid, None)

    def records(self, gpu_uuid: str) -> list[status.XidRecord]:
        seen = self._by_gpu.get(gpu_uuid, {})
        return [
            status.XidRecord(code=code, count=s.count, lastSeen=s.last_seen)
            for code, s in sorted(seen.items())
        ]
