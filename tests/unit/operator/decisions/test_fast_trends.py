"""Issue 52: the trend memory advanced field by field answers what the memory advanced whole answers.

`trends.advance` reads again only the paths under a GPU field that moved since the track was last
advanced (a creeping counter moves one of four). Held here equal to the code it replaced (copied below
as the slow path): every peak and every rate per hour a predicate may ask, after every report of random
runs whose counters creep, jump, reset and vanish, links go down and come back, GPUs come and go.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import faults
from gpuhealth_operator.decisions import trends
from gpuhealth_operator.state import compaction

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
PATHS = (*trends._GPU_COUNTERS, *faults.GPU_PEAKS)


def slow_track(previous: trends.Track | None, record: Mapping[str, object], at: float) -> trends.Track | None:
    """`trends._track` of a GPU as it was before (every path read again once any field moved)."""
    source = tuple(map(record.get, trends._GPU_FIELDS))
    if previous is not None and previous.source == source:
        return previous
    new_peaks = dict(previous.peaks) if previous else {}
    new_counters = dict(previous.counters) if previous else {}
    new_last = dict(previous.last) if previous else {}
    for path, restarted in trends.RESTART_WITH.items():
        value = faults.fact(record, path)
        if value is None or path not in faults.GPU_PEAKS:
            continue
        if new_last.get(path, value) != value:
            for counter in restarted:
                new_counters.pop(counter, None)
        new_last[path] = float(value)
    for path in faults.GPU_PEAKS:
        value = faults.fact(record, path)
        if value is not None and value > new_peaks.get(path, float("-inf")):
            new_peaks[path] = float(value)
    for path in trends._GPU_COUNTERS:
        value = faults.fact(record, path)
        if value is None:
            new_counters.pop(path, None)
        else:
            new_counters[path] = trends._series(new_counters.get(path), float(value), at)
    if not new_peaks and not new_counters:
        return None
    if (
        previous is not None
        and new_peaks == previous.peaks
        and new_counters == previous.counters
        and new_last == previous.last
    ):
        return previous
    return trends.Track(new_peaks, new_counters, new_last, source)  # not shared: its own copy


def slow_advance(
    previous: dict[str, trends.Track] | None, gpus: list[Any], at: float
) -> dict[str, trends.Track]:
    tracks: dict[str, trends.Track] = {}
    for gpu in gpus:
        key = trends.gpu_key(gpu)
        track = slow_track(previous.get(key) if previous else None, gpu, at)
        if track is not None:
            tracks[key] = track
    return tracks


_COUNTER = st.one_of(st.none(), st.integers(0, 3), st.integers(4, 10**5))
_GPU = st.fixed_dictionaries(
    {
        "index": st.integers(0, 2),
        "pcie": st.one_of(
            st.just({"generation": 5, "aer": {"nonFatal": 0}}),
            st.fixed_dictionaries(
                {"generation": st.sampled_from([4, 5]), "aer": st.fixed_dictionaries({"nonFatal": _COUNTER})}
            ),
        ),
        "nvlink": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "linksUp": st.sampled_from([16, 17, 18]),
                    "crcErrors": _COUNTER,
                    "replayErrors": st.sampled_from([0, 5]),
                }
            ),
        ),
        "ecc": st.fixed_dictionaries(
            {"correctedVolatile": _COUNTER, "correctedAggregate": st.sampled_from([7, 9])}
        ),
        "remappedRows": st.one_of(st.none(), st.fixed_dictionaries({"correctable": _COUNTER})),
        "temperatureCelsius": st.integers(30, 90),
    },
    optional={"uuid": st.sampled_from(["GPU-a", "GPU-b"])},
)
_REPORT = st.lists(_GPU, max_size=3)


@settings(max_examples=400, deadline=None)
@given(
    first=_REPORT,
    steps=st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.integers(0, 2), st.sampled_from(["pcie", "nvlink", "ecc", "remappedRows"]), _GPU)
            ),
            st.sampled_from([1, 60, 300, 1800, 3600, 7200]),
        ),
        max_size=12,
    ),
    cached=st.booleans(),
)
def test_trends_advanced_by_moved_fields_answer_as_trends_advanced_whole(
    first: list[dict[str, Any]],
    steps: list[tuple[list[tuple[int, str, dict[str, Any]]], int]],
    cached: bool,
) -> None:
    """Each report changes some fields of some GPUs (one field of a GPU moves, the others stay, as a
    creeping counter does); after each, every GPU's peaks and rates per hour are the slow path's."""
    gpus = [dict(g) for g in first]
    memory: trends.Trends | None = None
    slow: dict[str, trends.Track] | None = None
    at = NOW
    for number, (changes, gap) in enumerate([([], 0), *steps]):
        for place, field, source in changes:
            if place < len(gpus):
                gpus[place] = {**gpus[place], field: source[field]}
        at += datetime.timedelta(seconds=gap)
        decoded = json.loads(json.dumps(gpus))  # as a watch event brings it
        report = [compaction.compact_gpu(g) for g in decoded] if cached else decoded
        memory = trends.advance(memory, {"gpus": report}, at)
        slow = slow_advance(slow, report, at.timestamp())
        assert memory.gpus.keys() == slow.keys(), number
        for key, track in slow.items():
            fast, want = trends.View(memory.gpus[key], memory.at), trends.View(track, at.timestamp())
            for path in PATHS:
                assert fast.most(path) == want.most(path), (number, key, path)
                assert fast.per_hour(path) == want.per_hour(path), (number, key, path)
            assert memory.gpus[key].last == track.last
