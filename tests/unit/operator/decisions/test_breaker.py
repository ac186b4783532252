"""The fleet circuit breaker: trips on a storm, half-opens after the window, closes by itself."""

import dataclasses
import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import breaker, model, policies
from gpunode_facts import verdict

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
WINDOW = 600.0
State = breaker.State


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def run(
    events: list[tuple[float, int]],
    limit: int = 2,
    window: float = WINDOW,
    held: list[datetime.datetime] | None = None,
) -> breaker.Breaker:
    """Step a closed breaker through (time, count) pairs; `held`: the held-back nodes (default: none,
    the storm's nodes recovered)."""
    state = breaker.Breaker()
    for seconds, count in events:
        state = breaker.step(state, count, limit, window, at(seconds), held=[] if held is None else held)
    return state


# --- the limit -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "selected", "limit"),
    [
        ("5%", 50, 2),
        ("5%", 100, 5),
        ("5%", 10, 1),
        ("5%", 0, 1),
        ("50%", 7, 3),
        (3, 50, 3),
        (0, 50, 1),
        ("4", 9, 4),
    ],
)
def test_the_limit_is_a_count_or_a_percent_rounded_down_and_never_below_one(
    value: int | str, selected: int, limit: int
) -> None:
    assert breaker.resolve_limit(value, selected) == limit


def test_new_unhealthy_counts_the_window_ending_now_and_skips_what_a_reset_forgave() -> None:
    turned = [at(0), at(100), at(599), at(700)]
    assert breaker.new_unhealthy(turned, at(600), WINDOW) == 3  # at(0) is exactly a window old: out
    assert breaker.new_unhealthy(turned, at(600), WINDOW, reset_at=at(100)) == 2
    assert breaker.new_unhealthy([], at(600), WINDOW) == 0


# --- closed ----------------------------------------------------------------------------------------------


def test_a_closed_breaker_admits_at_once_and_stays_closed_up_to_the_limit() -> None:
    state = run([(0, 1), (1, 2)])
    assert state.state is State.CLOSED
    assert breaker.admit(state, "n1", at(1)) == (state, True)


def test_one_more_than_the_limit_trips_it_and_says_why() -> None:
    state = run([(0, 1), (1, 2), (2, 3)])
    assert state.state is State.OPEN
    assert state.since == at(2)
    assert "3 selected GPU nodes turned Unhealthy in the last 10 min" in state.reason
    assert "maxNewUnhealthy=2" in state.reason
    assert state.paused
    assert breaker.admit(state, "n1", at(3)) == (state, False)


# --- open ------------------------------------------------------------------------------------------------


def test_open_stays_open_for_a_whole_window_even_when_calm() -> None:
    state = run([(0, 3), (599, 0)])
    assert state.state is State.OPEN


def test_open_stays_open_after_the_window_while_the_storm_goes_on() -> None:
    assert run([(0, 3), (600, 2)]).state is State.OPEN  # 2 is not below the limit 2
    assert run([(0, 3), (600, 5)]).state is State.OPEN


def test_a_storm_that_has_not_ended_keeps_it_open_after_the_window() -> None:
    """Issue 24: the storm's nodes stay Unhealthy, so none is new a window later; it must not half-open."""
    storm = [at(s) for s in range(-20, 0)]  # 20 nodes turned Unhealthy in the 20 s before it opened
    state = run([(0, 3), (660, 0), (6000, 0)], held=storm[2:])
    assert state.state is State.OPEN
    assert state.since == at(0)
    assert "has not ended: 18 of the selected GPU nodes" in state.reason
    assert keys.BREAKER_RESET_ANNOTATION in state.reason
    assert breaker.admit(state, "n", at(6001)) == (state, False)
    assert run([(0, 3), (660, 0)], held=storm[:3]).state is State.OPEN
    # No more than the limit still held back (what a closed breaker lets through at once): it has ended.
    assert run([(0, 3), (660, 0)], held=storm[:2]).state is State.HALF_OPEN


def test_faults_older_than_the_storm_do_not_hold_it_open() -> None:
    """Nodes that waited for the budget before the storm began are not the storm's."""
    older = [at(-601), at(-700), at(-5000)]
    assert run([(0, 3), (600, 0)], held=older).state is State.HALF_OPEN
    assert run([(0, 3), (600, 0)], held=[*older, at(-599), at(300)]).state is State.HALF_OPEN  # 2: the limit
    assert run([(0, 3), (600, 0)], held=[*older, at(-599), at(0), at(300)]).state is State.OPEN  # 3 of it


def test_the_storm_forgiven_by_a_reset_does_not_hold_it_open() -> None:
    state = breaker.Breaker(state=State.OPEN, since=at(0), reset_at=at(-1))
    held = [at(-10), at(-5), at(-2)]
    assert breaker.step(state, 0, 2, WINDOW, at(600), held=held).state is State.HALF_OPEN
    unforgiven = dataclasses.replace(state, reset_at=None)
    assert breaker.step(unforgiven, 0, 2, WINDOW, at(600), held=held).state is State.OPEN


def test_a_caller_that_cannot_tell_what_is_held_back_never_half_opens_it() -> None:
    """An admission steps it without the held-back nodes; the timer's step decides."""
    opened = run([(0, 3)])
    assert breaker.step(opened, 0, 2, WINDOW, at(700)) == opened
    assert breaker.step(opened, 0, 2, WINDOW, at(700), held=[]).state is State.HALF_OPEN


def test_after_the_window_a_calm_breaker_half_opens() -> None:
    state = run([(0, 3), (600, 1)])
    assert state.state is State.HALF_OPEN
    assert state.since == at(600)
    assert "admitting one node" in state.reason
    assert state.paused


# --- half-open -------------------------------------------------------------------------------------------


def test_half_open_admits_exactly_one_node_then_only_that_one() -> None:
    state = run([(0, 3), (600, 0)])
    state, first = breaker.admit(state, "a", at(601))
    assert first
    assert (state.trial, state.trial_at) == ("a", at(601))
    assert breaker.admit(state, "b", at(602))[1] is False
    assert breaker.admit(state, "a", at(602))[1] is True  # the trial's own retry


def test_half_open_closes_a_probe_after_the_trial_if_the_storm_did_not_return() -> None:
    state = run([(0, 3), (600, 0)])
    state, _ = breaker.admit(state, "a", at(610))
    assert breaker.step(state, 1, 2, WINDOW, at(669), held=[]).state is State.HALF_OPEN
    closed = breaker.step(state, 1, 2, WINDOW, at(670), held=[])
    assert closed.state is State.CLOSED
    assert closed.trial is None
    assert "resumed" in closed.reason
    assert breaker.admit(closed, "b", at(671))[1]


def test_half_open_without_a_trial_closes_a_probe_after_half_opening() -> None:
    state = run([(0, 3), (600, 0), (659, 0)])
    assert state.state is State.HALF_OPEN
    assert run([(0, 3), (600, 0), (660, 0)]).state is State.CLOSED


def test_half_open_trips_again_if_the_storm_returns() -> None:
    state = run([(0, 3), (600, 0)])
    state, _ = breaker.admit(state, "a", at(601))
    state = breaker.step(state, 3, 2, WINDOW, at(620), held=[])
    assert state.state is State.OPEN
    assert state.since == at(620)
    assert state.trial is None


def test_the_probe_is_never_longer_than_the_window() -> None:
    state = run([(0, 3), (10, 0)], window=10)
    assert state.state is State.HALF_OPEN
    state, _ = breaker.admit(state, "a", at(11))
    assert breaker.step(state, 0, 2, 10, at(21), held=[]).state is State.CLOSED


# --- reset -----------------------------------------------------------------------------------------------


def test_a_manual_reset_closes_it_and_forgives_the_storm_so_far() -> None:
    state = breaker.reset(at(30), "annotation gpuhealth.io/breaker-reset=now")
    assert state.state is State.CLOSED
    assert "reset by annotation" in state.reason
    turned = [at(s) for s in range(10)]
    count = breaker.new_unhealthy(turned, at(31), WINDOW, state.reset_at)
    assert breaker.step(state, count, 2, WINDOW, at(31)).state is State.CLOSED
    count = breaker.new_unhealthy([*turned, at(40), at(41), at(42)], at(43), WINDOW, state.reset_at)
    assert breaker.step(state, count, 2, WINDOW, at(43)).state is State.OPEN  # a new storm still trips


# --- the times nodes turned Unhealthy -------------------------------------------------------------------


def condition(kind: vocabulary.Condition, status: str, since: datetime.datetime) -> model.ConditionState:
    return model.ConditionState(
        type=kind, status=status, reason=kind.value, message="", last_transition_time=since
    )


def test_a_node_turned_unhealthy_when_its_first_fatal_condition_turned_true() -> None:
    Condition = vocabulary.Condition
    judged = dataclasses.replace(
        verdict(node="n"),
        health=vocabulary.Health.UNHEALTHY,
        conditions={
            Condition.XID_CRITICAL: condition(Condition.XID_CRITICAL, "True", at(50)),
            Condition.ECC_UNCORRECTABLE: condition(Condition.ECC_UNCORRECTABLE, "True", at(20)),
            Condition.GPU_LOST: condition(Condition.GPU_LOST, "False", at(5)),
            Condition.THERMAL_THROTTLED: condition(Condition.THERMAL_THROTTLED, "True", at(1)),
        },
    )
    assert breaker.turned_unhealthy(judged) == at(20)
    for health in (vocabulary.Health.HEALTHY, vocabulary.Health.DEGRADED, vocabulary.Health.UNKNOWN):
        assert breaker.turned_unhealthy(dataclasses.replace(judged, health=health)) is None


# --- the policy block ------------------------------------------------------------------------------------


def test_the_policy_defaults_are_5_percent_in_10_minutes() -> None:
    policy = policies.parse_policy("p", 1, {})
    assert (policy.breaker_max_new_unhealthy, policy.breaker_window_seconds) == ("5%", 600.0)
    policy = policies.parse_policy("p", 1, {"breaker": {"maxNewUnhealthy": 3, "windowSeconds": 60}})
    assert (policy.breaker_max_new_unhealthy, policy.breaker_window_seconds) == (3, 60.0)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"breaker": []}, "spec.breaker"),
        ({"breaker": {"maxNewUnhealthy": 0}}, "spec.breaker.maxNewUnhealthy"),
        ({"breaker": {"maxNewUnhealthy": "101%"}}, "spec.breaker.maxNewUnhealthy"),
        ({"breaker": {"maxNewUnhealthy": True}}, "spec.breaker.maxNewUnhealthy"),
        ({"breaker": {"windowSeconds": 0}}, "spec.breaker.windowSeconds"),
        ({"breaker": {"windowSeconds": 1.5}}, "spec.breaker.windowSeconds"),
        ({"breaker": {"windowSeconds": "10m"}}, "spec.breaker.windowSeconds"),
    ],
)
def test_a_bad_breaker_block_names_its_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field.replace('.', '[.]')}:"):
        policies.parse_policy("p", 1, spec)


# --- properties ------------------------------------------------------------------------------------------

moments = st.lists(
    st.tuples(st.floats(min_value=0, max_value=120, allow_nan=False), st.integers(min_value=0, max_value=20)),
    max_size=40,
)
"""Gaps between steps (seconds) and the count of new Unhealthy nodes at each."""


def walk(steps: list[tuple[float, int]], limit: int, window: float) -> list[breaker.Breaker]:
    state, now, seen = breaker.Breaker(), 0.0, []
    for gap, count in steps:
        now += gap
        state = breaker.step(state, count, limit, window, at(now), held=[])
        state, _ = breaker.admit(state, f"n{count}", at(now))
        seen.append(state)
    return seen


@settings(max_examples=300, deadline=None)
@given(moments, st.integers(min_value=1, max_value=10), st.sampled_from([10.0, 60.0, 600.0]))
def test_property_more_than_the_limit_is_never_closed_after_a_step(
    steps: list[tuple[float, int]], limit: int, window: float
) -> None:
    state, now = breaker.Breaker(), 0.0
    for gap, count in steps:
        now += gap
        state = breaker.step(state, count, limit, window, at(now))
        if count > limit:
            assert state.state is State.OPEN


@settings(max_examples=300, deadline=None)
@given(moments, st.integers(min_value=1, max_value=10), st.sampled_from([10.0, 60.0, 600.0]))
def test_property_transitions_follow_the_diagram(
    steps: list[tuple[float, int]], limit: int, window: float
) -> None:
    allowed = {
        (State.CLOSED, State.OPEN),
        (State.OPEN, State.HALF_OPEN),
        (State.HALF_OPEN, State.CLOSED),
        (State.HALF_OPEN, State.OPEN),
    }
    previous = breaker.Breaker()
    for state in walk(steps, limit, window):
        if state.state is not previous.state:
            assert (previous.state, state.state) in allowed
            assert state.since is not None and (previous.since is None or state.since >= previous.since)
        if state.state is State.HALF_OPEN and previous.state is State.OPEN:
            assert previous.since is not None and state.since is not None
            assert (state.since - previous.since).total_seconds() >= window
        previous = state


@settings(max_examples=300, deadline=None)
@given(moments, st.integers(min_value=1, max_value=10), st.sampled_from([10.0, 60.0, 600.0]))
def test_property_half_open_admits_at_most_one_node(
    steps: list[tuple[float, int]], limit: int, window: float
) -> None:
    state, now = breaker.Breaker(), 0.0
    admitted: set[str] = set()
    for i, (gap, count) in enumerate(steps):
        now += gap
        before = state.state
        state = breaker.step(state, count, limit, window, at(now), held=[])
        if state.state is not State.HALF_OPEN or before is not State.HALF_OPEN:
            admitted = set()
        for node in (f"a{i}", f"b{i}"):
            state, ok = breaker.admit(state, node, at(now))
            if ok and state.state is State.HALF_OPEN:
                admitted.add(node)
        assert len(admitted) <= 1
        assert state.state is not State.OPEN or not breaker.admit(state, "x", at(now))[1]


@settings(max_examples=200, deadline=None)
@given(moments, st.integers(min_value=1, max_value=10))
def test_property_deterministic_given_now(steps: list[tuple[float, int]], limit: int) -> None:
    assert walk(steps, limit, 60.0) == walk(steps, limit, 60.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=2_000_000), max_size=50),
    st.integers(min_value=0, max_value=2_000_000),
)
def test_property_the_count_matches_a_plain_filter(turned: list[int], now: int) -> None:
    """Times in milliseconds (datetime's resolution is a microsecond)."""
    expected = sum(1 for t in turned if now - WINDOW * 1000 < t)
    assert breaker.new_unhealthy([at(t / 1000) for t in turned], at(now / 1000), WINDOW) == expected


@settings(max_examples=300, deadline=None)
@given(moments, st.integers(min_value=1, max_value=10), st.sampled_from([10.0, 60.0, 600.0]))
def test_property_while_the_storm_holds_limit_nodes_back_it_never_leaves_open(
    steps: list[tuple[float, int]], limit: int, window: float
) -> None:
    """However much time passes and however calm, an open breaker with more than `limit` of its storm's
    nodes still held back stays open (until a human resets it)."""
    state, now = breaker.Breaker(), 0.0
    for gap, count in steps:
        now += gap
        storm = [at(now)] * (limit + 1) if state.state is State.OPEN else []  # the storm's, still Unhealthy
        before = state.state
        state = breaker.step(state, count, limit, window, at(now), held=storm)
        if before is State.OPEN:
            assert state.state is State.OPEN
