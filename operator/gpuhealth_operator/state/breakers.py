"""The fleet circuit breakers at run time: one per policy, asked at every admission.

`decisions.breaker` decides; this module keeps each policy's breaker between
decisions. `admission` steps it under its lock (so the node that trips it is
the first one refused); `pausing` steps it once per timer pass and says what
changed; the policy status shows it as the `Paused` condition, and the last
manual reset acted on as `status.breakerReset` (the operator may only write
a policy's status, so the annotation stays and its value is recorded).

What must survive a restart is in the cluster: the times nodes turned
Unhealthy are the fatal conditions' lastTransitionTime in GPUNode status (the
first judgements after a restart count a storm that began before it); an
open breaker is the policy's `Paused` condition (True, reason FaultStorm, since
its lastTransitionTime), read back when the policy is first seen, so a storm
that has not ended keeps it open across a restart or a change of leader
instead of closing it because no node is new any more; the last manual reset
acted on is `status.breakerReset`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import breaker, model, times

_CLOSED: Final = breaker.Breaker()
"""A policy's breaker before any step: closed (frozen, so one shared value serves every policy)."""

_limit = functools.lru_cache(maxsize=256)(breaker.resolve_limit)
"""`breaker.resolve_limit`, pure, kept per (maxNewUnhealthy, selected): asked every timer pass per policy,
and a percentage is a regular expression's match each time."""

PAUSED: Final = vocabulary.PolicyConditionType.PAUSED.value
"""The policy status condition: True while the breaker holds new disruptions back."""

STATUS_FIELD = "breakerReset"
"""Policy status: {value, time} of the last gpuhealth.io/breaker-reset acted on."""


@dataclasses.dataclass
class Breakers:
    """Each policy's breaker; every collection is changed in place (kopf shares the memo by shallow copy)."""

    states: dict[str, breaker.Breaker] = dataclasses.field(default_factory=dict)
    """policy → its breaker as last stepped."""

    announced: dict[str, breaker.Breaker] = dataclasses.field(default_factory=dict)
    """policy → the breaker last announced (Event, metric), so each opening is said once."""

    resets: dict[str, str] = dataclasses.field(default_factory=dict)
    """policy → the value of a gpuhealth.io/breaker-reset annotation not yet acted on."""

    acted: dict[str, tuple[str, datetime.datetime]] = dataclasses.field(default_factory=dict)
    """policy → the reset annotation's value last acted on, and when (kept in `status.breakerReset`)."""

    def current(
        self,
        policy: model.Policy,
        selected: int,
        turned: MutableMapping[str, datetime.datetime],
        now: datetime.datetime,
        held: Collection[datetime.datetime] | None = None,
    ) -> breaker.Breaker:
        """The policy's breaker stepped to `now`; `turned`: node → when it turned Unhealthy (pruned here).

        `held`: when each node the policy holds back turned Unhealthy (`breaker.step`); None (an
        admission, which cannot tell) never moves an open breaker on.
        """
        state, limit = self._due(policy, selected, turned, now)
        if limit is None:
            return state
        state = breaker.advance(state, turned.values(), limit, policy.breaker_window_seconds, now, held=held)
        self.states[policy.name] = state
        return state

    def admit(
        self,
        node: str,
        asked: Sequence[tuple[model.Policy, int, MutableMapping[str, datetime.datetime]]],
        now: datetime.datetime,
    ) -> bool:
        """Whether every asked policy's breaker, stepped to now, lets a new disruption of `node` start.

        `asked`: each policy that selects the node, how many nodes it selects, and its node → when it
        turned Unhealthy (pruned here). Each breaker is stepped as `current` steps it (held None: an
        admission cannot tell) and kept so; all are decided before any admission is kept, so a
        half-open breaker's one trial is not spent on a node another policy's breaker refuses.
        """
        decided: list[tuple[str, breaker.Breaker, bool]] = []
        for policy, selected, turned in asked:
            state, limit = self._due(policy, selected, turned, now)
            if limit is None:
                after, admitted = breaker.admit(state, node, now)
            else:
                state, after, admitted = breaker.advance_and_admit(
                    state, turned.values(), limit, policy.breaker_window_seconds, now, node
                )
                self.states[policy.name] = state
            decided.append((policy.name, after, admitted))
        if not all(admitted for _, _, admitted in decided):
            return False
        for name, after, _ in decided:
            self.states[name] = after
        return True

    def _due(
        self,
        policy: model.Policy,
        selected: int,
        turned: MutableMapping[str, datetime.datetime],
        now: datetime.datetime,
    ) -> tuple[breaker.Breaker, int | None]:
        """The policy's breaker as kept and its limit, `turned` pruned to the window. Limit None: it never
        trips (no more nodes than it selects can turn Unhealthy, "100%"), so there is nothing to step."""
        state = self.states.get(policy.name, _CLOSED)
        limit = _limit(policy.breaker_max_new_unhealthy, selected)
        if state.state is breaker.State.CLOSED and limit >= selected:
            return state, None
        if turned:
            before = now - datetime.timedelta(seconds=policy.breaker_window_seconds)
            for node in [n for n, t in turned.items() if t <= before]:
                del turned[node]  # out of every window; a node still Unhealthy is put back, still out of it
        return state, limit

    def paused(self, policy: str) -> breaker.Breaker | None:
        """The policy's breaker if it holds new disruptions back, else None."""
        state = self.states.get(policy)
        return state if state is not None and state.paused else None

    def note_reset(self, policy: str, body: Mapping[str, Any]) -> None:
        """Read a policy's reset request (its annotation) and, once per process, what its status recorded.

        A value already acted on (recorded in `status.breakerReset`) is not acted on
        again, so the annotation may stay; a new value asks for a new reset. The
        recorded reset time survives a restart: nodes that turned Unhealthy before
        it do not trip the breaker again. An open or half-open breaker recorded in
        the `Paused` condition is taken up where it stood (see the module's doc).
        """
        status = body.get("status") or {}
        recorded = status.get(STATUS_FIELD) or {}
        if policy not in self.acted and isinstance(recorded.get("value"), str):
            at = times.parse(recorded.get("time"))
            if at is not None:
                self.acted[policy] = (recorded["value"], at)
        if policy not in self.states:
            acted = self.acted.get(policy)
            reset_at = acted[1] if acted is not None else None
            restored = _restored(status.get("conditions"), reset_at)
            if restored is not None:
                self.states[policy] = restored
            elif reset_at is not None:
                self.states[policy] = breaker.Breaker(reset_at=reset_at)
        value = ((body.get("metadata") or {}).get("annotations") or {}).get(keys.BREAKER_RESET_ANNOTATION)
        acted = self.acted.get(policy)
        if isinstance(value, str) and (acted is None or acted[0] != value[:63]):
            self.resets[policy] = value

    def reset(self, policy: str, value: str, now: datetime.datetime) -> None:
        """Close the policy's breaker by hand and record the request as acted on."""
        self.states[policy] = breaker.reset(now, f"annotation {keys.BREAKER_RESET_ANNOTATION}={value[:63]}")
        self.acted[policy] = (value[:63], now)

    def status(self, policy: str) -> dict[str, Any]:
        """The policy's `status.breakerReset` ({} before any reset)."""
        acted = self.acted.get(policy)
        return {} if acted is None else {STATUS_FIELD: {"value": acted[0], "time": times.render(acted[1])}}

    def condition(self, policy: str, now: datetime.datetime) -> dict[str, Any]:
        """The policy's `Paused` status condition."""
        state = self.states.get(policy, breaker.Breaker())
        return {
            "type": PAUSED,
            "status": "True" if state.paused else "False",
            "reason": {
                breaker.State.OPEN: vocabulary.PolicyConditionReason.FAULT_STORM.value,
                breaker.State.HALF_OPEN: vocabulary.PolicyConditionReason.HALF_OPEN.value,
            }.get(state.state, vocabulary.PolicyConditionReason.BREAKER_CLOSED.value),
            "message": (state.reason or "no fault storm: new disruptions are admitted") + ".",
            "lastTransitionTime": times.render(state.since or now),
        }

    def forget_node(self, name: str) -> None:
        """The node is gone or deselected: a half-open trial of it stays spent, but no longer names it."""
        for policy, state in self.states.items():
            if state.trial == name:
                self.states[policy] = dataclasses.replace(state, trial=None)
        for policy, state in self.announced.items():
            if state.trial == name:
                self.announced[policy] = dataclasses.replace(state, trial=None)

    def forget_policy(self, name: str) -> None:
        self.states.pop(name, None)
        self.announced.pop(name, None)
        self.resets.pop(name, None)
        self.acted.pop(name, None)


_RESTORED_STATES = {
    vocabulary.PolicyConditionReason.FAULT_STORM.value: breaker.State.OPEN,
    vocabulary.PolicyConditionReason.HALF_OPEN.value: breaker.State.HALF_OPEN,
}
"""The `Paused` condition's reasons (`Breakers.condition`) of a breaker that holds disruptions back."""


def _restored(conditions: object, reset_at: datetime.datetime | None) -> breaker.Breaker | None:
    """The breaker a policy's written `Paused` condition describes (None: closed, or nothing written).

    A half-open one is taken up with its trial spent (whom it admitted is not recorded): it admits no
    one else and closes a probe later unless the storm returns.
    """
    if not isinstance(conditions, list):
        return None
    paused = next((c for c in conditions if isinstance(c, dict) and c.get("type") == PAUSED), None)
    if paused is None or paused.get("status") != "True":
        return None
    state = _RESTORED_STATES.get(str(paused.get("reason")))
    since = times.parse(paused.get("lastTransitionTime"))
    if state is None or since is None:
        return None
    reason = str(paused.get("message") or "").removesuffix(".")
    trial_at = since if state is breaker.State.HALF_OPEN else None
    return breaker.Breaker(state=state, since=since, reason=reason, trial_at=trial_at, reset_at=reset_at)
