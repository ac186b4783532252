"""Issue 46: a verdict advances all its conditions in one call (`hysteresis.advance_all`), their messages
bounded in one (`text.bounded_each`), where it called `advance` and `bounded` per condition. Held here
equal, state for state and object for object, to that per-condition loop (`_old_advance`, copied below).
"""

from __future__ import annotations

import dataclasses
import datetime

import hypothesis
from hypothesis import strategies as st

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import hysteresis, model, text

Condition = vocabulary.Condition
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
_KINDS = (Condition.THERMAL_THROTTLED, Condition.ECC_UNCORRECTABLE, Condition.XID_CRITICAL)


def _old_advance(
    previous: model.ConditionState | None,
    signal: model.Signal,
    for_seconds: float,
    clear_seconds: float,
    now: datetime.datetime,
) -> model.ConditionState:
    """`hysteresis.advance` as it was, before its messages were bounded in one call."""
    if signal.present is None:
        state = hysteresis._unknown(previous, signal, now)
    elif signal.present:
        state = hysteresis._present(previous, signal, for_seconds, now)
    else:
        state = hysteresis._absent(previous, signal, clear_seconds, now)
    message = text.bounded(state.message, text.CONDITION_MESSAGE_MAX)
    return state if message == state.message else dataclasses.replace(state, message=message)


_MESSAGES = st.sampled_from(["a", "b", "x" * 2000, "tab\there", ""])
_STATE = st.builds(
    model.ConditionState,
    st.sampled_from(_KINDS),
    st.sampled_from([hysteresis.TRUE, hysteresis.FALSE, hysteresis.UNKNOWN]),
    st.sampled_from([hysteresis.DETECTED, hysteresis.NOT_DETECTED, hysteresis.PENDING]),
    _MESSAGES,
    st.just(T0),
    observed_since=st.sampled_from([None, T0]),
    recovering_since=st.sampled_from([None, T0]),
)


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(
    previous=st.lists(st.one_of(st.none(), _STATE), min_size=3, max_size=3),
    present=st.lists(st.sampled_from([True, False, None]), min_size=3, max_size=3),
    messages=st.lists(_MESSAGES, min_size=3, max_size=3),
    clocks=st.lists(
        st.tuples(st.sampled_from([0.0, 30.0]), st.sampled_from([0.0, 60.0])), min_size=3, max_size=3
    ),
    judged=st.lists(st.sampled_from(_KINDS), unique=True),
    seconds=st.integers(0, 120),
)
def test_all_conditions_advanced_at_once_are_those_advanced_one_by_one(
    previous: list[model.ConditionState | None],
    present: list[bool | None],
    messages: list[str],
    clocks: list[tuple[float, float]],
    judged: list[Condition],
    seconds: int,
) -> None:
    now = T0 + datetime.timedelta(seconds=seconds)
    held = {k: dataclasses.replace(s, type=k) for k, s in zip(_KINDS, previous, strict=True) if s is not None}
    raw = {k: model.Signal(k, p, m) for k, p, m in zip(_KINDS, present, messages, strict=True)}
    timing = {k: c for k, c in zip(_KINDS, clocks, strict=True)}
    order = tuple((k, *timing[k]) for k in judged)
    states = hysteresis.advance_all(held, raw, order, now)
    expected = {k: _old_advance(held.get(k), raw[k], f, c, now) for k, f, c in order}
    assert states == expected
    assert list(states) == list(expected)
    for k, state in states.items():  # a state carried over is the very object, as before
        assert (state is held.get(k)) == (expected[k] is held.get(k))
        assert hysteresis.advance(held.get(k), raw[k], *timing[k], now) == expected[k]


def test_bounded_each_is_bounded_one_by_one() -> None:
    values = ["ok", "x" * 50, "bell\a"]
    assert text.bounded_each(values, 20) == [text.bounded(v, 20) for v in values]
    assert text.bounded_each([], 20) == []
