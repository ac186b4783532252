"""Saying what the fleet circuit breakers decided, once per timer pass.

The breakers decide at admission (`admission`, `breakers`); time alone also
moves them (open → half-open → closed), and a human may reset one. Each pass
this acts on new `gpuhealth.io/breaker-reset` annotation values (closing the
breaker; the value is recorded in the policy's status), steps every acting
policy's breaker with the nodes it holds back (only this step can tell whether
a storm has ended, so only it half-opens an open breaker), exports
`gpuhealth_operator_breaker_open`, and says each opening once with a `RemediationPaused` Event on the policy.
"""

from __future__ import annotations

import datetime
import logging

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events
from gpuhealth_operator.decisions import breaker
from gpuhealth_operator.decisions.isolation import Outcome
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache

logger = logging.getLogger(__name__)


async def announce(ctx: context.Context, now: datetime.datetime) -> None:
    """Act on reset requests, step every acting policy's breaker, and say what changed."""
    breakers = ctx.breakers
    acting = {name for name, policy in ctx.cache.policies.items() if not policy.dry_run}
    for name in [n for n in breakers.states if n not in acting]:
        # Now dry-run or invalid: it holds nothing back, so it must not keep an alert firing.
        del breakers.states[name]
        breakers.announced.pop(name, None)
        ctx.meters.breaker_open.labels(name).set(0)
    for name, policy in sorted(ctx.cache.policies.items()):
        if policy.dry_run:
            continue
        request = breakers.resets.pop(name, None)
        if request is not None:
            breakers.reset(name, request, now)
            logger.warning("policy %s: fleet circuit breaker reset by annotation (%s)", name, request[:63])
        selection = ctx.cache.selection(policy)
        # Only an open breaker's step reads the nodes held back (`breaker.step`): a closed or half-open
        # one steps alike without them, so they are not gathered over the fleet's verdicts every pass.
        was = breakers.states.get(name)
        holding = held(ctx, selection) if was is not None and was.state is breaker.State.OPEN else []
        state = breakers.current(
            policy, len(selection.selected), ctx.verdicts.turned_unhealthy[name], now, holding
        )
        ctx.meters.breaker_open.labels(name).set(1 if state.paused else 0)
        said = breakers.announced.get(name)
        if said is not None and said.state is state.state and said.since == state.since:
            continue
        breakers.announced[name] = state
        if state.state is breaker.State.OPEN:
            await ctx.recorder.emit(
                events.policy_subject(name),
                vocabulary.EventReason.REMEDIATION_PAUSED,
                f"Policy {name} paused new cordons and drains: {state.reason}. Cordoned nodes stay and "
                "running drains go on. It half-opens by itself after the window once the storm has ended "
                "(no more of its nodes than the limit still Unhealthy and held back), else it stays open "
                "until "
                f"`kubectl annotate --overwrite ghp {name} {keys.BREAKER_RESET_ANNOTATION}=$(date +%s)` "
                "resumes it.",
                events.WARNING,
            )
        elif said is not None:
            logger.info("policy %s: breaker %s: %s", name, state.state.value, state.reason)


def held(ctx: context.Context, selection: cache.Selection) -> list[datetime.datetime]:
    """When each node the policy holds back turned Unhealthy (by its verdict): Unhealthy now, selected,
    and wanting a cordon or drain (neither unschedulable nor admitted) or GPUs isolated that wait,
    under any acting policy, since a disruption needs every selecting policy's breaker (`admission`).
    `breaker.step` tells the storm's nodes from older ones by these times."""
    name = selection.policy.name
    acting = {p for p, policy in ctx.cache.policies.items() if not policy.dry_run}
    out = selection.unavailable | ctx.admission.in_flight
    nodes = {n for p in acting for n in ctx.verdicts.wanting.get(p, {}) if n not in out}
    nodes.update(
        node
        for (policy, node), state in ctx.steps.isolate.isolations.items()
        if policy in acting and state.decision is not None and state.decision.with_outcome(Outcome.WAIT)
    )
    times = []
    for node in sorted(nodes & selection.selected):
        verdict = ctx.verdicts.get((name, node))
        turned = breaker.turned_unhealthy(verdict) if verdict is not None else None
        if turned is not None:
            times.append(turned)
    return times
