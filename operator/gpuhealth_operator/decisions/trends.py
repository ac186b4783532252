"""Trends: what the operator remembers of a node's earlier reports, for the conditions one report cannot show.

NvLinkDegraded, NicDegraded, PcieErrors and MemoryDegrading ask two questions of the past
(`faults.Trend`): the most a fact has been (NVLink links up, a NIC port's rate and whether it was
ACTIVE: `faults.GPU_PEAKS`, `faults.NIC_PEAKS`), and how fast a counter grew over the last
`faults.TREND_WINDOW_SECONDS` (the `counters` of their rows in `conditions.ROWS`).

The memory is bounded: per node, one `Track` per GPU (by UUID, else index) and per NIC port it
reports now (a GPU or port that vanished is forgotten); per counter, the points where its value
changed in the window plus the last one before it, at most MAX_POINTS (changes closer together are
merged into the newer value, which can only understate a rate). A counter that goes down (a GPU
reset, a reboot) starts over: a reset is no growth. Tracks alike (a healthy fleet's) are one shared
copy, so a node costs its memory little more than two small dicts. The memory lives with the cached GPUNode
(`cache.GPUNodeRecord.trends`) and is advanced once per agent report, timed by the operator's
clock; a restarted operator starts from nothing (as its first report, it can only fire what one
report shows). What a GPU's links should be is not this memory's alone: `Trends.links` holds what the
GPU's cohort across the fleet has up (`link_cohorts`, issue 45, item 7), read from the cluster.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import operator
import types
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Final, cast

from gpuhealth_api import conditions, faults, status, vocabulary
from gpuhealth_operator.compact import interning
from gpuhealth_operator.decisions import gpu_facts, model

Condition = vocabulary.Condition

WINDOW: Final = faults.TREND_WINDOW_SECONDS
MAX_POINTS: Final = 16
"""The most change points one counter keeps; closer than WINDOW / MAX_POINTS apart they merge."""
_SPACING: Final = WINDOW / MAX_POINTS
_GPU_COUNTERS: Final = tuple(p for paths in conditions.GPU_COUNTERS.values() for p in paths)
TREND_CONDITIONS: Final = frozenset(conditions.DEFAULT_THRESHOLDS)
"""The conditions whose rules may name a `threshold` of growth per hour."""

RESTART_WITH: Final[dict[str, tuple[str, ...]]] = {
    "nvlink.linksUp": faults.NVLINK_COUNTERS,
}
"""Counters that start over when another fact changes: the agent sums NVLink errors over the links that are
up, so a link going down takes its count out of the sum and coming back puts it in again: no growth."""

_GPU_FIELDS: Final = tuple(
    sorted({p.split(".", 1)[0] for p in (*_GPU_COUNTERS, *faults.GPU_PEAKS, *RESTART_WITH)})
)
"""The GPU fields the tracked paths read."""
_GPU_SOURCE: Final = operator.attrgetter(*_GPU_FIELDS)
"""Those fields of cached GPU facts (`gpu_facts.GPUFacts`), read in one C call: every report asks."""

Points = tuple[tuple[float, float], ...]
"""A counter's (time, value) change points, oldest first; the last value is the latest seen."""


@dataclasses.dataclass(frozen=True, slots=True)
class Track:
    """One GPU's or NIC port's remembered facts."""

    peaks: Mapping[str, float]
    counters: Mapping[str, Points]
    last: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The last value of each RESTART_WITH fact."""
    source: tuple[object, ...] = ()
    """The facts it was last advanced from (the top-level fields read): a report that leaves them equal
    (as nearly every report does; the cache shares equal nested facts, so most compare by identity)
    changes nothing and costs one comparison."""


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """`faults.Trend` of one Track, as of the report last tracked (`at`, seconds)."""

    track: Track
    at: float

    def most(self, path: str) -> float | None:
        return self.track.peaks.get(path)

    def per_hour(self, path: str) -> float | None:
        points = self.track.counters.get(path)
        if not points:
            return None
        start = self.at - WINDOW
        base = points[0][1]
        for time, value in points:
            if time > start:
                break
            base = value
        return (points[-1][1] - base) * 3600.0 / WINDOW


_LINK_SOURCE: Final = operator.attrgetter("nvlink", "model")
"""What `link_member` reads of cached GPU facts, in one C call (`expectations` asks it of every GPU)."""

LinkCohort = tuple[str, int]
"""GPUs that should have as many NVLinks up: the same model, the same number of links (up + down)."""
LINKS_UP: Final = "nvlink.linksUp"
MIN_COHORT_GPUS: Final = 2
"""A cohort of one GPU says nothing about it."""


def link_member(gpu: Mapping[str, object]) -> tuple[LinkCohort, int] | None:
    """The GPU's cohort and its links up; None without NVLink facts (no NVLink, NOT_SUPPORTED)."""
    if type(gpu) is gpu_facts.GPUFacts:
        nvlink, model_name = _LINK_SOURCE(gpu)  # `gpu_facts.ABSENT` for a field not reported
    else:
        nvlink, model_name = gpu.get("nvlink"), gpu.get("model")
    if not faults.is_mapping(nvlink) or not isinstance(model_name, str):
        return None
    links = cast("Mapping[str, object]", nvlink)  # is_mapping said so
    up, down = links.get("linksUp"), links.get("linksDown")
    if type(up) is not int or type(down) is not int or up < 0 or down < 0 or up + down == 0:
        return None
    return (model_name, up + down), up


def expected_links(counts: Mapping[int, int]) -> int | None:
    """The links up a cohort's GPUs should have: the count most of them report (a tie: the higher), from
    at least MIN_COHORT_GPUS GPUs; None with fewer. Not the highest: one GPU that reads more links than
    its peers (a board with a bridge among boards without) must not make all the others degraded."""
    if sum(counts.values()) < MIN_COHORT_GPUS:
        return None
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """A GPU's trend whose most links up is at least what its cohort has up (`link_cohorts`): a link
    reported down is down whatever this process saw before it."""

    trend: faults.Trend
    links_up: float

    def most(self, path: str) -> float | None:
        seen = self.trend.most(path)
        if path != LINKS_UP:
            return seen
        return self.links_up if seen is None else max(seen, self.links_up)

    def per_hour(self, path: str) -> float | None:
        return self.trend.per_hour(path)


_NO_COHORTS: Final[Mapping[LinkCohort, int]] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class Trends:
    """One node's memory: a Track per GPU key (`gpu_key`) and per NIC key (`nic_key`), as of `at`; and
    `links`, the links up each GPU cohort of the fleet should have (`with_cohorts`)."""

    at: float
    gpus: Mapping[str, Track]
    nics: Mapping[str, Track]
    links: Mapping[LinkCohort, int] = dataclasses.field(default_factory=lambda: _NO_COHORTS)

    def gpu(self, gpu: status.GPUStatus) -> faults.Trend:
        return self._gpu_trend(self.gpus.get(gpu_key(gpu)), self._expected(gpu))

    def nic(self, nic: status.Nic) -> faults.Trend:
        track = self.nics.get(nic_key(nic))
        return faults.NO_TREND if track is None else View(track, self.at)

    def expectations(self, gpus: object) -> tuple[int | None, ...]:
        """What `links` says of each GPU of `gpus`: part of the key of the signals judged from them."""
        if not self.links or not isinstance(gpus, list):
            return ()
        return tuple(self._expected(gpu) if isinstance(gpu, gpu_facts.MAPPINGS) else None for gpu in gpus)

    def read(self, gpus: object, nics: object) -> Read:
        """`gpu` of each GPU of a report and `nic` of each NIC port, answered as values
        (`faults.TrendValues`): one call per judgement, where every check asked every GPU's memory a
        counter at a time (issue 46). GPUs with one Track (a healthy node's are one, `_shared`) and one
        expectation share their answers."""
        answers: dict[tuple[int, int | None], faults.Trend] = {}
        found: list[faults.Trend] = []
        for gpu in gpus if isinstance(gpus, list) else ():
            if not isinstance(gpu, gpu_facts.MAPPINGS):
                found.append(faults.NO_TREND)
                continue
            key = gpu_key(cast("status.GPUStatus", gpu))  # read from the cluster: each field checked as read
            track, links_up = self.gpus.get(key), self._expected(gpu)
            answer = answers.get((id(track), links_up))
            if answer is None:
                trend = self._gpu_trend(track, links_up)
                answer = answers[id(track), links_up] = _values(trend, faults.GPU_PEAKS, _GPU_COUNTERS)
            found.append(answer)
        ports = [
            _values(self.nic(cast("status.Nic", nic)), faults.NIC_PEAKS, faults.NIC_COUNTERS)
            if isinstance(nic, dict)
            else faults.NO_TREND
            for nic in (nics if isinstance(nics, list) else ())
        ]
        return Read(tuple(found), tuple(ports))

    def _expected(self, gpu: Mapping[str, object]) -> int | None:
        """The links up `links` says the GPU's cohort has; None: no cohort known."""
        if not self.links:
            return None
        member = link_member(gpu)
        return self.links.get(member[0]) if member is not None else None

    def _gpu_trend(self, track: Track | None, links_up: int | None) -> faults.Trend:
        trend = faults.NO_TREND if track is None else View(track, self.at)
        return trend if links_up is None else Expected(trend, float(links_up))


@dataclasses.dataclass(frozen=True, slots=True)
class Read:
    """What a node's memory says of one report, read in one call (`Trends.read`)."""

    gpus: tuple[faults.Trend, ...]
    """`Trends.gpu` of each entry of `status.gpus`, as values, by position (NO_TREND: not a GPU)."""
    nics: tuple[faults.Trend, ...]
    """`Trends.nic` of each entry of `status.nics`, likewise."""


def _values(trend: faults.Trend, peaks: tuple[str, ...], counters: tuple[str, ...]) -> faults.Trend:
    """`trend`'s answers for the paths it tracks (a Track keeps no other: for the rest it answers None)."""
    if trend is faults.NO_TREND:
        return trend
    return faults.TrendValues(
        {path: most for path in peaks if (most := trend.most(path)) is not None},
        {path: rate for path in counters if (rate := trend.per_hour(path)) is not None},
    )


def with_cohorts(memory: Trends, links: Mapping[LinkCohort, int]) -> Trends:
    """`memory` judged against the fleet's link cohorts (`link_cohorts.LinkCohorts.expected`)."""
    if not links and not memory.links:
        return memory
    return dataclasses.replace(memory, links=links)


def gpu_key(gpu: status.GPUStatus) -> str:
    uuid = gpu.get("uuid")
    return uuid if isinstance(uuid, str) and uuid else f"#{gpu.get('index')}"


def nic_key(nic: status.Nic) -> str:
    return faults.nic_name(nic)


def _seconds(now: datetime.datetime) -> float:
    return now.timestamp()


_FIRST: dict[float, Points] = {}
"""The one-point series of each value (time 0: the first value counts as older than any window, since
growth is divided by the whole window anyway): a healthy fleet's counters share a handful of them."""


def _first(value: float) -> Points:
    if len(_FIRST) >= 4096:
        _FIRST.clear()
    return _FIRST.setdefault(value, ((0.0, value),))


def _series(points: Points | None, value: float, at: float) -> Points:
    if not points or value < points[-1][1]:
        return _first(value)  # new, or the counter went down: it starts over
    if value != points[-1][1]:
        if len(points) >= 2 and points[-1][0] > at - _SPACING:
            points = (*points[:-1], (points[-1][0], value))  # merged into the newer value
        else:
            points = (*points, (at, value))
    start = at - WINDOW
    first = 0
    while first + 1 < len(points) and points[first + 1][0] <= start:
        first += 1  # a point before the window that another before the window follows
    if first:
        points = points[first:]
    return points[-MAX_POINTS:]


def _track(  # noqa: PLR0917 - one GPU's or port's paths
    previous: Track | None,
    record: Mapping[str, object],
    peaks: tuple[str, ...],
    counters: tuple[str, ...],
    at: float,
    fields: tuple[str, ...] | None,
) -> Track | None:
    """`fields`: the top-level fields the paths read (None: the whole record, a NIC port).

    Only the paths under a field that moved since `previous.source` are read again (a creeping counter
    moves one field of a GPU's four): `previous` was advanced from those same values of the others, and
    advancing a path by the value it was last advanced by changes nothing a `View` answers (its peak
    is that value's at least, its series ends in it; only the points that slid out of the window stay
    until the path moves, which `View.per_hour` skips alike)."""
    if fields is None:
        source: tuple[object, ...] = (record,)
    elif fields is _GPU_FIELDS and type(record) is gpu_facts.GPUFacts:
        source = _GPU_SOURCE(record)  # in one C call (`gpu_facts.ABSENT` for a field not reported)
    else:
        source = tuple(map(record.get, fields))
    if previous is not None and previous.source == source:
        return previous
    if previous is not None and fields is not None and len(previous.source) == len(fields):
        moved = frozenset(
            field
            for field, now, then in zip(fields, source, previous.source, strict=True)
            if now is not then and now != then
        )
        if fields is _GPU_FIELDS and peaks is faults.GPU_PEAKS and counters is _GPU_COUNTERS:
            peaks, counters = _GPU_PATHS_MOVED[moved]
        else:
            peaks, counters = _paths_moved(moved, peaks, counters)
    new_peaks = dict(previous.peaks) if previous else {}
    new_counters = dict(previous.counters) if previous else {}
    new_last = dict(previous.last) if previous else {}
    for path, restarted in RESTART_WITH.items():
        if path not in peaks:  # first: a GPU whose links did not move reads no fact here
            continue
        value = faults.fact(record, path)
        if value is None:
            continue
        if new_last.get(path, value) != value:
            for counter in restarted:
                new_counters.pop(counter, None)
        new_last[path] = float(value)
    for path in peaks:
        value = faults.fact(record, path)
        counted = path != "rateGbps" or record.get("state") == faults.NIC_ACTIVE  # a down port's rate is none
        if value is not None and counted and value > new_peaks.get(path, float("-inf")):
            new_peaks[path] = float(value)
    for path in counters:
        value = faults.fact(record, path)
        if value is None:
            new_counters.pop(path, None)
        else:
            new_counters[path] = _series(new_counters.get(path), float(value), at)
    if not new_peaks and not new_counters:
        return None
    if (
        previous is not None
        and new_peaks == previous.peaks
        and new_counters == previous.counters
        and new_last == previous.last
    ):
        return previous
    return _shared(Track(new_peaks, new_counters, new_last, source))


def _field(path: str) -> str:
    """The top-level field a path reads (`ecc` of `ecc.correctedVolatile`)."""
    field = _FIELD_OF.get(path)
    return path.split(".", 1)[0] if field is None else field


_FIELD_OF: Final[Mapping[str, str]] = types.MappingProxyType(
    {path: path.split(".", 1)[0] for path in (*_GPU_COUNTERS, *faults.GPU_PEAKS, *RESTART_WITH)}
)
"""`_field` of each GPU path tracked, worked out once (asked per path of every GPU that moved)."""


def _paths_moved(
    moved: AbstractSet[str], peaks: tuple[str, ...], counters: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The peaks and counters under the fields that `moved`, and the counters a moved fact restarts
    (`RESTART_WITH`), wherever they are."""
    moved = set(moved)
    for path, restarted in RESTART_WITH.items():
        if _field(path) in moved:
            moved.update(map(_field, restarted))
    return tuple(p for p in peaks if _field(p) in moved), tuple(p for p in counters if _field(p) in moved)


_GPU_PATHS_MOVED: Final[Mapping[frozenset[str], tuple[tuple[str, ...], tuple[str, ...]]]] = (
    types.MappingProxyType(
        {
            frozenset(moved): _paths_moved(frozenset(moved), faults.GPU_PEAKS, _GPU_COUNTERS)
            for size in range(len(_GPU_FIELDS) + 1)
            for moved in itertools.combinations(_GPU_FIELDS, size)
        }
    )
)
"""`_paths_moved` of a GPU's tracked paths for every set of its fields that may move, worked out once."""


_TRACKS: Final = interning.Table(8192)
"""One copy of each Track many GPUs or ports hold alike (healthy ones: the same peaks, the same constant
counters)."""


def _shared(track: Track) -> Track:
    key = (*track.peaks.items(), None, *track.counters.items(), None, *track.last.items())  # not `source`
    return _TRACKS.one(key, track)


def advance(previous: Trends | None, facts: status.GPUNodeStatus, now: datetime.datetime) -> Trends:
    """The memory after a new agent report `facts`, received `now` (the operator's clock)."""
    at = _seconds(now)
    gpus: dict[str, Track] = {}
    for gpu in facts.get("gpus") or []:
        if isinstance(gpu, gpu_facts.MAPPINGS):
            key = gpu_key(gpu)
            track = _track(
                previous.gpus.get(key) if previous else None,
                gpu,
                faults.GPU_PEAKS,
                _GPU_COUNTERS,
                at,
                _GPU_FIELDS,
            )
            if track is not None:
                gpus[key] = track
    nics: dict[str, Track] = {}
    raw_nics = facts.get("nics")
    for nic in raw_nics if isinstance(raw_nics, list) else []:
        if isinstance(nic, dict):
            key = nic_key(nic)
            track = _track(
                previous.nics.get(key) if previous else None,
                nic,
                faults.NIC_PEAKS,
                faults.NIC_COUNTERS,
                at,
                None,
            )
            if track is not None:
                nics[key] = track
    return Trends(at, gpus, nics)


Thresholds = tuple[tuple[Condition, float], ...]
"""Per trend condition its rules name, their lowest `threshold` (hashable: a key of judged signals)."""


def thresholds(policy: model.Policy) -> Thresholds:
    """The growth per hour each trend condition of `policy` tolerates: its rules' lowest `threshold`
    (the most sensitive rule decides the condition, as the shortest forSeconds does)."""
    found: dict[Condition, float] = {}
    for rule in policy.rules:
        condition = rule.condition
        if isinstance(condition, Condition) and condition in TREND_CONDITIONS and rule.threshold is not None:
            found[condition] = min(rule.threshold, found.get(condition, rule.threshold))
    return tuple(sorted(found.items()))
