"""Issue 52: the backtest's shortcuts in judging a report's facts answer what the plain judgement answers.

`faults.fact` splits each path once and knows the Mapping types it met; `signals.fact_signals` asks the
trend memory once per GPU and skips looking for unread facts when no GPU lists any. Each is held here
equal to the code it replaced (copied below as the slow path), on random reports, cached and decoded.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import gpunode_facts
from gpuhealth_api import conditions, faults, vocabulary
from gpuhealth_operator.compact import slotted
from gpuhealth_operator.decisions import model, policies, signals, trends
from gpuhealth_operator.state import cache, compaction

Condition = vocabulary.Condition
NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)


def slow_fact(record: Mapping[str, object], path: str) -> int | float | None:
    """`faults.fact` as it was before issue 52."""
    if path == "active":
        state = record.get("state")
        return None if not isinstance(state, str) else int(state == faults.NIC_ACTIVE)
    value: object = record
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=5)
)
_NESTED = st.recursive(
    _SCALARS,
    lambda inner: st.dictionaries(st.sampled_from(["aer", "nonFatal", "crcErrors", "linksUp", "x"]), inner),
    max_leaves=6,
)
_FIELDS = st.sampled_from(["nvlink", "pcie", "ecc", "remappedRows", "state", "active", "model"])
_PATHS = st.sampled_from(
    [*trends._GPU_COUNTERS, *faults.GPU_PEAKS, *faults.NIC_COUNTERS, *faults.NIC_PEAKS, "pcie.aer", "a.b.c"]
)


@settings(max_examples=400, deadline=None)
@given(record=st.dictionaries(_FIELDS, _NESTED, max_size=5), path=_PATHS, cached=st.booleans())
def test_a_fact_read_fast_is_the_fact_read_slowly(record: dict[str, Any], path: str, cached: bool) -> None:
    """Whatever the record holds (numbers, bools, strings, nested maps, as decoded or as cached)."""
    held: Mapping[str, Any] = compaction.compact_gpu(record) if cached else record
    fast, slow = faults.fact(held, path), slow_fact(held, path)
    assert fast == slow and type(fast) is type(slow)


@settings(max_examples=200, deadline=None)
@given(record=st.dictionaries(_FIELDS, _NESTED, max_size=5))
def test_a_cached_gpu_as_a_dict_is_the_dict_it_reads_like(record: dict[str, Any]) -> None:
    """What `fact_signals` reads (issue 46): the same keys, in the same order, with the same values."""
    held = compaction.compact_gpu(record)
    plain = held.as_dict()
    assert type(plain) is dict and plain == dict(held) and list(plain) == list(held)
    assert slotted.as_dicts([held, record, None]) == [plain, record, None]


def slow_fact_signals(
    facts: Mapping[str, Any],
    node: model.NodeView,
    rule_xids: frozenset[int],
    thresholds: trends.Thresholds,
    memory: trends.Trends | None,
) -> dict[Condition, model.Signal]:
    """`signals.fact_signals` as it was before issue 52: the memory asked per check, unread facts sought
    for every condition that found nothing."""
    found: dict[Condition, model.Signal] = {}
    gpus = facts["gpus"]
    limits = dict(thresholds)
    history = memory.gpu if memory is not None else faults.no_history
    for condition, check in conditions.gpu_checks(rule_xids, limits, history).items():
        if condition is not Condition.GPU_LOST:
            found[condition] = slow_per_gpu(condition, gpus, check)
    found[Condition.GPU_LOST] = signals._lost(facts, node, gpus)  # type: ignore[arg-type]
    threshold = conditions.threshold(limits, Condition.NIC_DEGRADED)
    nics = faults.nic_faults(facts.get("nics"), threshold, memory.nic if memory is not None else None)
    found[Condition.NIC_DEGRADED] = (
        model.Signal(Condition.NIC_DEGRADED, True, "; ".join(nics))
        if nics
        else signals._HEALTHY[Condition.NIC_DEGRADED]
    )
    return found


def slow_per_gpu(condition: Condition, gpus: list[Any], check: faults.GPUFault) -> model.Signal:
    """`signals._per_gpu` as it was before issue 52."""
    found = [f"{signals.gpu_name(g)}: {fault}" for g in gpus if (fault := check(g)) is not None]
    if not found:
        unread = signals._unread(condition, gpus)
        if unread:
            return model.Signal(condition, None, f"unknown: {unread}")
        return signals._HEALTHY[condition]
    return model.Signal(condition, True, "; ".join(found))


_GPU_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "pcie": st.fixed_dictionaries(
            {
                "generation": st.sampled_from([4, 5]),
                "maxGeneration": st.just(5),
                "width": st.just(16),
                "maxWidth": st.just(16),
                "aer": st.fixed_dictionaries({"nonFatal": st.integers(0, 400)}),
            }
        ),
        "nvlink": st.fixed_dictionaries(
            {"linksUp": st.integers(0, 18), "linksDown": st.integers(0, 2), "crcErrors": st.integers(0, 5000)}
        ),
        "ecc": st.fixed_dictionaries(
            {"uncorrectedVolatile": st.integers(0, 1), "correctedVolatile": st.integers(0, 900)}
        ),
        "unreadable": st.lists(
            st.sampled_from(["ecc", "pcie.aer", "nvlink", "temperatureCelsius"]), max_size=2
        ),
        "xids": st.lists(
            st.fixed_dictionaries({"code": st.sampled_from([13, 48, 79]), "count": st.just(1)}), max_size=1
        ),
    },
)
_REPORT = st.dictionaries(st.integers(0, 7), _GPU_CHANGES, max_size=8)
_NICS = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["mlx5_0", "mlx5_1"]),
            "port": st.just(1),
            "state": st.sampled_from(["ACTIVE", "INIT"]),
            "rateGbps": st.sampled_from([200, 400]),
            "symbolErrors": st.integers(0, 5000),
        }
    ),
    max_size=2,
)
"""A node's NIC ports (`status.nics`), their memory judged with the GPUs' (`trends.Trends.read`)."""


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(st.tuples(_REPORT, _NICS), min_size=1, max_size=4),
    threshold=st.sampled_from([(), ((Condition.PCIE_ERRORS, 10.0), (Condition.NVLINK_DEGRADED, 50.0))]),
    links=st.sampled_from([{}, {(gpunode_facts.MODEL, 18): 18}, {(gpunode_facts.MODEL, 18): 17}]),
    cached=st.booleans(),
)
def test_fact_signals_judged_fast_are_the_signals_judged_slowly(
    reports: list[tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]],
    threshold: trends.Thresholds,
    links: dict[trends.LinkCohort, int],
    cached: bool,
) -> None:
    """Reports in a row (counters that creep or jump, links down, facts the agent cannot read, NIC ports
    that slow down or leave ACTIVE), with the memory the cache advances and a fleet's link cohorts: the
    same signals, messages included."""
    store = cache.ClusterCache()
    node = model.NodeView(name="n", labels={})
    for minute, (overrides, nics) in enumerate(reports):
        status = gpunode_facts.agent_status(heartbeat=f"2026-11-24T00:{minute:02d}:00Z", overrides=overrides)
        status["nics"] = nics
        raw = json.loads(
            json.dumps(
                {"metadata": {"name": "n", "uid": "u", "resourceVersion": str(minute + 1)}, "status": status}
            )
        )
        record = store.put_gpunode(raw, now=NOW + datetime.timedelta(minutes=5 * minute))
        memory = trends.with_cohorts(record.memory, links)
        facts: Mapping[str, Any] = record.status if cached else raw["status"]
        fast = signals.fact_signals(facts, node, policies.DEFAULT_CRITICAL_XIDS, threshold, memory)
        slow = slow_fact_signals(facts, node, policies.DEFAULT_CRITICAL_XIDS, threshold, memory)
        assert fast == slow


_STEP = st.dictionaries(
    st.integers(0, 7),
    st.fixed_dictionaries(
        {},
        optional={
            "aer": st.integers(0, 60),
            "crc": st.integers(0, 4000),
            "corrected": st.integers(0, 900),
            "linksUp": st.sampled_from([16, 17, 18]),
            "generation": st.sampled_from([4, 5]),
            "unreadable": st.sampled_from([[], ["pcie.aer"], ["nvlink"]]),
            "temperature": st.sampled_from([42, 95]),
        },
    ),
    max_size=8,
)


def _creeping_gpu(base: dict[str, int], step: dict[str, Any]) -> dict[str, Any]:
    """A GPU's facts after `step`: counters grow by its increments (kept in `base`), the rest as given."""
    for counter in ("aer", "crc", "corrected"):
        base[counter] = base.get(counter, 0) + step.get(counter, 0)
    links = step.get("linksUp", 18)
    gpu: dict[str, Any] = {
        "pcie": {
            "generation": step.get("generation", 5),
            "maxGeneration": 5,
            "width": 16,
            "maxWidth": 16,
            "aer": {"nonFatal": base["aer"], "fatal": 0},
        },
        "nvlink": {"linksUp": links, "linksDown": 18 - links, "crcErrors": base["crc"]},
        "ecc": {"correctedVolatile": base["corrected"], "uncorrectedVolatile": 0},
        "temperatureCelsius": step.get("temperature", 42),
    }
    if step.get("unreadable"):
        gpu["unreadable"] = step["unreadable"]
    return gpu


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_STEP, min_size=1, max_size=5),
    gap=st.sampled_from([60, 300, 3600]),
    threshold=st.sampled_from([(), ((Condition.PCIE_ERRORS, 10.0), (Condition.NVLINK_DEGRADED, 50.0))]),
    links=st.sampled_from([{}, {(gpunode_facts.MODEL, 18): 18}]),
)
def test_signals_kept_over_creeping_counters_are_the_signals_judged_afresh(
    steps: list[dict[int, dict[str, Any]]],
    gap: int,
    threshold: trends.Thresholds,
    links: dict[trends.LinkCohort, int],
) -> None:
    """Reports in a row whose counters creep or jump (and links, link generation, unread facts and
    temperatures move): the fact signals the cache keeps for a new report (`signals.still_healthy` with
    the memory, issue 52) are the ones judging it afresh with its memory and the fleet's link cohorts
    gives, under every key kept. And a report judged unhealthy afresh never keeps healthy ones."""
    store = cache.ClusterCache()
    node = model.NodeView(name="n", labels={})
    counters: dict[int, dict[str, int]] = {}
    kept_any = False
    for number, step in enumerate([{}, *steps]):
        overrides = {i: _creeping_gpu(counters.setdefault(i, {}), step.get(i, {})) for i in range(8)}
        status = gpunode_facts.agent_status(heartbeat=f"2026-11-24T00:{number:02d}:00Z", overrides=overrides)
        raw = json.loads(
            json.dumps(
                {"metadata": {"name": "n", "uid": "u", "resourceVersion": str(number + 1)}, "status": status}
            )
        )
        record = store.put_gpunode(raw, now=NOW + datetime.timedelta(seconds=gap * number))
        memory = trends.with_cohorts(record.memory, links)
        kept = record.held("fact_signals")
        if kept is not cache.UNSET and kept:
            kept_any = True
            for (rule_xids, _, thresholds, _), judged in kept.items():
                assert judged == signals.fact_signals(record.status, node, rule_xids, thresholds, memory)
        fresh = signals.raw_signals(
            record.status, node, policies.DEFAULT_CRITICAL_XIDS, NOW, thresholds=threshold, memory=memory
        )
        known = signals.raw_signals(
            record.status,
            node,
            policies.DEFAULT_CRITICAL_XIDS,
            NOW,
            known=record.fact_signals,
            thresholds=threshold,
            memory=memory,
        )
        assert known == fresh
    del kept_any  # some runs keep none (a fault in the first report): each that keeps is checked
