"""The fleet circuit breaker: a storm of new Unhealthy nodes pauses new disruptions.

A broken agent or driver rollout looks like many nodes turning Unhealthy at
once; draining each of them up to `maxUnavailable` would turn one bad release
into a fleet-wide drain. The breaker counts the selected GPU nodes that turned
Unhealthy within the policy's window and, when more than `maxNewUnhealthy` did,
opens: no new Cordon or Drain (nodes already cordoned stay, running drains go on).

It recovers by itself once the storm has ended, like a classic circuit breaker:

    Closed   --more than the limit new in the window-->   Open
    Open     --a window after opening, fewer than the limit new in the last window,
               and no more than the limit of the storm's nodes still held back Unhealthy-->  HalfOpen
    HalfOpen --one node admitted (the trial); PROBE later and no re-trip-->  Closed
    HalfOpen --more than the limit new in the window-->   Open
    any      --manual reset-->  Closed (nodes that turned Unhealthy before the reset no longer count)

"New in the window" alone cannot tell a storm that ended from one that goes
on: a bad driver rollout leaves its nodes Unhealthy, and a window later none
of them is new. So an open breaker also counts the storm's nodes it still
holds back (turned Unhealthy since the window before it opened, Unhealthy
now, wanting a cordon, drain or isolation not yet made); while more than
`limit` are, it stays open until a human resets it (annotation
gpuhealth.io/breaker-reset). Up to `limit` may be let go: a closed breaker
lets that many turn Unhealthy in a window and be acted on at once, so a small
storm (`limit` 1 on a fleet under 40 nodes at the default 5 %: two faults in
ten minutes) does not wait for a human because its second node is still faulty.

Pure: every function takes `now` and the times nodes turned Unhealthy, and
returns a new `Breaker`; the same inputs give the same state.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import re
from collections.abc import Iterable
from typing import Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, severity

DEFAULT_MAX_NEW_UNHEALTHY: Final = "5%"
DEFAULT_WINDOW_SECONDS: Final = 600.0
PROBE_SECONDS: Final = 60.0
"""How long a half-open breaker watches after its trial admission before it closes (at most one window)."""

_PERCENT = re.compile(r"^(\d{1,3})%$")


class State(enum.StrEnum):
    CLOSED = "Closed"
    OPEN = "Open"
    HALF_OPEN = "HalfOpen"


@dataclasses.dataclass(frozen=True)
class Breaker:
    """One policy's breaker at one instant."""

    state: State = State.CLOSED
    since: datetime.datetime | None = None
    """When it entered `state` (None: closed since the operator started)."""
    reason: str = ""
    """Why it is in `state`, in words (the Paused condition's message)."""
    trial: str | None = None
    """Half-open only: the one node admitted to probe whether the storm is over."""
    trial_at: datetime.datetime | None = None
    reset_at: datetime.datetime | None = None
    """The last manual reset: nodes that turned Unhealthy at or before it are not counted again."""

    @property
    def paused(self) -> bool:
        """Whether new disruptions are held back (all but the half-open trial)."""
        return self.state is not State.CLOSED


def resolve_limit(max_new_unhealthy: int | str, selected_count: int) -> int:
    """How many selected GPU nodes may turn Unhealthy within the window without tripping the breaker.

    A percent of the selected GPU nodes rounds down (the safe side: the breaker
    trips one node earlier), and the limit is never below 1, so on a small
    fleet a single fault is still acted on at once.
    """
    if isinstance(max_new_unhealthy, int):
        return max(1, max_new_unhealthy)
    match = _PERCENT.match(max_new_unhealthy)
    if match is None:
        return max(1, int(max_new_unhealthy)) if max_new_unhealthy.isdigit() else 1
    return max(1, math.floor(max(0, selected_count) * int(match.group(1)) / 100))


def turned_unhealthy(verdict: model.NodeVerdict) -> datetime.datetime | None:
    """When the node turned Unhealthy: the earliest transition to True of a fatal condition it holds.

    The transition times are kept in GPUNode status, so after an operator
    restart the first judgement gives the same times and a storm that began
    before the restart still counts. None when the node is not Unhealthy.

    Another tool's Node condition (a `nodeCondition` rule) makes a node Degraded, not Unhealthy, but
    when a Cordon or Drain rule fires on it the node counts too: a storm of them (a bad rollout of
    that tool) trips the breaker as a storm of ours does.
    """
    times: list[datetime.datetime] = []
    if verdict.health is vocabulary.Health.UNHEALTHY:
        times += (
            state.last_transition_time
            for condition, state in verdict.conditions.items()
            if condition in severity.FATAL and state.status == "True"
        )
    for rule in verdict.fired_rules:
        state = verdict.conditions.get(rule.condition)
        if (
            isinstance(rule.condition, vocabulary.NodeCondition)
            and rule.action in vocabulary.DISRUPTIVE_ACTIONS
            and state is not None
        ):
            times.append(state.last_transition_time)
    return min(times, default=None)


def new_unhealthy(
    turned: Iterable[datetime.datetime],
    now: datetime.datetime,
    window_seconds: float,
    reset_at: datetime.datetime | None = None,
) -> int:
    """How many of the times nodes turned Unhealthy (one per node) fall in the window ending now.

    A time in the future (a skewed clock) counts: the breaker errs towards pausing.
    """
    start = now - datetime.timedelta(seconds=window_seconds)
    return sum(1 for t in turned if t > start and (reset_at is None or t > reset_at))


def storm_held(
    held: Iterable[datetime.datetime],
    opened: datetime.datetime,
    window_seconds: float,
    reset_at: datetime.datetime | None = None,
) -> int:
    """How many of the held-back nodes (when each turned Unhealthy) belong to the storm that opened it.

    The storm's nodes turned Unhealthy within the window before it opened, or
    since: an older fault waiting for the budget is not the storm's.
    """
    return new_unhealthy(held, opened, window_seconds, reset_at)  # counts every time after the window's start


def step(
    breaker: Breaker,
    count: int,
    limit: int,
    window_seconds: float,
    now: datetime.datetime,
    *,
    held: Iterable[datetime.datetime] | None = None,
) -> Breaker:
    """The breaker after time has passed: `count` nodes turned Unhealthy in the window ending `now`.

    `held`: when each node the policy holds back turned Unhealthy (Unhealthy now,
    wanting a cordon or drain not yet made). None when the caller cannot tell:
    an open breaker then stays open (the timer's next step decides).
    """
    probe = min(PROBE_SECONDS, window_seconds)
    window = _words(window_seconds)
    if breaker.state is State.CLOSED or breaker.state is State.HALF_OPEN:
        if count > limit:
            return dataclasses.replace(
                breaker,
                state=State.OPEN,
                since=now,
                trial=None,
                trial_at=None,
                reason=(
                    f"{count} selected GPU nodes turned Unhealthy in the last {window}, more than "
                    f"maxNewUnhealthy={limit}: a fault storm (often a bad agent or driver rollout), "
                    "so no new node is cordoned or drained"
                ),
            )
        if breaker.state is State.HALF_OPEN:
            started = breaker.trial_at or breaker.since or now
            if _seconds(started, now) >= probe:
                return dataclasses.replace(
                    breaker,
                    state=State.CLOSED,
                    since=now,
                    trial=None,
                    trial_at=None,
                    reason=(
                        f"resumed: {count} selected GPU nodes turned Unhealthy in the last {window} "
                        f"(maxNewUnhealthy={limit})"
                    ),
                )
        return breaker
    # Open: half-open once a whole window has passed since it opened and the storm has ended.
    opened = breaker.since or now
    if _seconds(opened, now) < window_seconds or count >= limit or held is None:
        return breaker
    still = storm_held(held, opened, window_seconds, breaker.reset_at)
    if still > limit:
        reason = (
            f"the fault storm has not ended: {still} of the selected GPU nodes that turned Unhealthy "
            f"since it began are still Unhealthy and held back, more than maxNewUnhealthy={limit}; it "
            f"stays open until no more than {limit} are, or a human resumes it "
            f"(annotation {keys.BREAKER_RESET_ANNOTATION})"
        )
        return breaker if reason == breaker.reason else dataclasses.replace(breaker, reason=reason)
    return dataclasses.replace(
        breaker,
        state=State.HALF_OPEN,
        since=now,
        trial=None,
        trial_at=None,
        reason=(
            f"half-open: {count} selected GPU nodes turned Unhealthy in the last {window} and {still} of the "
            f"storm's nodes are still held back (maxNewUnhealthy={limit}); admitting one node, "
            f"resuming {_words(probe)} later unless the storm returns"
        ),
    )


def admit(breaker: Breaker, node: str, now: datetime.datetime) -> tuple[Breaker, bool]:
    """Whether a new disruption of `node` may start now, and the breaker after it (a trial recorded)."""
    if breaker.state is State.CLOSED:
        return breaker, True
    if breaker.state is State.OPEN:
        return breaker, False
    if breaker.trial_at is None:
        return dataclasses.replace(breaker, trial=node, trial_at=now), True
    return breaker, breaker.trial == node


def reset(now: datetime.datetime, who: str) -> Breaker:
    """A manual reset: closed now, and the nodes that turned Unhealthy so far no longer count."""
    return Breaker(state=State.CLOSED, since=now, reason=f"reset by {who}", reset_at=now)


def _seconds(start: datetime.datetime, end: datetime.datetime) -> float:
    return (end - start).total_seconds()


def _words(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def advance(
    breaker: Breaker,
    turned: Iterable[datetime.datetime],
    limit: int,
    window_seconds: float,
    now: datetime.datetime,
    *,
    held: Iterable[datetime.datetime] | None = None,
) -> Breaker:
    """`step` with its count (`new_unhealthy` of `turned`), in one call: how `state.breakers` steps a
    policy's breaker. A closed breaker within its limit is the very same (`step` would return it)."""
    count = new_unhealthy(turned, now, window_seconds, breaker.reset_at)
    if breaker.state is State.CLOSED and count <= limit:
        return breaker
    return step(breaker, count, limit, window_seconds, now, held=held)


def advance_and_admit(  # noqa: PLR0917 - `advance`'s inputs, then `admit`'s node
    breaker: Breaker,
    turned: Iterable[datetime.datetime],
    limit: int,
    window_seconds: float,
    now: datetime.datetime,
    node: str,
) -> tuple[Breaker, Breaker, bool]:
    """An admission's two questions of one breaker in one call: (the breaker stepped to `now` by
    `advance`, which cannot tell who is held back, then the breaker after `admit` of `node`, admitted)."""
    stepped = advance(breaker, turned, limit, window_seconds, now)
    after, admitted = admit(stepped, node, now)
    return stepped, after, admitted
