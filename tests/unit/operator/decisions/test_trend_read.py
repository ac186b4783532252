"""Issue 46: `Trends.read`, the memory of one report read in one call, answers as the memory asked per item.

The checks of every GPU used to ask `Trends.gpu` (and each `per_hour` of it) one GPU and one counter
at a time; `signals` now reads the report once. Held here equal to the per-item answers for every
path a predicate may ask (and one it never does), with and without the fleet's link cohorts, over
runs of reports whose counters creep, jump and reset, links go down, GPUs and NIC ports come and go.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import faults
from gpuhealth_operator.decisions import gpu_facts, trends
from gpuhealth_operator.state import compaction

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
MODEL = "NVIDIA H100 80GB HBM3"
GPU_PATHS = (*trends._GPU_COUNTERS, *faults.GPU_PEAKS, "temperatureCelsius")
NIC_PATHS = (*faults.NIC_COUNTERS, *faults.NIC_PEAKS, "port")
"""Every path tracked, and one that is not (None from both)."""

_COUNTER = st.one_of(st.none(), st.integers(0, 3), st.integers(4, 10**5))
_GPU = st.fixed_dictionaries(
    {
        "index": st.integers(0, 3),
        "model": st.sampled_from([MODEL, "NVIDIA A100-SXM4-80GB"]),
        "pcie": st.fixed_dictionaries({"aer": st.fixed_dictionaries({"nonFatal": _COUNTER})}),
        "nvlink": st.one_of(
            st.none(),
            st.sampled_from([16, 17, 18]).flatmap(
                lambda up: st.fixed_dictionaries(
                    {"linksUp": st.just(up), "linksDown": st.just(18 - up), "crcErrors": _COUNTER}
                )
            ),
        ),
        "ecc": st.fixed_dictionaries({"correctedVolatile": _COUNTER}),
        "remappedRows": st.one_of(st.none(), st.fixed_dictionaries({"correctable": _COUNTER})),
    },
    optional={"uuid": st.sampled_from(["GPU-a", "GPU-b", "GPU-c"])},
)
_NIC = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["mlx5_0", "mlx5_1"]),
        "port": st.just(1),
        "state": st.sampled_from(["ACTIVE", "DOWN", "INIT"]),
        "rateGbps": st.sampled_from([200, 400]),
        "symbolErrors": _COUNTER,
    }
)
_REPORT = st.tuples(
    st.lists(st.one_of(_GPU, st.none()), max_size=4),
    st.one_of(st.none(), st.lists(st.one_of(_NIC, st.just("not a port")), max_size=3)),
    st.sampled_from([1, 60, 600, 3600, 7200]),
)


@settings(max_examples=300, deadline=None)
@given(
    reports=st.lists(_REPORT, min_size=1, max_size=6),
    links=st.sampled_from([{}, {(MODEL, 18): 18}, {(MODEL, 18): 17, ("NVIDIA A100-SXM4-80GB", 18): 18}]),
    cached=st.booleans(),
)
def test_a_report_read_at_once_answers_as_each_gpu_and_port_asked_alone(
    reports: list[tuple[list[dict[str, Any] | None], list[Any] | None, int]],
    links: dict[trends.LinkCohort, int],
    cached: bool,
) -> None:
    """After each report, each GPU's and each port's answers, read with the others, are its own: peaks
    (with its cohort's links up) and rates per hour, None where nothing is tracked."""
    memory: trends.Trends | None = None
    at = NOW
    for number, (gpus, nics, gap) in enumerate(reports):
        at += datetime.timedelta(seconds=gap)
        decoded = json.loads(json.dumps({"gpus": gpus, "nics": nics}))  # as a watch event brings it
        listed = [compaction.compact_gpu(g) if cached and g is not None else g for g in decoded["gpus"]]
        ports = decoded["nics"]
        memory = trends.with_cohorts(trends.advance(memory, {"gpus": listed, "nics": ports}, at), links)
        read = memory.read(listed, ports)
        assert len(read.gpus) == len(listed)
        for gpu, answer in zip(listed, read.gpus, strict=True):
            if gpu is None:
                assert answer is faults.NO_TREND
                continue
            alone = memory.gpu(gpu)
            for path in GPU_PATHS:
                assert answer.most(path) == alone.most(path), (number, gpu, path)
                assert answer.per_hour(path) == alone.per_hour(path), (number, gpu, path)
        assert len(read.nics) == len(ports or [])
        for nic, answer in zip(ports or [], read.nics, strict=True):
            if not isinstance(nic, dict):
                assert answer is faults.NO_TREND
                continue
            alone = memory.nic(nic)  # type: ignore[arg-type]  # a port as the agent reports it
            for path in NIC_PATHS:
                assert answer.most(path) == alone.most(path), (number, nic, path)
                assert answer.per_hour(path) == alone.per_hour(path), (number, nic, path)


def test_a_report_that_lists_no_gpus_or_ports_reads_nothing() -> None:
    memory = trends.with_cohorts(trends.advance(None, {}, NOW), {(MODEL, 18): 18})
    assert memory.read(None, "nics") == trends.Read((), ())


@settings(max_examples=200, deadline=None)
@given(
    gpu=st.fixed_dictionaries(
        {},
        optional={
            "model": st.one_of(st.sampled_from([MODEL, ""]), st.integers(0, 1)),
            "nvlink": st.one_of(
                st.none(),
                st.just("NOT_SUPPORTED"),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "linksUp": st.one_of(st.integers(-1, 18), st.booleans(), st.just(17.0)),
                        "linksDown": st.one_of(st.integers(-1, 2), st.none()),
                    },
                ),
            ),
            "index": st.integers(0, 7),
        },
    )
)
def test_a_cached_gpus_link_cohort_is_the_reported_gpus(gpu: dict[str, Any]) -> None:
    """`link_member` reads cached facts in one C call (the key of every judgement asks it of each GPU):
    the cohort and links up of the GPU as reported, whatever is absent or malformed."""
    decoded = json.loads(json.dumps(gpu))
    cached = compaction.compact_gpu(decoded)
    assert type(cached) is gpu_facts.GPUFacts
    assert trends.link_member(cached) == trends.link_member(decoded)
