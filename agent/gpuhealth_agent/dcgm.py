"""Optional DCGM facts from a dcgm-exporter beside the agent (`--dcgm-exporter-url`).

Where a dcgm-exporter already runs, DCGM knows things NVML polling misses
(the last XID even if our event thread was not running, violation time
counters). We scrape its Prometheus text with prometheus_client's parser and
fold five fields into the same per-GPU facts. NVML stays authoritative: DCGM
can only add a fault (raise a count, set a flag, add a reason), never clear
one. An unreachable exporter is counted and logged; the NVML facts are
reported as usual.
"""

from __future__ import annotations

import dataclasses
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Final

from prometheus_client import parser

from gpuhealth_api import status

log = logging.getLogger(__name__)

XID: Final = "DCGM_FI_DEV_XID_ERRORS"
DBE_VOLATILE: Final = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE: Final = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
THERMAL_VIOLATION: Final = "DCGM_FI_DEV_THERMAL_VIOLATION"
POWER_VIOLATION: Final = "DCGM_FI_DEV_POWER_VIOLATION"
FIELDS: Final = frozenset({XID, DBE_VOLATILE, ROW_REMAP_FAILURE, THERMAL_VIOLATION, POWER_VIOLATION})

THERMAL_REASON: Final = "SwThermalSlowdown"
POWER_REASON: Final = "SwPowerCap"


@dataclasses.dataclass
class GpuFacts:
    uuid: str | None = None
    last_xid: int | None = None
    dbe_volatile: int | None = None
    remap_failure: bool | None = None
    thermal_violation: float | None = None
    """Cumulative time (µs) the GPU was held back by thermal limits."""
    power_violation: float | None = None


def parse_text(text: str) -> dict[int, GpuFacts]:
    """DCGM facts by GPU index from dcgm-exporter's Prometheus text."""
    facts: dict[int, GpuFacts] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples <family>_total; dcgm-exporter's names have no suffix.
            name = sample.name if sample.name in FIELDS else sample.name.removesuffix("_total")
            if name not in FIELDS or "gpu" not in sample.labels:
                continue
            try:
                index = int(sample.labels["gpu"])
            except ValueError:
                continue
            gpu = facts.setdefault(index, GpuFacts())
            gpu.uuid = sample.labels.get("UUID", gpu.uuid)
            value = sample.value
            if name == XID:
                gpu.last_xid = int(value)
            elif name == DBE_VOLATILE:
                gpu.dbe_volatile = int(value)
            elif name == ROW_REMAP_FAILURE:
                gpu.remap_failure = value > 0
            elif name == THERMAL_VIOLATION:
                gpu.thermal_violation = value
            elif name == POWER_VIOLATION:
                gpu.power_violation = value
    return facts


def fold(
    gpus: list[status.GPUStatus],
    now_facts: dict[int, GpuFacts],
    before: dict[int, GpuFacts],
    record_xid: Callable[[int, int], None],
) -> None:
    """Add DCGM's view to the NVML facts in place; `record_xid(index, code)` gets XIDs DCGM saw change."""
    by_index = {g["index"]: g for g in gpus}
    for index, facts in now_facts.items():
        gpu = by_index.get(index)
        if gpu is None or gpu.get("lost", False):
            continue
        previous = before.get(index)
        if facts.dbe_volatile is not None:
            ecc = gpu.setdefault("ecc", {})
            ecc["uncorrectedVolatile"] = max(ecc.get("uncorrectedVolatile", 0), facts.dbe_volatile)
        if facts.remap_failure:
            gpu.setdefault("remappedRows", {})["failure"] = True
        reasons = list(gpu.get("clockEventReasons", []))
        for value, old, reason in (
            (facts.thermal_violation, previous.thermal_violation if previous else None, THERMAL_REASON),
            (facts.power_violation, previous.power_violation if previous else None, POWER_REASON),
        ):
            if value is not None and old is not None and value > old and reason not in reasons:
                reasons.append(reason)
        if reasons or "clockEventReasons" in gpu:
            gpu["clockEventReasons"] = reasons
        # DCGM's XID field holds the last XID code; a new non-zero value is a new XID.
        old_xid = previous.last_xid if previous else None
        if facts.last_xid and facts.last_xid != old_xid:
            record_xid(index, facts.last_xid)


class DcgmSource:
    """Scrapes one dcgm-exporter; remembers the previous scrape to see what changed."""

    def __init__(self, url: str, timeout_seconds: float = 2.0) -> None:
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.previous: dict[int, GpuFacts] = {}
        self.failures = 0

    def scrape(self) -> dict[int, GpuFacts] | None:
        """Facts by GPU index, or None when the exporter cannot be read (counted, logged)."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_seconds) as response:
                text = response.read().decode("utf-8", errors="replace")
            return parse_text(text)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.failures += 1
            log.warning("dcgm-exporter at %s unreachable or unreadable: %s", self.url, exc)
            return None

    def apply(self, gpus: list[status.GPUStatus], record_xid: Callable[[int, int], None]) -> bool:
        """Scrape and fold into `gpus`; False when the scrape failed."""
        facts = self.scrape()
        if facts is None:
            return False
        fold(gpus, facts, self.previous, record_xid)
        self.previous = facts
        return True
