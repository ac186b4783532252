"""Issue 46: a put into the cache asks each module once. The bulk calls it makes instead of a call per
list or field are held equal here to what the calls they replaced returned, on random values."""

from __future__ import annotations

import datetime
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import gpunode_facts
from gpuhealth_operator.compact.slotted import ABSENT
from gpuhealth_operator.decisions import clocks, due, gpu_facts, model
from gpuhealth_operator.state import cache, compaction, kept_conditions
from typed_values import typed

_NOW = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
_SCALAR = st.one_of(
    st.text(max_size=30), st.integers(-10, 2000), st.booleans(), st.floats(allow_nan=False), st.none()
)


@settings(max_examples=300, deadline=None)
@given(
    lists=st.lists(st.lists(_SCALAR, max_size=5), max_size=4),
    keyed=st.dictionaries(st.text(max_size=8), st.text(max_size=30), max_size=4),
)
def test_a_batch_is_the_values_of_each_list_and_the_mapping_of_shared_values(
    lists: list[list[Any]], keyed: dict[str, str]
) -> None:
    shared = compaction.SHARED
    got, mapping = shared.batch(lists, keyed)
    expected = [shared.values(raw) for raw in lists]
    assert got == expected
    assert all(
        a is b for mine, theirs in zip(got, expected, strict=True) for a, b in zip(mine, theirs, strict=True)
    )
    one_by_one = shared.mapping(dict(zip(keyed, shared.values(list(keyed.values())), strict=True)))
    assert mapping is one_by_one
    assert list(mapping.items()) == list(keyed.items())


def _old_compaction(raw: dict[str, Any]) -> dict[str, Any]:
    """What `records.gpunode_record` did of a status but its conditions before `compact_status`."""
    status = dict(raw)
    shared = compaction.SHARED
    gpus = status.get("gpus")
    if isinstance(gpus, list) and not all(type(g) is gpu_facts.GPUFacts for g in gpus):
        status["gpus"] = [compaction.compact_gpu(g) if isinstance(g, dict) else g for g in gpus]
    if type(status.get("agent")) is dict:
        status["agent"] = shared.each(status["agent"])
    present = [key for key in ("summary", "health", "issues", "action") if key in status]
    for key, value in zip(present, shared.values([status[key] for key in present]), strict=True):
        status[key] = value
    return status


_OVERRIDE = st.fixed_dictionaries(
    {},
    optional={
        "ecc": st.fixed_dictionaries({"uncorrectedVolatile": st.integers(0, 3)}),
        "temperatureCelsius": st.integers(20, 400),
        "xids": st.lists(st.integers(1, 200), max_size=2),
        "pcie": st.fixed_dictionaries({"aer": st.just({"fatal": 1})}),
    },
)


@settings(max_examples=150, deadline=None)
@given(
    overrides=st.dictionaries(st.integers(0, 3), _OVERRIDE, max_size=3),
    extra=st.fixed_dictionaries(
        {},
        optional={
            "health": st.sampled_from(["Healthy", "Unhealthy", "x" * 30]),
            "issues": st.sampled_from(["", "EccUncorrectable"]),
            "action": st.sampled_from(["None", "Cordoned"]),
            "straggler": st.just({"score": 1.0}),
            "gpus": st.just(["junk"]),
        },
    ),
    compacted=st.booleans(),
)
def test_a_status_compacted_in_one_call_is_the_status_compacted_field_by_field(
    overrides: dict[int, dict[str, Any]], extra: dict[str, Any], compacted: bool
) -> None:
    raw = {**gpunode_facts.agent_status(gpus=4, overrides=overrides), **extra}
    if compacted and isinstance(raw.get("gpus"), list):
        raw["gpus"] = [compaction.compact_gpu(g) if isinstance(g, dict) else g for g in raw["gpus"]]
    before = json.loads(json.dumps(raw, default=dict))
    got, expected = compaction.compact_status(raw), _old_compaction(raw)
    assert got == expected and list(got) == list(expected)
    for key, value in got.items():
        if key not in ("gpus", "agent"):
            assert value is expected[key]  # one copy across the fleet, as before
    assert json.loads(json.dumps(raw, default=dict)) == before  # the decoded status is left as it was


_CONDITION = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["EccUncorrectable", "XidCritical"]),
        "status": st.sampled_from(["True", "False"]),
    },
    optional={
        "reason": st.sampled_from(["Healthy", "EccUncorrectable"]),
        "message": st.text(max_size=30),
        "lastTransitionTime": st.sampled_from(["2026-01-05T00:00:00Z", "2026-01-05T00:10:01Z"]),
        "observedGeneration": st.integers(0, 3),
    },
)


@settings(max_examples=300, deadline=None)
@given(first=_CONDITION, second=_CONDITION)
def test_equal_kept_conditions_hash_alike(first: dict[str, Any], second: dict[str, Any]) -> None:
    a = kept_conditions.kept(first, lambda key, value: value)
    b = kept_conditions.kept(dict(reversed(list(second.items()))), lambda key, value: value)
    assert type(a) is kept_conditions.KeptCondition and a == first
    if a == b:
        assert hash(a) == hash(b)
    assert (a == b) == (first == second)


def _node(name: str, version: int, labels: dict[str, str], unschedulable: bool) -> dict[str, Any]:
    meta = {"name": name, "resourceVersion": str(version), "labels": labels}
    return {"metadata": meta, "spec": {"unschedulable": unschedulable}}


_EVENT = st.tuples(
    st.sampled_from(["node", "gpunode", "gone"]),
    st.sampled_from(["n0", "n1", "n2"]),
    st.dictionaries(
        st.sampled_from(["pool", "gpuhealth.io/exclude"]), st.sampled_from(["a", "true"]), max_size=2
    ),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(_EVENT, max_size=12))
def test_a_selection_kept_across_puts_is_the_one_built_from_the_cache(
    events: list[tuple[str, str, dict[str, str], bool]],
) -> None:
    """`put_node` selects only when the node's view changed: the selection it keeps is still the one a
    scan of the whole cache builds."""
    policy = model.Policy(name="p", match_labels={"pool": "a"})
    store = cache.ClusterCache()
    store.put_policy(policy)
    kept = store.selection(policy)
    for version, (kind, name, labels, unschedulable) in enumerate(events, 1):
        if kind == "node":
            store.put_node(_node(name, version, labels, unschedulable))
        elif kind == "gpunode":
            store.put_gpunode({"metadata": {"name": name, "resourceVersion": str(version)}}, _NOW)
        else:
            store.remove_gpunode(name)
    built = cache.Selection(policy)
    for record in store.nodes.values():
        built.update(record.view, record.view.name in store.gpunodes)
    assert (kept.selected, kept.unavailable) == (built.selected, built.unavailable)


def test_a_changed_gpunode_is_touched_and_expected_at_once() -> None:
    index, one_by_one = due.DueIndex(), due.DueIndex()
    index.take(0.0, 0.0), one_by_one.take(0.0, 0.0)
    index.changed("n0", 10.0)
    one_by_one.touch("n0")
    one_by_one.expect("n0", 10.0)
    assert index.take(0.0, 0.0) == one_by_one.take(0.0, 0.0) == {"n0"}
    assert index.take(11.0, 0.0) == one_by_one.take(11.0, 0.0) == {"n0"}
    index.changed("n0", None)
    assert index.take(20.0, 0.0) == {"n0"} and len(index) == 0


def test_the_answer_to_our_status_write_keeps_the_stale_limit_of_the_report_it_holds() -> None:
    """The stale limit reads the agent block alone: a version holding the same report takes it over, and
    it is the one `clocks.stale_limit` works out of that version."""
    store = cache.ClusterCache()
    report = gpunode_facts.agent_status(gpus=2, heartbeat="2026-01-05T00:00:00Z", heartbeat_seconds=30)
    first = store.put_gpunode({"metadata": {"name": "n0", "resourceVersion": "1"}, "status": report}, _NOW)
    limit = first.stale_limit
    ours = {**report, "health": "Unhealthy", "action": "Cordon"}
    answer = store.refresh_gpunode({"metadata": {"name": "n0", "resourceVersion": "2"}, "status": ours}, _NOW)
    assert answer is not None and answer is not first
    assert answer.held("stale_limit") == limit == clocks.stale_limit(answer.status) == 90.0


def _old_kept(raw: dict[str, Any]) -> object:
    """`kept_conditions._shared` of a condition whose strings are shared, before it keyed by values: the
    shape shared by itself (its own `__hash__` and `__eq__`), then the condition made of it."""
    if not raw.keys() <= kept_conditions._KEYS:
        return raw
    shape = kept_conditions.Shape(raw)
    try:
        hash(shape)
        hash(raw.get(kept_conditions.SINCE))
    except TypeError:
        return raw
    return _share(kept_conditions.KeptCondition(_share(shape), raw.get(kept_conditions.SINCE, ABSENT)))


def _share(value: Any) -> Any:
    """What `SharedValues.share` did: `value`, or an equal one of the same type the table holds."""
    return compaction.SHARED.table.setdefault((type(value), value), value)


_SHARED_CONDITION = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["EccUncorrectable", "XidCritical"]),
        "status": st.sampled_from(["True", "False"]),
    },
    optional={
        "lastTransitionTime": st.sampled_from(["2026-01-05T00:00:00Z", "2026-01-05T00:10:01Z"]),
        "observedGeneration": st.sampled_from([1, 2, 1.0, True]),
        "recoveringSince": st.one_of(st.just("2026-01-05T00:00:00Z"), st.just(["not", "a", "time"])),
        "note": st.just("a key we do not write"),
    },
)


@settings(max_examples=300, deadline=None)
@given(conditions=st.lists(_SHARED_CONDITION, min_size=1, max_size=6))
def test_a_condition_kept_by_its_values_is_the_one_kept_by_itself_of_its_own_types(
    conditions: list[dict[str, Any]],
) -> None:
    """Keyed by values and types, each condition is kept as before (equal, a KeptCondition where it was
    one), of the types written, and equal ones (and equal shapes) are one object."""
    shared = compaction.SHARED
    new = [kept_conditions.kept(shared.each(c), shared.one) for c in conditions]
    old = [_old_kept(shared.each(c)) for c in conditions]
    assert new == old == conditions
    assert [type(c) for c in new] == [type(c) for c in old]
    assert [typed(c) for c in new] == [typed(c) for c in conditions]
    again = [kept_conditions.kept(shared.each(dict(c)), shared.one) for c in conditions]
    kept = [(a, b) for a, b in zip(new, again, strict=True) if type(a) is kept_conditions.KeptCondition]
    assert all(a is b for a, b in kept)
    shapes = {}
    for condition, _ in kept:
        values = tuple(typed(condition[k]) if k in condition else None for k in kept_conditions.Shape.KEYS)
        assert shapes.setdefault(values, condition._shape) is condition._shape
