"""Saying what the fleet circuit breakers decided, once per timer pass.

The breakers decide at admission (`admission`, `breakers`); time alone also
moves them (open → half-open → closed), and a human may reset one. Each pass
this acts on `gpuhealth.io/breaker-reset` annotations (closing the breaker,
then removing the annotation so it is acted on once), steps every acting
policy's breaker, exports `gpuhealth_operator_breaker_open`, and says each
opening once with a `RemediationPaused` Event on the policy.
"""

from __future__ import annotations

import datetime
import logging

from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_operator import context, kube
from gpuhealth_operator.actions import events
from gpuhealth_operator.decisions import breaker

logger = logging.getLogger(__name__)


async def announce(ctx: context.Context, now: datetime.datetime) -> None:
    """Act on reset requests, step every acting policy's breaker, and say what changed."""
    breakers = ctx.breakers
    for name, policy in sorted(ctx.cache.policies.items()):
        if policy.dry_run:
            continue
        request = breakers.resets.pop(name, None)
        if request is not None:
            await _reset(ctx, name, request, now)
        selected = len(ctx.cache.selection(policy).selected)
        state = breakers.current(policy, selected, ctx.verdicts.turned_unhealthy[name], now)
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
                "running drains go on; it half-opens by itself after the window, or "
                f"`kubectl annotate ghp {name} {keys.BREAKER_RESET_ANNOTATION}=now` resumes at once.",
                events.WARNING,
            )
        elif said is not None:
            logger.info("policy %s: breaker %s: %s", name, state.state.value, state.reason)


async def _reset(ctx: context.Context, name: str, value: str, now: datetime.datetime) -> None:
    """Close the breaker by hand, then remove the annotation so it is acted on once."""
    ctx.breakers.states[name] = breaker.reset(now, f"annotation {keys.BREAKER_RESET_ANNOTATION}={value[:63]}")
    logger.warning("policy %s: fleet circuit breaker reset by annotation (%s)", name, value[:63])
    path = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.POLICY_PLURAL}/{name}"
    try:
        await ctx.client.patch(path, {"metadata": {"annotations": {keys.BREAKER_RESET_ANNOTATION: None}}})
    except kube.ApiError as error:
        logger.warning("policy %s: could not remove %s: %s", name, keys.BREAKER_RESET_ANNOTATION, error)
