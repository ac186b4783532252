"""The cache shares facts that many GPUs report alike, and sharing never changes a verdict's input."""

import copy
import datetime
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpunode_facts
from gpuhealth_api import faults
from gpuhealth_operator.decisions import gpu_facts, model, policies, signals
from gpuhealth_operator.state import cache, compaction
from gpuhealth_sim.backtest import traces

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)


def body(name: str, status: dict[str, Any], version: int = 1) -> dict[str, Any]:
    """A GPUNode as a watch event decodes it: every value a fresh object."""
    raw = {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(version)},
        "status": status,
    }
    decoded: dict[str, Any] = json.loads(json.dumps(raw))
    return decoded


def test_a_healthy_fleet_holds_one_copy_of_the_facts_its_gpus_share() -> None:
    store = cache.ClusterCache()
    observed = gpunode_facts.rfc3339(NOW)
    first, second = (
        store.put_gpunode(body(n, gpunode_facts.agent_status(observed=observed)), NOW) for n in ("a", "b")
    )
    gpu_a, gpu_b = first.status["gpus"][0], second.status["gpus"][3]
    for field in ("ecc", "remappedRows", "pcie", "xids", "clockEventReasons", "observedTime"):
        assert gpu_a[field] is gpu_b[field], field  # type: ignore[literal-required]
    assert gpu_a["uuid"] == second.status["gpus"][0]["uuid"]  # the test's UUIDs repeat per node
    assert first.status["summary"] is second.status["summary"]


def test_a_shared_value_keeps_its_type() -> None:
    """1 == True in Python; a fact reported as True on one node is not what another reported as 1."""
    store = cache.ClusterCache()
    failing = gpunode_facts.agent_status(overrides={0: {"remappedRows": {"failure": True}}})
    odd = gpunode_facts.agent_status(overrides={0: {"remappedRows": {"failure": 1}}})
    store.put_gpunode(body("a", failing), NOW)
    record = store.put_gpunode(body("b", odd), NOW)
    assert faults.row_remap_failure(record.status["gpus"][0]) is None
    assert record.status["gpus"][0]["remappedRows"]["failure"] == 1
    assert record.status["gpus"][0]["remappedRows"]["failure"] is not True


def test_one_nodes_fault_is_not_seen_on_another_that_shares_its_healthy_facts() -> None:
    store = cache.ClusterCache()
    observed = gpunode_facts.rfc3339(NOW)
    healthy = store.put_gpunode(body("a", gpunode_facts.agent_status(observed=observed)), NOW)
    faulty = store.put_gpunode(
        body(
            "b",
            gpunode_facts.agent_status(observed=observed, overrides={2: {"ecc": {"uncorrectedVolatile": 3}}}),
        ),
        NOW,
    )
    assert [faults.ecc_uncorrectable(g) for g in faulty.status["gpus"]][
        2
    ] == "3 uncorrectable volatile ECC errors"
    assert all(faults.ecc_uncorrectable(g) is None for g in healthy.status["gpus"])
    assert healthy.status["gpus"][2]["ecc"] == {
        "uncorrectedVolatile": 0,
        "correctedVolatile": 0,
        "correctedAggregate": 0,
    }


def test_the_table_forgets_rather_than_grows() -> None:
    """Heartbeat times come and go: the table holds at most its limit, and what it shared stays equal."""
    shared = compaction.SharedValues(limit=50)
    kept = []
    for i in range(1000):
        shared.check()
        kept.append(shared.value(f"2026-11-24T00:00:{i:06d}Z"))
    assert len(shared.table) <= 50
    assert kept == [f"2026-11-24T00:00:{i:06d}Z" for i in range(1000)]


def test_cached_gpu_facts_read_like_the_reported_dict() -> None:
    reported = gpunode_facts.healthy_gpu(3, observed="2026-11-24T00:00:00Z")
    facts = compaction.compact_gpu(json.loads(json.dumps(reported)))
    kept = {k: reported[k] for k in compaction.GPU_FIELDS if k in reported}
    kept["ecc"] = {"uncorrectedVolatile": 0, "correctedVolatile": 0, "correctedAggregate": 0}
    kept["remappedRows"] = {"failure": False, "pending": False, "correctable": 0, "uncorrectable": 0}
    kept["retiredPages"] = {"pending": False, "doubleBit": 0}
    kept["pcie"] = {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16}
    assert facts == kept and dict(facts) == kept and len(facts) == len(kept)
    assert facts["smClockMHz"] == 1980
    assert facts.get("throttledSince") is None and "throttledSince" not in facts
    assert facts.get("pciBusId") is None and "pciBusId" not in facts  # reported, not kept
    assert facts.get("keys") is None and facts.get("get", "absent") == "absent"  # a method's name is no field
    with pytest.raises(KeyError):
        facts["throttledSince"]
    with pytest.raises(AttributeError):
        facts.smClockMHz = 0  # type: ignore[attr-defined]
    assert copy.deepcopy(facts) is facts and pickle.loads(pickle.dumps(facts)) == facts
    assert compaction.compact_gpu(facts) is facts, (
        "already compact: nothing to do (a backtest's answers carry them)"
    )


def test_an_answer_carrying_cached_facts_stores_the_same_facts() -> None:
    """A backtest's in-memory cluster answers our status write with the GPUs as cached: same verdict input."""
    store = cache.ClusterCache()
    first = store.put_gpunode(body("n", gpunode_facts.agent_status()), now=NOW)
    answer = {"metadata": {"name": "n", "uid": "uid-n", "resourceVersion": "2"}, "status": dict(first.status)}
    answer["status"]["health"] = "Healthy"
    second = store.refresh_gpunode(answer, NOW)
    assert second is not None and second.resource_version == "2"
    assert second.status["gpus"] == first.status["gpus"]
    assert all(a is b for a, b in zip(second.status["gpus"], first.status["gpus"], strict=True))


def test_our_own_status_write_keeps_what_was_judged_of_the_report_and_a_new_report_is_judged_anew() -> None:
    """Fact signals are judged once per agent report: the answer to our status write (same report,
    our fields changed) keeps them; any change in what the agent wrote starts afresh."""
    store = cache.ClusterCache()
    report = gpunode_facts.agent_status()
    first = store.put_gpunode(body("n", report), now=NOW)
    first.fact_signals[(frozenset(), 8, (), ())] = {}  # judged (a key as `signals.FactSignals` has it)
    assert first.performance[1] == 1.0  # scored
    ours = body("n", {**report, "health": "Healthy", "action": "None"}, version=2)
    second = store.put_gpunode(ours, now=NOW)
    assert second.fact_signals is first.fact_signals
    assert second.performance is first.performance
    faulty = gpunode_facts.agent_status(overrides={3: {"ecc": {"uncorrectedVolatile": 1}}})
    faulty["agent"] = report["agent"]  # the same heartbeat: the GPUs alone tell the reports apart
    third = store.put_gpunode(body("n", {**faulty, "health": "Healthy"}, version=3), now=NOW)
    assert third.fact_signals == {} and third.fact_signals is not first.fact_signals


def condition(kind: str, state: str, since: str) -> dict[str, Any]:
    return {"type": kind, "status": state, "reason": kind, "message": "m", "lastTransitionTime": since}


def test_a_new_report_keeps_our_parsed_conditions_and_our_new_conditions_are_parsed_anew() -> None:
    store = cache.ClusterCache()
    ours = [condition("ThermalThrottled", "False", "2026-11-24T00:00:00Z")]
    first = store.put_gpunode(body("n", {**gpunode_facts.agent_status(), "conditions": ours}), now=NOW)
    parsed = first.conditions
    later = gpunode_facts.agent_status(heartbeat="2026-11-24T00:05:00Z")
    second = store.put_gpunode(body("n", {**later, "conditions": ours}, version=2), now=NOW)
    assert second.conditions is parsed  # the agent's report left our conditions as they were
    changed = [condition("ThermalThrottled", "True", "2026-11-24T00:06:00Z")]
    third = store.put_gpunode(body("n", {**later, "conditions": changed}, version=3), now=NOW)
    assert third.conditions is not parsed
    assert third.conditions[faults.Condition.THERMAL_THROTTLED].status == "True"


def test_our_conditions_are_held_once_per_node_and_their_words_once_per_fleet() -> None:
    """Fifteen conditions decoded afresh from every watch event were a third of what a node cost."""
    store = cache.ClusterCache()
    since = ["2026-11-24T00:00:00.000001Z", "2026-11-24T00:00:00.000002Z"]
    first, second = (
        store.put_gpunode(
            body(n, {**gpunode_facts.agent_status(), "conditions": [condition("Straggler", "False", t)]}), NOW
        )
        for n, t in zip(("a", "b"), since, strict=True)
    )
    mine, theirs = first.status["conditions"][0], second.status["conditions"][0]
    assert mine["lastTransitionTime"] == since[0] and theirs["lastTransitionTime"] == since[1]
    for field in ("type", "status", "reason", "message"):
        assert mine[field] is theirs[field], field  # type: ignore[literal-required]
    alike = store.put_gpunode(
        body(
            "c", {**gpunode_facts.agent_status(), "conditions": [condition("Straggler", "False", since[0])]}
        ),
        NOW,
    )
    assert alike.status["conditions"][0] is mine  # the same condition on another node: one dict
    report = gpunode_facts.agent_status(heartbeat="2026-11-24T00:05:00Z")
    again = store.put_gpunode(
        body("a", {**report, "conditions": [condition("Straggler", "False", since[0])]}, 2), NOW
    )
    assert again.status["conditions"] is first.status["conditions"]  # a report leaves them as they were
    assert again.status["agent"]["driverVersion"] is first.status["agent"]["driverVersion"]
    assert again.status["agent"]["lastHeartbeatTime"] == "2026-11-24T00:05:00Z"
    moved = store.put_gpunode(
        body("a", {**report, "conditions": [condition("Straggler", "True", since[1])]}, 3), NOW
    )
    assert moved.conditions[faults.Condition.STRAGGLER].status == "True"
    assert first.status["conditions"][0]["status"] == "False"  # shared dicts are never written to


def _judge(record: cache.GPUNodeRecord, *, known: bool) -> dict[faults.Condition, Any]:
    node = model.NodeView(name="n", labels={})
    return signals.raw_signals(
        record.status,
        node,
        policies.DEFAULT_CRITICAL_XIDS,
        NOW,
        known=record.fact_signals if known else None,
    )


def _report(heartbeat: str, overrides: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return gpunode_facts.agent_status(heartbeat=heartbeat, overrides=overrides)


def test_a_healthy_report_that_moves_clocks_keeps_the_signals_and_a_fault_is_judged_anew() -> None:
    """A healthy fleet's reports move clocks, temperatures and utilization: their healthy signals
    carry over. Anything a predicate could fire on is judged again."""
    store = cache.ClusterCache()
    first = store.put_gpunode(body("n", _report("2026-11-24T00:00:00Z", {})), now=NOW)
    _judge(first, known=True)
    moved = {
        i: {"smClockMHz": 1700 + i, "temperatureCelsius": 60 + i, "utilizationPercent": 97} for i in range(8)
    }
    second = store.put_gpunode(body("n", _report("2026-11-24T00:05:00Z", moved), 2), now=NOW)
    assert second.fact_signals == first.fact_signals and second.fact_signals is not first.fact_signals
    for version, fault in enumerate(
        (
            {"ecc": {"uncorrectedVolatile": 1}},
            {"temperatureCelsius": 95, "slowdownTemperatureCelsius": 90},
            {
                "utilizationPercent": 90,
                "pcie": {"generation": 3, "maxGeneration": 5, "width": 16, "maxWidth": 16},
            },
            {"clockEventReasons": ["HwPowerBrakeSlowdown"]},
            {"xids": [{"code": 79, "count": 1, "lastSeen": "2026-11-24T00:05:00Z"}]},
        ),
        start=1,
    ):
        _judge(second, known=True)
        faulty = store.put_gpunode(
            body("n", _report("2026-11-24T00:06:00Z", {3: fault}), 2 * version + 1), now=NOW
        )
        assert faulty.fact_signals == {}, fault
        assert any(s.present for s in _judge(faulty, known=True).values()), fault
        second = store.put_gpunode(
            body("n", _report("2026-11-24T00:07:00Z", moved), 2 * version + 2), now=NOW
        )


_FIELD_VALUES = {
    "smClockMHz": [0, 1410, 1980],
    "temperatureCelsius": [30, 87, 88, 120],
    "slowdownTemperatureCelsius": [87, None],
    "utilizationPercent": [0, 10, 11, 100, None],
    "pcie": [
        {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16},
        {"generation": 4, "maxGeneration": 5, "width": 16, "maxWidth": 16},
        {"generation": 5, "maxGeneration": 5, "width": 8, "maxWidth": 16},
        None,
    ],
    "ecc": [{"uncorrectedVolatile": 0}, {"uncorrectedVolatile": 2}, None],
    "remappedRows": [{"failure": False, "pending": False}, {"failure": False, "pending": True}],
    "xids": [[], [{"code": 48, "count": 1}], [{"code": 13, "count": 4}]],
    "recoveryAction": ["None", "GpuReset", None],
    "clockEventReasons": [[], ["SwPowerCap"], ["HwSlowdown"], ["SwThermalSlowdown"]],
    "lost": [False, True, None],
    "observedTime": ["2026-11-24T00:00:00Z", "2026-11-24T00:01:00Z"],
}


@settings(max_examples=300, deadline=None)
@given(
    changes=st.lists(
        st.tuples(
            st.integers(0, 7),
            st.sampled_from(sorted(_FIELD_VALUES)).flatmap(
                lambda k: st.tuples(st.just(k), st.sampled_from(_FIELD_VALUES[k]))
            ),
        ),
        max_size=6,
    ),
    dropped=st.booleans(),
    seen=st.sampled_from([None, 8, 9]),
)
def test_carried_signals_are_the_signals_judged_afresh(
    changes: list[tuple[int, tuple[str, Any]]], dropped: bool, seen: int | None
) -> None:
    """Whatever the next report changes, the signals the cache carries over are those judging it
    afresh would give: carrying them is a shortcut, never a different answer."""
    store = cache.ClusterCache()
    first = store.put_gpunode(body("n", _report("2026-11-24T00:00:00Z", {})), now=NOW)
    _judge(first, known=True)
    overrides: dict[int, dict[str, Any]] = {}
    for index, (field, value) in changes:
        overrides.setdefault(index, {})[field] = value
    report = _report("2026-11-24T00:05:00Z", overrides)
    if dropped:
        report["gpus"] = report["gpus"][:-1]
    if seen is not None:
        report["agent"]["maxGpuCountSeen"] = seen
    second = store.put_gpunode(body("n", report, 2), now=NOW)
    assert _judge(second, known=True) == _judge(second, known=False)


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 3000),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=30),
    st.lists(st.sampled_from(["SwPowerCap", "HwSlowdown"]), max_size=2),
    st.lists(st.fixed_dictionaries({"code": st.integers(1, 200), "count": st.integers(0, 5)}), max_size=2),
    st.dictionaries(
        st.sampled_from(
            ["uncorrectedVolatile", "failure", "pending", "generation", "maxGeneration", "other"]
        ),
        st.one_of(st.none(), st.booleans(), st.integers(0, 5)),
        max_size=4,
    ),
)
_KEYS = st.sampled_from([*compaction.GPU_FIELDS, "powerDrawWatts", "pciBusId"])


@settings(max_examples=400, deadline=None)
@given(
    base=st.dictionaries(_KEYS, _VALUES.filter(lambda v: v is not None), max_size=12),
    change=st.dictionaries(_KEYS, _VALUES, max_size=6),
)
def test_compacting_only_the_changed_fields_is_compacting_the_gpu(
    base: dict[str, Any], change: dict[str, Any]
) -> None:
    """A replay compacts only the fields a trace's patch changed (`recompact_gpu`): the facts must be
    those the operator would keep of the whole merged GPU (`compact_gpu`), whatever the patch holds."""
    merged = traces.merge_patch(base, change)
    changed = {k: merged.get(k, gpu_facts.ABSENT) for k in change}
    assert compaction.recompact_gpu(compaction.compact_gpu(base), changed) == compaction.compact_gpu(merged)


def test_kept_conditions_read_like_the_decoded_dicts_and_a_foreign_key_keeps_the_dict() -> None:
    """Conditions are held in slots (a sixth of a node's memory); every reader sees the dict it was."""
    store = cache.ClusterCache()
    ours = condition("Straggler", "False", "2026-11-24T00:00:00Z")
    pending = {
        **condition("ThermalThrottled", "False", "2026-11-24T00:00:00Z"),
        "observedSince": "2026-11-24T00:01:00Z",
    }
    foreign = {**condition("XidCritical", "False", "2026-11-24T00:00:00Z"), "note": "set by hand"}
    record = store.put_gpunode(
        body("n", {**gpunode_facts.agent_status(), "conditions": [ours, pending, foreign]}), NOW
    )
    kept = record.status["conditions"]
    assert [dict(c) for c in kept] == [ours, pending, foreign]
    assert kept == [ours, pending, foreign] and [ours, pending, foreign] == kept
    assert kept[1].get("observedSince") == "2026-11-24T00:01:00Z" and "recoveringSince" not in kept[1]
    assert kept[0].get("observedSince") is None and len(kept[0]) == len(ours)
    assert type(kept[2]) is dict and kept[2]["note"] == "set by hand"  # a key we do not write: kept whole
    assert kept[0] != {**ours, "note": "x"} and kept[0] != {**ours, "status": "True"}
    assert copy.deepcopy(kept[0]) == ours and pickle.loads(pickle.dumps(kept[0])) == ours
    with pytest.raises(AttributeError):
        kept[0].status = "True"  # type: ignore[attr-defined]
    assert set(record.conditions) == {
        faults.Condition.STRAGGLER,
        faults.Condition.THERMAL_THROTTLED,
        faults.Condition.XID_CRITICAL,
    }
    edited = [ours, {**pending, "observedSince": "2026-11-24T00:02:00Z"}, foreign]
    later = store.put_gpunode(body("n", {**gpunode_facts.agent_status(), "conditions": edited}, 2), NOW)
    assert later.status["conditions"] is not kept  # one field of one condition moved: held anew
    assert later.conditions[faults.Condition.THERMAL_THROTTLED].observed_since == datetime.datetime(
        2026, 11, 24, 0, 2, tzinfo=datetime.UTC
    )


def test_a_report_keeps_the_nodes_rest_only_while_our_health_and_action_are_as_they_were() -> None:
    store = cache.ClusterCache()
    healthy = {"health": "Healthy", "conditions": [condition("Straggler", "False", "2026-11-24T00:00:00Z")]}
    first = store.put_gpunode(body("n", {**gpunode_facts.agent_status(), **healthy}), NOW)
    assert first.at_rest
    report = gpunode_facts.agent_status(heartbeat="2026-11-24T00:05:00Z")
    assert store.put_gpunode(body("n", {**report, **healthy}, 2), NOW).at_rest
    acting = store.put_gpunode(body("n", {**report, **healthy, "action": "Cordon"}, 3), NOW)
    assert acting.status["conditions"] is first.status["conditions"] and not acting.at_rest
