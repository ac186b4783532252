"""`GPUNodeRecord.reads_like` compares two statuses in one identity-first pass (issue 52): the same
answer as the comparison it replaced (kept here as the reference), on random statuses."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.state import records

_VALUES = st.one_of(
    st.none(),
    st.integers(0, 3),
    st.text(max_size=2),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(
        st.sampled_from(["a", "b", "lastHeartbeatTime", "maxTemperatureCelsius"]),
        st.integers(0, 2),
        max_size=3,
    ),
)
_STATUS = st.dictionaries(
    st.sampled_from(["agent", "summary", "gpus", "nics", "health", "issues", "conditions", "action"]),
    _VALUES,
    max_size=6,
)


def _reference(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """The comparison before issue 52."""
    moving = records._MOVING_SAMPLES
    if any(new.get(k) != old.get(k) for k in new.keys() | old.keys() if k not in moving):
        return False
    return all(
        records._without(new.get(field), key) == records._without(old.get(field), key)
        for field, key in moving.items()
        if key is not None
    )


def _one_pass(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return records._same_but_samples(new, old) and all(
        records._same_without(new.get(field), old.get(field), key)
        for field, key in records._MOVING_SAMPLES.items()
        if key is not None
    )


@settings(max_examples=1500, deadline=None)
@given(new=_STATUS, old=_STATUS, shared=st.booleans())
def test_the_one_pass_comparison_answers_as_the_old_one(
    new: dict[str, Any], old: dict[str, Any], shared: bool
) -> None:
    if shared:  # most values of a real successor are its predecessor's very objects
        new = {**old, **{k: v for k, v in new.items() if k in ("agent", "summary")}}
    assert _one_pass(new, old) == _reference(new, old)
    assert _one_pass(old, new) == _reference(old, new)
