"""Issue 46: storing the answer to our own status write takes over the older version's conditions that the
write left as they were (`kept_conditions.reuse`), rather than compacting and sharing each of fifteen again.

Held here equal to what the cache kept before (`_old_conditions`, the code it replaced, copied below): the
same values of the same types, item by item, KeptCondition where it was one and dict where it was one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.state import compaction, kept_conditions, records
from typed_values import typed

_TIMES = st.sampled_from(["2026-11-24T00:00:00Z", "2026-11-24T00:05:00.000000Z"])
_CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["Straggler", "XidCritical", "EccUncorrectable"]), "status": st.just("True")},
    optional={
        "lastTransitionTime": _TIMES,
        "reason": st.sampled_from(["Detected", "NotDetected"]),
        "message": st.sampled_from(["", "GPU 0: 1 uncorrectable volatile ECC error"]),
        # 1, 1.0 and True are equal in Python, not in a status: a kept 1 never stands for a written True.
        "observedGeneration": st.sampled_from([1, 2, 1.0, True]),
        "observedSince": _TIMES,
        "recoveringSince": st.one_of(_TIMES, st.just(["not", "a", "time"])),  # unhashable: compacted anew
        "note": st.just("a key we do not write"),  # kept as the dict it is
    },
)


def _old_condition(raw: object) -> object:
    """`records._condition` as it was: the condition's strings shared, then the condition (`kept`)."""
    if type(raw) is not dict:
        return raw
    shared = compaction.SHARED.each(raw)
    condition = kept_conditions.kept(shared, compaction.SHARED.one)
    return compaction.SHARED.mapping(shared) if condition is shared else condition


def _old_conditions(raw: object, older: records.GPUNodeRecord | None) -> object:
    """`records._conditions` before issue 46's reuse: every changed list's every item compacted again."""
    if not isinstance(raw, list):
        return raw
    if older is not None:
        kept = older.status.get("conditions")
        if kept is raw or (isinstance(kept, list) and kept_conditions.same(kept, raw)):
            return kept
    return [_old_condition(c) for c in raw]


def _new_conditions(raw: object, older: records.GPUNodeRecord) -> object:
    return kept_conditions.kept_list(raw, older.status.get("conditions"), compaction.SHARED)


def _record(conditions: list[dict[str, Any]]) -> records.GPUNodeRecord:
    body = {"metadata": {"name": "n0", "resourceVersion": "1"}, "status": {"conditions": conditions}}
    return records.gpunode_record(body)


@settings(max_examples=500, deadline=None)
@given(
    held=st.lists(_CONDITION, max_size=5),
    written=st.lists(st.one_of(_CONDITION, st.integers(0, 4)), max_size=6),
    forget=st.booleans(),
)
def test_the_conditions_kept_are_those_kept_before(
    held: list[dict[str, Any]], written: list[dict[str, Any] | int], forget: bool
) -> None:
    """The write holds some of the older conditions again (an index), in any order, and new ones."""
    older = _record([dict(c) for c in held])
    raw = [dict(held[c]) if isinstance(c, int) and c < len(held) else c for c in written]
    raw = [c for c in raw if not isinstance(c, int)]
    if forget:  # the shared table forgot what it held: the old way made new objects, not the older ones
        compaction.SHARED.table.clear()
    new = _new_conditions([dict(c) for c in raw], older)
    old = _old_conditions([dict(c) for c in raw], older)
    assert isinstance(new, list) and isinstance(old, list)
    assert new == old
    assert [type(c) for c in new] == [type(c) for c in old]
    # Item by item what the old way kept, or (where the shared table handed that way an equal condition
    # of other types, 1 for True) the written values themselves: never another type than both.
    assert all(typed(n) in (typed(o), typed(r)) for n, o, r in zip(new, old, raw, strict=True))
    kept = [c for c in older.status["conditions"] if type(c) is kept_conditions.KeptCondition]
    for item in new:  # what is taken over is the older version's own object
        if any(typed(item) == typed(c) for c in kept):
            assert any(item is c for c in kept)


def test_one_condition_changed_takes_over_the_other_fourteen() -> None:
    """The DBE pass's write: fifteen conditions, one of them now True."""
    held = [
        {
            "type": f"C{i:02d}",
            "status": "False",
            "reason": "NotDetected",
            "message": "",
            "observedGeneration": 1,
        }
        | {"lastTransitionTime": "2026-11-24T00:00:00.000000Z"}
        for i in range(15)
    ]
    older = _record(held)
    raw = [dict(c) for c in held]
    raw[3] = raw[3] | {
        "status": "True",
        "reason": "Detected",
        "lastTransitionTime": "2026-11-24T00:10:01.000000Z",
    }
    new = _new_conditions(raw, older)
    assert isinstance(new, list)
    kept = older.status["conditions"]
    assert [new[i] is kept[i] for i in range(15)] == [i != 3 for i in range(15)]
    assert new == raw


def test_reuse_names_for_each_decoded_condition_its_held_equal_or_none() -> None:
    held = [
        kept_conditions.kept({"type": "A", "status": "True"}, lambda key, value: value),
        {"type": "B", "status": "True", "note": "a dict, never taken over"},
    ]
    found = kept_conditions.reuse(
        held,
        [
            {"type": "B", "status": "True", "note": "a dict, never taken over"},
            {"type": "A", "status": "True"},
            {"type": "A", "status": "True", "x": 1},
            "garbage",
        ],
    )
    assert found == [None, held[0], None, None]
    assert found[1] is held[0]
