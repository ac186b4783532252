"""Issue 52: a breaker stepped on the timer's shortcuts is the breaker stepped in full.

`Breakers.current` keeps `resolve_limit` per (maxNewUnhealthy, selected), prunes only a non-empty map, and
does not call `breaker.step` for a closed breaker within its limit (`step` returns that very breaker);
`pausing.announce` gathers the held-back nodes only for an open breaker (`step` reads them for no other).
Held here equal to the code before (copied below as the reference) on random breakers and histories.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Collection, MutableMapping

from hypothesis import given, settings
from hypothesis import strategies as st

import breaker_strategies
from breaker_strategies import seconds
from gpuhealth_operator.decisions import breaker, model
from gpuhealth_operator.state import breakers


def reference_current(
    owner: breakers.Breakers,
    policy: model.Policy,
    selected: int,
    turned: MutableMapping[str, datetime.datetime],
    now: datetime.datetime,
    held: Collection[datetime.datetime] | None = None,
) -> breaker.Breaker:
    """`Breakers.current` as it was before its shortcuts."""
    state = owner.states.get(policy.name, breaker.Breaker())
    limit = breaker.resolve_limit(policy.breaker_max_new_unhealthy, selected)
    if state.state is breaker.State.CLOSED and limit >= selected:
        return state
    before = now - datetime.timedelta(seconds=policy.breaker_window_seconds)
    for node in [n for n, t in turned.items() if t <= before]:
        del turned[node]
    count = breaker.new_unhealthy(turned.values(), now, policy.breaker_window_seconds, state.reset_at)
    state = breaker.step(state, count, limit, policy.breaker_window_seconds, now, held=held)
    owner.states[policy.name] = state
    return state


_TIME = breaker_strategies.TIMES
_STATE = breaker_strategies.breakers(["n1"])
_LIMIT = st.one_of(st.integers(0, 6), st.sampled_from(["5%", "50%", "100%", "3", "x"]))


@settings(max_examples=600, deadline=None)
@given(
    state=st.one_of(st.none(), _STATE),
    limit=_LIMIT,
    window=st.sampled_from([60.0, 600.0]),
    selected=st.integers(0, 40),
    turned=st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), _TIME, max_size=8),
    held=st.one_of(st.none(), st.lists(_TIME, max_size=6)),
    now=st.floats(0, 1500).map(seconds),
)
def test_a_breaker_stepped_on_the_shortcuts_is_the_breaker_stepped_in_full(
    state: breaker.Breaker | None,
    limit: int | str,
    window: float,
    selected: int,
    turned: dict[str, datetime.datetime],
    held: list[datetime.datetime] | None,
    now: datetime.datetime,
) -> None:
    policy = model.Policy(name="p", breaker_max_new_unhealthy=limit, breaker_window_seconds=window)
    fast, slow = breakers.Breakers(), breakers.Breakers()
    if state is not None:
        fast.states["p"] = slow.states["p"] = state
    fast_turned, slow_turned = dict(turned), dict(turned)
    got = fast.current(policy, selected, fast_turned, now, held)
    want = reference_current(slow, policy, selected, slow_turned, now, held)
    assert got == want
    assert fast.states == slow.states
    assert fast_turned == slow_turned


@settings(max_examples=400, deadline=None)
@given(
    state=_STATE.filter(lambda b: b.state is not breaker.State.OPEN),
    count=st.integers(0, 8),
    limit=st.integers(0, 6),
    held=st.lists(_TIME, max_size=6),
    now=st.floats(0, 1500).map(seconds),
)
def test_only_an_open_breaker_reads_the_nodes_held_back(
    state: breaker.Breaker, count: int, limit: int, held: list[datetime.datetime], now: datetime.datetime
) -> None:
    """Why `announce` gathers them (`pausing.held`) for an open breaker alone."""
    with_held = breaker.step(state, count, limit, 600.0, now, held=held)
    without = breaker.step(state, count, limit, 600.0, now, held=[])
    assert dataclasses.asdict(with_held) == dataclasses.asdict(without)
