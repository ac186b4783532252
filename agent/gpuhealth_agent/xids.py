"""XIDs: how many each GPU has seen (their meaning is the api's XID catalogue).

`XidLog` keeps per-GPU counts and last-seen times across reports: NVML only
tells us about an XID once, as an event, so forgetting it would lose the
fault. What each code means, and whether it is critical, is one catalogue
for agent and operator alike: `gpuhealth_api.xid_catalogue`, re-exported here.
"""

from __future__ import annotations

import dataclasses

from gpuhealth_api import status, xid_catalogue
from gpuhealth_api import timestamps as timefmt

Catalogue = xid_catalogue.Catalogue
XidInfo = xid_catalogue.XidInfo


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
