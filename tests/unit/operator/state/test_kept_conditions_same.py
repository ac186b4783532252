"""Issue 52: `kept_conditions.same`, asked of every report's fifteen conditions in one pass, answers as the
lists' own equality does (`list(held) == list(raw)`, each KeptCondition compared with its dict)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.state import kept_conditions

_TIMES = st.sampled_from(["2026-11-24T00:00:00Z", "2026-11-24T00:05:00Z"])
_CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["Straggler", "XidCritical"]), "status": st.sampled_from(["True", "False"])},
    optional={
        "lastTransitionTime": _TIMES,
        "reason": st.sampled_from(["Healthy", "Slow"]),
        "observedGeneration": st.integers(1, 2),
        "observedSince": _TIMES,
        "note": st.just("a key we do not write"),  # kept as the dict it is
    },
)


def _kept(raw: dict[str, Any]) -> object:
    return kept_conditions.kept(raw, lambda key, value: value)


@settings(max_examples=400, deadline=None)
@given(
    held=st.lists(_CONDITION, max_size=4),
    edits=st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.none(), st.just("extra"), _CONDITION)), max_size=3
    ),
    shorter=st.booleans(),
)
def test_same_answers_as_list_equality(
    held: list[dict[str, Any]], edits: list[tuple[int, dict[str, Any] | str | None]], shorter: bool
) -> None:
    """The decoded conditions are the held ones with some replaced, a key dropped or added, or one fewer."""
    raw = [dict(c) for c in held]
    for place, change in edits:
        if place < len(raw):
            if change is None:
                raw[place].pop("reason", None)
            elif change == "extra":
                raw[place]["note"] = "added"
            else:
                raw[place] = change
    if shorter and raw:
        raw.pop()
    kept = [_kept(c) for c in held]
    assert kept_conditions.same(kept, raw) == (list(kept) == list(raw))
    assert kept_conditions.same(kept, [dict(c) for c in held])
