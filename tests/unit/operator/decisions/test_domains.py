"""Topology domains (`spec.topology.domains`): when a domain degrades, when it clears, what it marks."""

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import domains, model

Health = vocabulary.Health
CLIQUE = "nvidia.com/gpu.clique"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOLD = 60.0


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def rule(
    unhealthy: int | str = 5, action: vocabulary.Action = vocabulary.Action.LABEL
) -> model.TopologyDomain:
    return model.TopologyDomain(key=CLIQUE, unhealthy=unhealthy, action=action)


def clique(name: str, size: int, unhealthy: int, unknown: int = 0) -> list[domains.Member]:
    healths = [Health.UNHEALTHY] * unhealthy + [Health.UNKNOWN] * unknown
    healths += [Health.HEALTHY] * (size - len(healths))
    return [domains.Member(f"{name}-{i}", {CLIQUE: name}, h) for i, h in enumerate(healths)]


def test_threshold_int_and_percent_rounds_up_at_least_one() -> None:
    assert domains.threshold(5, 8) == 5
    assert domains.threshold("50%", 8) == 4
    assert domains.threshold("50%", 7) == 4  # 3.5 rounds up: half must really have failed
    assert domains.threshold("1%", 8) == 1
    assert domains.threshold("100%", 8) == 8
    assert domains.threshold("10%", 0) == 1
    assert domains.threshold("3", 8) == 3


def test_four_of_eight_is_nothing_five_degrades_every_member() -> None:
    assert domains.judge([rule()], clique("a", 8, 4), {}, HOLD, T0) == {}
    degraded = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    state = degraded[(CLIQUE, "a")]
    assert (state.unhealthy, state.nodes, state.threshold, state.since) == (5, 8, 5, T0)
    assert state.members == tuple(f"a-{i}" for i in range(8))
    assert domains.wanted_marks([degraded]) == {f"a-{i}": domains.Marks(label=True) for i in range(8)}


def test_nodes_without_the_label_form_no_domain_an_empty_value_is_one() -> None:
    loose = [domains.Member(f"n{i}", {}, Health.UNHEALTHY) for i in range(6)]
    assert domains.judge([rule(1)], loose, {}, HOLD, T0) == {}
    empty = [domains.Member(f"e{i}", {CLIQUE: ""}, Health.UNHEALTHY) for i in range(2)]
    assert set(domains.judge([rule(1)], loose + empty, {}, HOLD, T0)) == {(CLIQUE, "")}


def test_another_clique_is_untouched() -> None:
    degraded = domains.judge([rule()], clique("a", 8, 5) + clique("b", 8, 4), {}, HOLD, T0)
    assert set(degraded) == {(CLIQUE, "a")}
    assert not any(n.startswith("b-") for n in domains.wanted_marks([degraded]))


def test_clears_only_after_the_hold_below_the_threshold() -> None:
    degraded = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    recovering = domains.judge([rule()], clique("a", 8, 4), degraded, HOLD, at(10))
    assert recovering[(CLIQUE, "a")].recovering_since == at(10)
    held = domains.judge([rule()], clique("a", 8, 0), recovering, HOLD, at(69))
    assert held[(CLIQUE, "a")].since == T0
    assert domains.judge([rule()], clique("a", 8, 0), held, HOLD, at(70)) == {}


def test_back_at_the_threshold_restarts_the_hold() -> None:
    states = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    states = domains.judge([rule()], clique("a", 8, 4), states, HOLD, at(10))
    states = domains.judge([rule()], clique("a", 8, 5), states, HOLD, at(50))
    assert states[(CLIQUE, "a")].recovering_since is None
    states = domains.judge([rule()], clique("a", 8, 0), states, HOLD, at(60))
    states = domains.judge([rule()], clique("a", 8, 0), states, HOLD, at(119))
    assert (CLIQUE, "a") in states
    assert domains.judge([rule()], clique("a", 8, 0), states, HOLD, at(120)) == {}


def test_unknown_neither_degrades_nor_recovers() -> None:
    assert domains.judge([rule()], clique("a", 8, 4, unknown=4), {}, HOLD, T0) == {}
    states = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    states = domains.judge([rule()], clique("a", 8, 1, unknown=4), states, HOLD, at(10))
    assert states[(CLIQUE, "a")].recovering_since is None  # stale agents: cannot tell it recovered
    states = domains.judge([rule()], clique("a", 8, 1, unknown=4), states, HOLD, at(1000))
    assert (CLIQUE, "a") in states


def test_a_removed_rule_or_an_empty_domain_drops_at_once() -> None:
    states = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    assert domains.judge([], clique("a", 8, 5), states, HOLD, at(1)) == {}
    assert domains.judge([rule()], clique("b", 8, 0), states, HOLD, at(1)) == {}


def test_taint_marks_label_and_taint_and_overlapping_policies_union() -> None:
    label = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    taint = domains.judge([rule(action=vocabulary.Action.TAINT)], clique("a", 8, 5), {}, HOLD, T0)
    assert domains.wanted_marks([label, taint])["a-7"] == domains.Marks(label=True, taint=True)
    assert domains.wanted_marks([label, {}])["a-7"] == domains.Marks(label=True)
    assert domains.wanted_marks([{}, {}]) == {}


def test_transitions() -> None:
    states = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    changed = domains.transitions({}, states)
    assert [s.value for s in changed.degraded] == ["a"] and changed.recovered == ()
    assert domains.transitions(states, states) == domains.Transitions((), ())
    assert [s.value for s in domains.transitions(states, {}).recovered] == ["a"]


def test_status_round_trip_keeps_the_clocks() -> None:
    states = domains.judge([rule()], clique("a", 8, 5), {}, HOLD, T0)
    states = domains.judge([rule()], clique("a", 8, 3), states, HOLD, at(10))
    written = domains.to_status(states, limit=64)
    assert written == [
        {
            "key": CLIQUE,
            "value": "a",
            "action": "Label",
            "unhealthy": 3,
            "nodes": 8,
            "threshold": 5,
            "since": "2026-01-01T00:00:00.000000Z",
            "recoveringSince": "2026-01-01T00:00:10.000000Z",
        }
    ]
    restored = domains.from_status(written, [rule()])
    assert restored[(CLIQUE, "a")].since == T0
    assert restored[(CLIQUE, "a")].recovering_since == at(10)
    assert domains.from_status(written, []) == {}  # no rule for the key any more
    assert domains.from_status([{"key": CLIQUE, "value": "a"}, "junk", {"since": "x"}], [rule()]) == {}
    assert domains.from_status(None, [rule()]) == {}
    # Taken up after a restart: the hold goes on from the recorded clock.
    assert domains.judge([rule()], clique("a", 8, 0), restored, HOLD, at(70)) == {}


def test_status_is_bounded() -> None:
    members = [m for name in "abcdef" for m in clique(name, 2, 2)]
    states = domains.judge([rule(1)], members, {}, HOLD, T0)
    assert [i["value"] for i in domains.to_status(states, limit=3)] == ["a", "b", "c"]


# A domain's health over time: per step, seconds elapsed and the Unhealthy/Unknown count of 8 nodes.
STEPS = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=40.0),
        st.integers(min_value=0, max_value=8),
        st.integers(min_value=0, max_value=8),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, limit=st.integers(min_value=1, max_value=8))
def test_never_degrades_below_threshold_never_flaps_within_the_hold(
    steps: list[tuple[float, int, int]], limit: int
) -> None:
    """Properties over any history of one 8-node clique:
    - it degrades only on a sample with at least `limit` Unhealthy nodes;
    - every sample with at least `limit` Unhealthy nodes finds it degraded;
    - it clears only after samples below the threshold (Unknown included) spanning the whole hold.
    """
    states: dict[domains.DomainKey, domains.DomainState] = {}
    clock = 0.0
    below_since: float | None = None
    for elapsed, unhealthy, unknown_ in steps:
        clock += elapsed
        unknown = min(unknown_, 8 - unhealthy)
        below = unhealthy + unknown < limit
        before = (CLIQUE, "a") in states
        states = domains.judge([rule(limit)], clique("a", 8, unhealthy, unknown), states, HOLD, at(clock))
        now_degraded = (CLIQUE, "a") in states
        if not before and now_degraded:
            assert unhealthy >= limit
        if unhealthy >= limit:
            assert now_degraded
        if before and not now_degraded:
            assert below and below_since is not None and clock - below_since >= HOLD
        below_since = (below_since if below_since is not None else clock) if below else None
