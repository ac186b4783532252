"""Optional DCGM facts from a dcgm-exporter beside the agent (`--dcgm-exporter-url`, or found
through the API with `--dcgm-exporter auto`: dcgm_discovery).

Where a dcgm-exporter already runs, DCGM knows things NVML polling misses
(an XID while our event thread was not watching, violation time counters).
We scrape its Prometheus text with prometheus_client's parser and fold five
fields into the same per-GPU facts. NVML stays authoritative: DCGM can only
add a fault (raise a count, set a flag, add a reason), never clear one. An
unreachable exporter is counted and logged; the NVML facts are reported as
usual.

Three rules keep DCGM from inventing faults:

- **GPUs by UUID.** DCGM's `gpu` label is DCGM's own index, which need not
  be NVML's; a record is folded into the NVML GPU with its `UUID`, and a
  record without one, or of a GPU NVML does not list, is left out.
- **The first value is a baseline.** `DCGM_FI_DEV_XID_ERRORS` is the GPU's
  *last* XID, kept until DCGM restarts: the value at the first scrape of a
  GPU is old news (an earlier agent counted it, and a repair may have cured
  it since), so only a change after that is a new XID. Otherwise every agent
  restart (a rollout) re-drained repaired nodes and undid human overrides.
- **One XID is counted once.** The same XID usually arrives twice, as an
  NVML event and, a collection later, as DCGM's new last XID. Each side's
  XIDs of the last MATCH_SECONDS are kept per GPU and code; an XID the other
  side already counted is dropped, whichever side saw it first.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Final

from prometheus_client import parser

from gpuhealth_agent import dcgm_discovery
from gpuhealth_api import status

log = logging.getLogger(__name__)

XID: Final = "DCGM_FI_DEV_XID_ERRORS"
DBE_VOLATILE: Final = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE: Final = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
THERMAL_VIOLATION: Final = "DCGM_FI_DEV_THERMAL_VIOLATION"
POWER_VIOLATION: Final = "DCGM_FI_DEV_POWER_VIOLATION"
FIELDS: Final = frozenset({XID, DBE_VOLATILE, ROW_REMAP_FAILURE, THERMAL_VIOLATION, POWER_VIOLATION})

COUNTER_SET: Final = "examples/gpu-operator/dcgm-exporter-counters.yaml"
"""The dcgm-exporter counter set that has every field in FIELDS (the stock one lacks three)."""

THERMAL_REASON: Final = "SwThermalSlowdown"
POWER_REASON: Final = "SwPowerCap"

MATCH_SECONDS: Final = 300.0
"""How long an XID one side (NVML event, DCGM) counted waits to be matched by the other's report of it.

Longer than dcgm-exporter's collection interval (30 s by default) with room for a slow scrape."""


@dataclasses.dataclass
class GpuFacts:
    uuid: str | None = None
    index: int | None = None
    """DCGM's index for the GPU (for logs only: NVML's may differ)."""
    last_xid: int | None = None
    dbe_volatile: int | None = None
    remap_failure: bool | None = None
    thermal_violation: float | None = None
    """Cumulative time (µs) the GPU was held back by thermal limits."""
    power_violation: float | None = None


def parse_text(text: str) -> dict[str, GpuFacts]:
    """DCGM facts by GPU UUID from dcgm-exporter's Prometheus text (records without a UUID left out)."""
    facts: dict[str, GpuFacts] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples <family>_total; dcgm-exporter's names have no suffix.
            name = sample.name if sample.name in FIELDS else sample.name.removesuffix("_total")
            uuid = sample.labels.get("UUID")
            if name not in FIELDS or not uuid:
                continue
            gpu = facts.setdefault(uuid, GpuFacts(uuid=uuid))
            with contextlib.suppress(ValueError):
                gpu.index = int(sample.labels.get("gpu", ""))
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
    gpus: list[status.GPUStatus], now_facts: dict[str, GpuFacts], before: dict[str, GpuFacts]
) -> list[tuple[status.GPUStatus, int]]:
    """Add DCGM's view to the NVML facts in place (matched by UUID); the XIDs DCGM saw change, by GPU.

    `before` is the previous scrape's facts: a GPU not in it has no XID change yet (its first
    value is the baseline, see the module docstring).
    """
    by_uuid = {g["uuid"]: g for g in gpus if g.get("uuid")}
    changed: list[tuple[status.GPUStatus, int]] = []
    for uuid, facts in now_facts.items():
        gpu = by_uuid.get(uuid)
        if gpu is None or gpu.get("lost", False):
            continue
        previous = before.get(uuid)
        if facts.dbe_volatile is not None:
            ecc = gpu.setdefault("ecc", {})
            ecc["uncorrectedVolatile"] = max(ecc.get("uncorrectedVolatile", 0), facts.dbe_volatile)
            _read(gpu, "ecc.uncorrectedVolatile")  # NVML could not read it; DCGM did
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
        # DCGM's XID field holds the last XID code; a new non-zero value after the baseline is a new XID.
        if previous is not None and facts.last_xid and facts.last_xid != previous.last_xid:
            changed.append((gpu, facts.last_xid))
    return changed


_ATTRIBUTE: Final = {
    XID: "last_xid",
    DBE_VOLATILE: "dbe_volatile",
    ROW_REMAP_FAILURE: "remap_failure",
    THERMAL_VIOLATION: "thermal_violation",
    POWER_VIOLATION: "power_violation",
}


def _value(facts: GpuFacts, field: str) -> object:
    value: object = getattr(facts, _ATTRIBUTE[field])
    return value


def _read(gpu: status.GPUStatus, path: str) -> None:
    """`path` has a value now: no longer one of the GPU's unreadable facts."""
    unreadable = [p for p in gpu.get("unreadable", []) if p != path]
    if unreadable:
        gpu["unreadable"] = unreadable
    else:
        gpu.pop("unreadable", None)


class _Counted:
    """XIDs one side counted recently, per (GPU UUID, code), each with when: the other side's match."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], collections.deque[float]] = {}

    def add(self, uuid: str, code: int, now: float) -> None:
        self._seen.setdefault((uuid, code), collections.deque()).append(now)

    def take(self, uuid: str, code: int, now: float) -> bool:
        """Whether one was counted within MATCH_SECONDS (and forget it: it is matched now)."""
        times = self._seen.get((uuid, code))
        while times and now - times[0] > MATCH_SECONDS:
            times.popleft()
        if not times:
            self._seen.pop((uuid, code), None)
            return False
        times.popleft()
        return True

    def expire(self, now: float) -> None:
        for key in [k for k, times in self._seen.items() if times and now - times[-1] > MATCH_SECONDS]:
            del self._seen[key]


class DcgmSource:
    """Scrapes one dcgm-exporter; remembers the previous scrape to see what changed (module docstring)."""

    def __init__(
        self,
        url: str | None = None,
        timeout_seconds: float = 2.0,
        *,
        locator: dcgm_discovery.Locator | None = None,
    ) -> None:
        if url is None and locator is None:
            raise ValueError("a dcgm-exporter URL or a locator is needed")
        self.url = url if url is not None else f"<{locator.describe() if locator else ''}>"
        """The URL last scraped (with a locator: the pod found, or what was looked for)."""
        self.locator = locator
        self._said: str | None = None
        """The last warning about the exporter's content (said once, not every collection)."""
        self.timeout_seconds = timeout_seconds
        self.previous: dict[str, GpuFacts] = {}
        self.failures = 0
        self.last_error: str | None = None
        """Why the last scrape failed (None after a good one): `check` says it."""
        self._by_nvml = _Counted()
        self._by_dcgm = _Counted()

    def scrape(self) -> dict[str, GpuFacts] | None:
        """Facts by GPU UUID, or None when the exporter cannot be read (counted, logged)."""
        if self.locator is not None:
            try:
                self.url = self.locator.url()
            except dcgm_discovery.NotFoundError as exc:
                self._failed(str(exc), f"no dcgm-exporter found: {exc}")
                return None
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_seconds) as response:
                text = response.read().decode("utf-8", errors="replace")
            facts = parse_text(text)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            if self.locator is not None:
                self.locator.forget()  # the pod may have been replaced: look it up again next time
            self._failed(str(exc), f"dcgm-exporter at {self.url} unreachable or unreadable: {exc}")
            return None
        self.last_error = None
        return facts

    def _failed(self, error: str, line: str) -> None:
        self.failures += 1
        self.last_error = error
        log.warning("%s", line)

    def _check_content(self, gpus: list[status.GPUStatus], facts: dict[str, GpuFacts]) -> None:
        """Say (once) when the exporter's facts cannot help: none of our GPUs, or fields not enabled."""
        ours = {g["uuid"] for g in gpus if g.get("uuid")} & set(facts)
        said: str | None = None
        if facts and not ours:
            said = (
                f"dcgm-exporter at {self.url} lists none of this node's GPUs ({len(facts)} others): "
                "nothing folded in (another node's exporter, or --backend sim)"
            )
        elif ours:
            missing = sorted(f for f in FIELDS if all(_value(facts[u], f) is None for u in ours))
            if missing:
                said = (
                    f"dcgm-exporter at {self.url} does not export {', '.join(missing)}: "
                    f"enable the counter set in {COUNTER_SET}"
                )
        if said is not None and said != self._said:
            log.warning("%s", said)
        self._said = said

    def claim_nvml_xid(self, uuid: str | None, code: int, now: float) -> bool:
        """Whether an XID from an NVML event is new, not one DCGM reported already (then it is dropped)."""
        if uuid is None:
            return True  # no GPU to match it by: count it
        if self._by_dcgm.take(uuid, code, now):
            return False
        self._by_nvml.add(uuid, code, now)
        return True

    def apply(
        self,
        gpus: list[status.GPUStatus],
        record_xid: Callable[[int, str, int], None],
        now: float,
    ) -> bool:
        """Scrape and fold into `gpus`; `record_xid(index, uuid, code)` gets each new XID (NVML's
        index and UUID of the GPU). False when the scrape failed."""
        facts = self.scrape()
        if facts is None:
            return False
        self._check_content(gpus, facts)
        for gpu, code in fold(gpus, facts, self.previous):
            uuid = gpu["uuid"]
            if self._by_nvml.take(uuid, code, now):
                log.debug("XID %d on GPU %s from DCGM was an NVML event already", code, uuid)
                continue
            self._by_dcgm.add(uuid, code, now)
            record_xid(gpu["index"], uuid, code)
        # A GPU missing from this scrape keeps its last facts: the next value it shows is compared
        # with them, not taken for a first one (a scrape that lists only some GPUs is no restart).
        self.previous = {**self.previous, **facts}
        self._by_nvml.expire(now)
        self._by_dcgm.expire(now)
        return True
