"""Random fleet circuit breakers and instants for the breakers' property tests (hypothesis)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from hypothesis import strategies as st

from gpuhealth_operator.decisions import breaker

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def seconds(value: float) -> datetime.datetime:
    """The instant `value` seconds after T0."""
    return T0 + datetime.timedelta(seconds=value)


TIMES = st.floats(-1500, 1500).map(seconds)
"""Instants 25 minutes either side of T0: before, inside and after the breakers' windows."""


def breakers(trials: Sequence[str]) -> st.SearchStrategy[breaker.Breaker]:
    """Breakers in any state, their half-open trial one of `trials` (or none)."""
    return st.builds(
        breaker.Breaker,
        state=st.sampled_from(list(breaker.State)),
        since=st.one_of(st.none(), TIMES),
        reason=st.sampled_from(["", "a storm"]),
        trial=st.one_of(st.none(), st.sampled_from(list(trials))),
        trial_at=st.one_of(st.none(), TIMES),
        reset_at=st.one_of(st.none(), TIMES),
    )
