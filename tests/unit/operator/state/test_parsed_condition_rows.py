"""Issue 46: a node's stored conditions are parsed from rows read in one call (`kept_conditions.rows`,
`hysteresis.from_rows`), where each condition was read key by key across modules. Held here equal to the
parse it replaced (`_old_from_status`, copied below), on conditions as decoded, as kept and as garbage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import hysteresis, model, times
from gpuhealth_operator.state import compaction, kept_conditions

_CONDITIONS = frozenset(c.value for c in vocabulary.Condition)


def _old_state(item: Mapping[str, Any]) -> model.ConditionState | None:
    """`hysteresis._state` before issue 46's rows."""
    kind = item.get("type")
    if not isinstance(kind, str):
        return None
    condition: vocabulary.ConditionKey | None = (
        vocabulary.Condition(kind) if kind in _CONDITIONS else vocabulary.parse_node_condition(kind)
    )
    if condition is None:
        return None
    status, transition = item.get("status"), times.parse(item.get("lastTransitionTime"))
    if status not in ("True", "False", "Unknown") or transition is None:
        return None
    reason, message = item.get("reason"), item.get("message")
    return model.ConditionState(
        condition,
        str(status),
        reason if isinstance(reason, str) else "",
        message if isinstance(message, str) else "",
        transition,
        observed_since=times.parse(item.get("observedSince")),
        recovering_since=times.parse(item.get("recoveringSince")),
    )


def _old_from_status(items: object) -> dict[vocabulary.ConditionKey, model.ConditionState]:
    """`hysteresis.from_status` before issue 46's rows."""
    states: dict[vocabulary.ConditionKey, model.ConditionState] = {}
    if not isinstance(items, list | tuple):
        return states
    for item in items:
        state = _old_state(item) if isinstance(item, Mapping) else None
        if state is not None:
            states[state.type] = state
    return states


_TIMES = st.sampled_from(
    [
        "2026-11-24T00:00:00Z",
        "2026-11-24T00:05:00.250000Z",
        "2026-11-24T00:05:00+02:00",
        "2026-11-24T01:00",
        "soon",
        "",
        12,
        None,
    ]
)
_TEXT = st.one_of(st.sampled_from(["", "Detected", "GPU 0: 1 error"]), st.none(), st.integers(0, 3))
_CONDITION = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            [
                "EccUncorrectable",
                "ThermalThrottled",
                "XidCritical",
                "Bogus",
                "Node:KernelDeadlock=True",
                "Node:=x",
                "",
            ]
        ),
        "status": st.sampled_from(["True", "False", "Unknown", "Maybe", True]),
        "lastTransitionTime": _TIMES,
        "reason": _TEXT,
        "message": _TEXT,
        "observedGeneration": st.integers(1, 3),
        "observedSince": _TIMES,
        "recoveringSince": _TIMES,
        "note": st.just("a key we do not write"),
    },
)
_ITEM = st.one_of(_CONDITION, st.none(), st.integers(), st.just("x"), st.just(["a"]))


def _as_kept(items: list[object], how: list[int]) -> list[object]:
    """Each item as decoded, as the cache keeps it (KeptCondition where it can be), or a read-only view."""
    kept: list[object] = []
    for item, way in zip(items, how + [0] * len(items), strict=False):
        if isinstance(item, dict) and way == 1:
            kept.append(kept_conditions.kept(item, lambda key, value: value))
        elif isinstance(item, dict) and way == 2:
            kept.append(compaction.SHARED.mapping(item))
        else:
            kept.append(item)
    return kept


@settings(max_examples=600, deadline=None)
@given(items=st.lists(_ITEM, max_size=6), how=st.lists(st.integers(0, 2), max_size=6), tupled=st.booleans())
def test_conditions_parsed_from_rows_are_those_parsed_key_by_key(
    items: list[object], how: list[int], tupled: bool
) -> None:
    held: object = _as_kept(items, how)
    if tupled:
        held = tuple(held)  # type: ignore[arg-type]
    expected = _old_from_status(held)
    assert hysteresis.from_rows(kept_conditions.rows(held, hysteresis.FIELDS)) == expected
    assert hysteresis.from_status(held) == expected


@given(
    items=st.one_of(st.none(), st.just("conditions"), st.just({"type": "ThermalThrottled"}), st.integers())
)
def test_no_list_no_rows(items: object) -> None:
    assert kept_conditions.rows(items, hysteresis.FIELDS) == []
    assert hysteresis.from_status(items) == {}


def test_a_kept_condition_reads_as_its_dict_in_any_order_of_fields() -> None:
    raw = {"type": "EccUncorrectable", "status": "True", "lastTransitionTime": "2026-11-24T00:00:00Z"}
    kept = kept_conditions.kept(raw, lambda key, value: value)
    fields = ("recoveringSince", "lastTransitionTime", "type", "nothing", "status")
    assert kept_conditions.rows([kept], fields) == [tuple(map(raw.get, fields))]


def test_equal_conditions_of_two_nodes_parse_to_the_same_states() -> None:
    """Each parsed state is shared across the fleet: two nodes first judged alike hold one copy."""
    raw = [
        {"type": "EccUncorrectable", "status": "True", "lastTransitionTime": "2026-11-24T00:00:00Z"},
        {"type": "XidCritical", "status": "False", "lastTransitionTime": "2026-11-24T00:00:00Z"},
    ]
    first = kept_conditions.parsed([dict(c) for c in raw], compaction.SHARED)
    second = kept_conditions.parsed([dict(c) for c in raw], compaction.SHARED)
    assert dict(first) == dict(second) == _old_from_status(raw)
    assert all(first[key] is second[key] for key in first)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(_ITEM, max_size=6), how=st.lists(st.integers(0, 2), max_size=6))
def test_a_records_parsed_conditions_are_those_parsed_key_by_key(items: list[object], how: list[int]) -> None:
    """What `GPUNodeRecord.conditions` holds (`kept_conditions.parsed`): read-only, each state shared."""
    held = _as_kept(items, how)
    states = kept_conditions.parsed(held, compaction.SHARED)
    assert dict(states) == _old_from_status(held)
    assert all(state is compaction.SHARED.table[(type(state), state)] for state in states.values())
    assert not hasattr(states, "__setitem__")
