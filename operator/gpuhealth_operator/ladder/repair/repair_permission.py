"""Whether the operator may create repair Jobs (issue 45, leftover A): the policy's `RepairPermitted`.

The chart grants no right to create Jobs until `repair.enabled` (DESIGN.md, "Privilege is an explicit
grant"), so a policy with `spec.repair` on such an install meets 403 (or 404: no namespace for the
Jobs) at each create. That is the install's state, not the node's failure: the node stays Drained
(cordoned, claimed), no step is counted, and the policy says so once — its status condition
`RepairPermitted=False` with the API server's words, and one Event naming `repair.enabled`. A
refused create is tried again every `RETRY_SECONDS`, so a repair starts once the rights appear.

What was said lives in the cluster (the policy's stored condition, read back by `observe` at each
start of a term), so a restarted operator does not say it again.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, repair, times
from gpuhealth_operator.shared import context

CONDITION: Final = vocabulary.PolicyConditionType.REPAIR_PERMITTED.value
REASON_REFUSED: Final = vocabulary.PolicyConditionReason.JOB_CREATE_REFUSED.value
REASON_PERMITTED: Final = vocabulary.PolicyConditionReason.JOBS_CREATED.value
REASON_NOT_TRIED: Final = vocabulary.PolicyConditionReason.NOT_TRIED.value
RETRY_SECONDS: Final = 60.0
"""How often a refused policy tries one create again: often enough that granting the rights starts a
repair within a minute, rare enough that a fleet of drained nodes does not hammer the API server."""


Refused = repair.Refused


RBAC_WORDS: Final = "cannot create resource"
"""What the API server's RBAC authorizer says in a 403 (`User "…" cannot create resource "jobs" …`). A
403 without it is admission's (a ResourceQuota exceeded, a webhook, Pod Security): the template's or
the namespace's limit, which fails the step as before."""


def refused(status: int, message: str) -> bool:
    """Whether the Job API's answer is the install's lack of rights (or of a namespace), not a failure."""
    if status == 404:
        return True
    return status == 403 and RBAC_WORDS in message


def may_try(ctx: context.Context, policy: str, now: datetime.datetime) -> bool:
    """Whether a Job of the policy may be tried now (not refused within `RETRY_SECONDS`)."""
    known = ctx.steps.repair.refused.get(policy)
    return known is None or not 0 <= times.seconds_between(known.at, now) < RETRY_SECONDS


def note_refused(ctx: context.Context, policy: str, message: str, now: datetime.datetime) -> bool:
    """Record a refusal; True when it is news to say (not said by this process or one before it)."""
    known = ctx.steps.repair.refused.get(policy)
    said = known is not None and known.said
    ctx.steps.repair.refused[policy] = Refused(message, now, said=True)
    return not said


def note_permitted(ctx: context.Context, policy: str) -> None:
    """A Job of the policy was created (or adopted): the rights are there."""
    ctx.steps.repair.refused.pop(policy, None)
    ctx.steps.repair.permitted.add(policy)


def observe(ctx: context.Context, policy: str, body: Mapping[str, Any]) -> None:
    """Take up a refusal a process before us recorded in the policy's status (its Event was said)."""
    if policy in ctx.steps.repair.refused or policy in ctx.steps.repair.permitted:
        return
    for c in (body.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION and c.get("status") == "False":
            at = times.parse(c.get("lastTransitionTime")) or ctx.clock()
            # Tried again at once by this process: "at" only dates the condition, the wait restarts.
            ctx.steps.repair.refused[policy] = Refused(
                str(c.get("message") or ""), at - datetime.timedelta(seconds=RETRY_SECONDS), said=True
            )


def condition(ctx: context.Context, policy: model.Policy | None) -> dict[str, Any] | None:
    """The policy's `RepairPermitted` condition (None: the policy has no `spec.repair`)."""
    if policy is None or policy.repair is None:
        return None
    known = ctx.steps.repair.refused.get(policy.name)
    if known is not None:
        return {
            "type": CONDITION,
            "status": "False",
            "reason": REASON_REFUSED,
            "message": known.message,
        }
    if policy.name in ctx.steps.repair.permitted:
        return {
            "type": CONDITION,
            "status": "True",
            "reason": REASON_PERMITTED,
            "message": "The operator creates repair Jobs.",
        }
    return {
        "type": CONDITION,
        "status": "Unknown",
        "reason": REASON_NOT_TRIED,
        "message": "No repair Job was tried yet.",
    }


def words(policy: str, namespace: str, job: str, *, status: int, reason: str, api_message: str) -> str:
    """The condition's and the Event's message: what was refused, and what to do."""
    what = "may not create Jobs" if status == 403 else "finds no namespace or Job API to create Jobs in"
    return (
        f"Policy {policy} has spec.repair but the operator {what} in namespace {namespace} (Job {job}: "
        f"{status} {reason}: {api_message}). Set repair.enabled=true in the chart (it grants the right to "
        f"create Jobs), or remove spec.repair; drained nodes stay cordoned and no repair step is counted "
        f"until then."
    )
