"""Issue 46, second round: a GPUNode's conditions kept anew in one call to the shared values' table for
the list (`SharedValues.each_of`), each shape built from the values `kept` read already. Held here equal
to the way each condition was kept before, one call per condition (`_one_by_one`): same values of the
same types, a KeptCondition where it was one, and equal conditions one object."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.compact.slotted import ABSENT
from gpuhealth_operator.state import compaction, kept_conditions
from typed_values import typed

_TIMES = st.sampled_from(["2026-01-05T00:00:00Z", "2026-01-05T00:10:01.000000Z"])
_CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["Straggler", "XidCritical", "EccUncorrectable"])},
    optional={
        "status": st.sampled_from(["True", "False"]),
        "lastTransitionTime": _TIMES,
        "reason": st.sampled_from(["Detected", "NotDetected"]),
        "message": st.sampled_from(["", "GPU 0: 1 uncorrectable volatile ECC error"]),
        "observedGeneration": st.sampled_from([1, 2, 1.0, True]),  # equal in Python, not in a status
        "recoveringSince": st.one_of(_TIMES, st.just(["not", "a", "time"])),  # unhashable: as it is
        "note": st.just("a key we do not write"),  # kept as the dict it is
    },
)
_ITEM = st.one_of(_CONDITION, st.just("not a condition"))


def _one_by_one(raw: object) -> object:
    """How a condition was kept before: its strings shared (`each`), its shape `Shape(raw)`, both shared
    through the table's `one`, a call each."""
    if type(raw) is not dict:
        return raw
    values = compaction.SHARED.each(raw)
    if not values.keys() <= set(kept_conditions.Shape.KEYS) | {kept_conditions.SINCE}:
        return compaction.SHARED.mapping(values)
    try:
        hash(tuple(values.values()))
    except TypeError:
        return compaction.SHARED.mapping(values)
    shape = kept_conditions.Shape(values)
    in_order = tuple(values.get(k, ABSENT) for k in kept_conditions.Shape.KEYS)
    shape = compaction.SHARED.one((kept_conditions.Shape, in_order, tuple(map(type, in_order))), shape)
    since = values.get(kept_conditions.SINCE, ABSENT)
    condition = kept_conditions.KeptCondition(shape, since)
    key = (kept_conditions.KeptCondition, (since, *in_order), (type(since), *map(type, in_order)))
    return compaction.SHARED.one(key, condition)


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(_ITEM, max_size=8))
def test_a_list_kept_anew_is_each_condition_kept_one_by_one(raw: list[Any]) -> None:
    new = kept_conditions.kept_list(raw, None, compaction.SHARED)
    old = [_one_by_one(c) for c in raw]
    assert isinstance(new, list) and new is not raw
    assert new == old == raw
    assert [type(c) for c in new] == [type(c) for c in old]
    assert typed(new) == typed(raw)
    assert all(a is b for a, b in zip(new, old, strict=True) if type(a) is kept_conditions.KeptCondition)


@settings(max_examples=300, deadline=None)
@given(raw=_CONDITION.filter(lambda c: "note" not in c and type(c.get("recoveringSince")) is not list))
def test_a_shape_built_from_its_values_holds_the_slots_of_one_built_from_the_condition(
    raw: dict[str, Any],
) -> None:
    condition = kept_conditions.kept(raw, lambda key, value: value)
    assert type(condition) is kept_conditions.KeptCondition
    built, expected = condition._shape, kept_conditions.Shape(raw)
    assert type(built) is kept_conditions.Shape
    assert typed(list(kept_conditions.Shape._all(built))) == typed(list(kept_conditions.Shape._all(expected)))


@settings(max_examples=200, deadline=None)
@given(raws=st.lists(st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=30), st.integers()))))
def test_each_of_is_each_of_every_mapping(raws: list[dict[str, Any]]) -> None:
    shared = compaction.SHARED
    got = shared.each_of(raws)
    expected = [shared.each(raw) for raw in raws]
    assert typed(got) == typed(expected)
    assert all(
        a is b
        for mine, theirs in zip(got, expected, strict=True)
        for a, b in zip(mine.values(), theirs.values(), strict=True)
    )
