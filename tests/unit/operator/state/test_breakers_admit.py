"""`Breakers.admit` is every selecting policy's breaker stepped by `current`, then `breaker.admit`.

An admission asks all of a node's selecting policies' breakers in one call (`state.breakers` asks
`decisions.breaker` once per policy). Held here equal to the former construction in
`state.admission` (copied below as the reference) on random breakers, limits and histories.
"""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

import breaker_strategies
from breaker_strategies import seconds
from gpuhealth_operator.decisions import breaker, model
from gpuhealth_operator.state import breakers


def reference_admit(
    owner: breakers.Breakers,
    node: str,
    asked: list[tuple[model.Policy, int, dict[str, datetime.datetime]]],
    now: datetime.datetime,
) -> bool:
    """`Admission._breakers_admit` as it was: `current` then `breaker.admit` per policy, kept if all admit."""
    decided = [
        breaker.admit(owner.current(p, selected, turned, now), node, now) for p, selected, turned in asked
    ]
    if not all(admitted for _, admitted in decided):
        return False
    for (p, _, _), (state, _) in zip(asked, decided, strict=True):
        owner.states[p.name] = state
    return True


_TIME = breaker_strategies.TIMES
_STATE = breaker_strategies.breakers(["n0", "n1"])
_POLICY = st.tuples(
    st.one_of(st.integers(0, 6), st.sampled_from(["5%", "50%", "100%", "3"])),  # maxNewUnhealthy
    st.sampled_from([60.0, 600.0]),  # window
    st.integers(0, 40),  # selected
    st.one_of(st.none(), _STATE),  # as kept before
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), _TIME, max_size=8),  # turned
)


@settings(max_examples=600, deadline=None)
@given(
    policies=st.lists(_POLICY, min_size=1, max_size=3),
    node=st.sampled_from(["n0", "n1"]),
    now=st.floats(0, 1500).map(seconds),
)
def test_one_call_for_every_breaker_admits_as_one_at_a_time(
    policies: list[tuple[int | str, float, int, breaker.Breaker | None, dict[str, datetime.datetime]]],
    node: str,
    now: datetime.datetime,
) -> None:
    fast, slow = breakers.Breakers(), breakers.Breakers()
    fast_asked, slow_asked = [], []
    for i, (limit, window, selected, state, turned) in enumerate(policies):
        policy = model.Policy(name=f"p{i}", breaker_max_new_unhealthy=limit, breaker_window_seconds=window)
        if state is not None:
            fast.states[policy.name] = slow.states[policy.name] = state
        fast_asked.append((policy, selected, dict(turned)))
        slow_asked.append((policy, selected, dict(turned)))
    assert fast.admit(node, fast_asked, now) == reference_admit(slow, node, slow_asked, now)
    assert fast.states == slow.states  # stepped and (when all admitted) the trial kept alike
    assert [t for _, _, t in fast_asked] == [t for _, _, t in slow_asked]  # pruned alike


def test_a_refusing_breaker_keeps_a_half_open_trial_unspent() -> None:
    """What a caller sees: one policy's open breaker refuses, and the other's half-open trial stays free."""
    now = seconds(0)
    half_open = breaker.Breaker(state=breaker.State.HALF_OPEN, since=now)
    opened = breaker.Breaker(state=breaker.State.OPEN, since=now)
    owner = breakers.Breakers(states={"a": half_open, "b": opened})
    asked = [(model.Policy(name=n, breaker_max_new_unhealthy=1), 20, {}) for n in ("a", "b")]
    assert not owner.admit("n0", asked, now)
    assert owner.states["a"].trial is None
    assert owner.admit("n0", asked[:1], now)
    assert owner.states["a"].trial == "n0"
