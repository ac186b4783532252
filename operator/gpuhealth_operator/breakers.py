"""The fleet circuit breakers at run time: one per policy, asked at every admission.

`decisions.breaker` decides; this module keeps each policy's breaker between
decisions. `admission` steps it under its lock (so the node that trips it is
the first one refused); `pausing` steps it once per timer pass and says what
changed; the policy status shows it as the `Paused` condition.

Nothing here must survive a restart: the times nodes turned Unhealthy are
the fatal conditions' lastTransitionTime in GPUNode status, so the first
judgements after a restart count a storm that began before it and the
breaker trips again at the first admission (fail safe). A manual reset is
forgotten by a restart within the window; annotate again.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, MutableMapping
from typing import Any

from gpuhealth_api import keys
from gpuhealth_operator.decisions import breaker, model, times

PAUSED = "Paused"
"""The policy status condition: True while the breaker holds new disruptions back."""


@dataclasses.dataclass
class Breakers:
    """Each policy's breaker; every collection is changed in place (kopf shares the memo by shallow copy)."""

    states: dict[str, breaker.Breaker] = dataclasses.field(default_factory=dict)
    """policy → its breaker as last stepped."""

    announced: dict[str, breaker.Breaker] = dataclasses.field(default_factory=dict)
    """policy → the breaker last announced (Event, metric), so each opening is said once."""

    resets: dict[str, str] = dataclasses.field(default_factory=dict)
    """policy → the value of a gpuhealth.io/breaker-reset annotation not yet acted on."""

    def current(
        self,
        policy: model.Policy,
        selected: int,
        turned: MutableMapping[str, datetime.datetime],
        now: datetime.datetime,
    ) -> breaker.Breaker:
        """The policy's breaker stepped to `now`; `turned`: node → when it turned Unhealthy (pruned here)."""
        before = now - datetime.timedelta(seconds=policy.breaker_window_seconds)
        for node in [n for n, t in turned.items() if t <= before]:
            del turned[node]  # out of every window; a node still Unhealthy is put back, still out of it
        state = self.states.get(policy.name, breaker.Breaker())
        limit = breaker.resolve_limit(policy.breaker_max_new_unhealthy, selected)
        count = breaker.new_unhealthy(turned.values(), now, policy.breaker_window_seconds, state.reset_at)
        state = breaker.step(state, count, limit, policy.breaker_window_seconds, now)
        self.states[policy.name] = state
        return state

    def paused(self, policy: str) -> breaker.Breaker | None:
        """The policy's breaker if it holds new disruptions back, else None."""
        state = self.states.get(policy)
        return state if state is not None and state.paused else None

    def note_reset(self, policy: str, annotations: Mapping[str, str]) -> None:
        """Remember a reset asked for on the policy; the timer acts on it (`pausing.announce`)."""
        value = annotations.get(keys.BREAKER_RESET_ANNOTATION)
        if value is not None:
            self.resets[policy] = value

    def condition(self, policy: str, now: datetime.datetime) -> dict[str, Any]:
        """The policy's `Paused` status condition."""
        state = self.states.get(policy, breaker.Breaker())
        return {
            "type": PAUSED,
            "status": "True" if state.paused else "False",
            "reason": {
                breaker.State.OPEN: "FaultStorm",
                breaker.State.HALF_OPEN: "HalfOpen",
            }.get(state.state, "BreakerClosed"),
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
