"""Fire drills: the whole decision path for one node, run as a dry run on a condition nobody has.

`kubectl annotate gpunode NODE gpuhealth.io/drill=EccUncorrectable` asks the
operator to treat that condition as true on that node: a synthetic signal
joins the node's real signals (`signal`), and the real rules, hysteresis
(`forSeconds` counted from the drill's start), severity, the budget check and
the action ladder judge it. What would be done is only said (`describe`);
nothing on the Node changes and no budget place is taken.

A drill ends by itself: `gpuhealth.io/drill-ttl` (default 10 minutes) after
its start, which the operator writes once as `gpuhealth.io/drill-started`,
so a restart neither extends nor restarts it. This module parses those
annotations and words the Events; the I/O lives in `drills`.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Final

from gpuhealth_api import keys, status, vocabulary
from gpuhealth_operator.decisions import budget, isolation, model, times

Condition = vocabulary.Condition

DEFAULT_TTL_SECONDS: Final = 600.0
MAX_TTL_SECONDS: Final = 24 * 3600.0
"""A drill longer than a day is a forgotten annotation, not a drill."""

_DURATION = re.compile(r"(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")


class DrillError(ValueError):
    """The drill annotations do not say a drill we can run; the message says why and what would."""


@dataclasses.dataclass(frozen=True)
class Drill:
    condition: Condition
    ttl_seconds: float
    started: datetime.datetime | None
    """From `gpuhealth.io/drill-started`; None until the operator has written it."""

    def expires(self, now: datetime.datetime) -> datetime.datetime:
        return (self.started or now) + datetime.timedelta(seconds=self.ttl_seconds)

    def expired(self, now: datetime.datetime) -> bool:
        return now >= self.expires(now)


def valid_conditions() -> tuple[str, ...]:
    return tuple(c.value for c in Condition)


def parse_ttl(value: str) -> float:
    """Seconds from "600", "600s", "10m", "1h30m"; DrillError for anything else, zero, or over a day."""
    text = value.strip()
    seconds: float | None = None
    if text.isdigit():
        seconds = float(text)
    elif text and (match := _DURATION.fullmatch(text)) is not None:
        seconds = float(int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0))
    if seconds is None or seconds <= 0 or seconds > MAX_TTL_SECONDS:
        raise DrillError(
            f"{keys.DRILL_TTL_ANNOTATION}={value!r} is not a duration between 1s and 24h "
            '(write "600", "600s", "10m" or "1h30m")'
        )
    return seconds


def requested(annotations: Mapping[str, str]) -> Drill | None:
    """The drill the GPUNode's annotations ask for; None without `gpuhealth.io/drill`.

    An unknown condition or a bad TTL is a DrillError (no drill runs). A
    `drill-started` that does not parse counts as absent: the operator writes
    it again.
    """
    name = annotations.get(keys.DRILL_ANNOTATION)
    if name is None:
        return None
    try:
        condition = Condition(name.strip())
    except ValueError:
        raise DrillError(
            f"{keys.DRILL_ANNOTATION}={name!r} is not a condition gpu-health knows; "
            f"use one of {', '.join(valid_conditions())}"
        ) from None
    ttl = annotations.get(keys.DRILL_TTL_ANNOTATION)
    return Drill(
        condition=condition,
        ttl_seconds=DEFAULT_TTL_SECONDS if ttl is None else parse_ttl(ttl),
        started=times.parse(annotations.get(keys.DRILL_STARTED_ANNOTATION)),
    )


def signal(drill: Drill, now: datetime.datetime) -> model.Signal:
    """The synthetic evidence: present since the drill started, so `forSeconds` counts from there."""
    return model.Signal(
        drill.condition,
        True,
        f"fire drill: {drill.condition.value} simulated ({keys.DRILL_ANNOTATION})",
        observed_at=drill.started or now,
    )


def attribution(drill: Drill, facts: status.GPUNodeStatus) -> isolation.Attribution:
    """Whose fault the drilled condition is, for IsolateGPU: a drill names no GPU, so the node's first
    listed GPU stands in for the faulty one (`STAND_IN`); a node whose agent lists none has no GPU
    to isolate, as with a real fault."""
    listed = isolation.listed_gpus(facts)
    if not listed:
        return isolation.Attribution((), f"{drill.condition.value}: the agent lists no GPU to isolate")
    return isolation.Attribution((isolation.gpu_fault(listed[0], (drill.condition,)),))


STAND_IN: Final = "the faulty GPU"
"""How a drill's Event names the GPU IsolateGPU would isolate (`attribution`)."""


def budget_wait(name: str, budgets: Sequence[budget.Budget]) -> str | None:
    """Why a cordon of `name` would wait for a budget now (no free place), or None if every one has room.

    A check, not an admission: nothing is taken, and other waiting nodes are
    not ranked against the drilled one (a real fault might still queue
    behind worse ones).
    """
    for each in budgets:
        if name not in each.selected:
            continue
        limit = each.limit
        holders = set(each.unavailable) - {name}
        if len(holders) >= limit:
            if each.domain is not None:
                return (
                    f"policy {each.policy.name}'s topology budget {each.domain} has no free place "
                    f"({len(holders)} of its {len(each.selected)} selected GPU nodes in the domain are "
                    f"unschedulable, maxUnavailable={limit})"
                )
            return (
                f"policy {each.policy.name}'s budget has no free place ({len(holders)} of its "
                f"{len(each.selected)} selected GPU nodes are unschedulable, maxUnavailable={limit})"
            )
    return None


def describe(
    policy: model.Policy,
    drill: Drill,
    verdict: model.NodeVerdict,
    changes: Sequence[str],
    wait: str | None,
) -> str:
    """The Drill Event: what `policy` would do to the node now, if the drilled condition were real."""
    who = (
        f"dry-run policy {policy.name} would only record that it would"
        if policy.dry_run
        else (f"policy {policy.name} would")
    )
    issues = ", ".join(verdict.issues) or "no issues"
    if changes:
        message = f"Drill: {who} {', '.join(changes)} ({issues})"
        if wait is not None:
            message += f", but {wait}: the node would wait for the budget (action Pending)"
        return message + "."
    state = verdict.conditions.get(drill.condition)
    if state is not None and state.status != "True" and state.observed_since is not None:
        return f"Drill: {drill.condition.value} is pending under policy {policy.name}: {state.message}."
    if drill.condition not in verdict.issues:
        return (
            f"Drill: policy {policy.name} would not judge {drill.condition.value} true on this node "
            f"({verdict.health.value}): nothing would be done."
        )
    health = verdict.health.value
    return f"Drill: policy {policy.name} would judge the node {health} ({issues}) and change nothing."
