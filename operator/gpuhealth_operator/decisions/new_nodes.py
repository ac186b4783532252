"""Validation of new nodes (`spec.repair.validation.newNodes: true`, issue #26 item 4): the pure rules.

A node is *new* to a policy when its Node was created after the policy (`metadata.creationTimestamp`
of both) and it has never been validated as new (neither `keys.VALIDATED_ANNOTATION` nor
`keys.VALIDATION_FAILED_ANNOTATION`). So turning newNodes on for a fleet never touches the nodes
that were there already; a node that joins later is tainted (`keys.UNVALIDATED_TAINT`, NoSchedule)
and proved by a validation Job before it takes work. One more guard keeps a busy node out: a node
that already runs a workload pod when first seen (`decisions.workload_pods`: any pod but a finished,
DaemonSet, mirror or repair pod, whatever the drain evicts) is in service, not new (`plan`'s `busy`).

`plan` says what one node needs now; `observe` what its validation Job means.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
from typing import Final

from gpuhealth_operator.decisions import repair, times

MAX_NAME: Final = 63
NODE_PART: Final = 28
JOB_PREFIX: Final = "gpuhealth-repair-"


def is_new(node_created: str, policy_created: str, *, validated: bool) -> bool:
    """Created after the policy, never validated as new; an unknown time is never new."""
    node = times.parse(node_created) if node_created else None
    policy = times.parse(policy_created) if policy_created else None
    return not validated and node is not None and policy is not None and node > policy


def job_name(node: str) -> str:
    """`gpuhealth-repair-<node[:28]>-<sha1(node)[:6]>-new`: deterministic (a new leader adopts), <= 63."""
    digest = hashlib.sha1(node.encode(), usedforsecurity=False).hexdigest()[:6]
    tail = f"-{digest}-new"
    part = node.lower().replace(".", "-")[:NODE_PART].strip("-")
    name = f"{JOB_PREFIX}{part}{tail}" if part else f"{JOB_PREFIX.rstrip('-')}{tail}"
    return name[:MAX_NAME]


class Step(enum.StrEnum):
    NOTHING = "nothing"
    """Not ours, or already proved (or failed: a human's to return)."""
    TAINT = "taint"
    """New: hold it out of work with the unvalidated taint (first, before anything else)."""
    START = "start"
    """Tainted, no Job yet: create the validation Job (when a slot of maxConcurrent is free)."""
    OBSERVE = "observe"
    """Tainted, its Job runs (or ran): read it."""
    CANCEL = "cancel"
    """Tainted by us mid-validation, but no longer a new node of a policy with newNodes: delete the Job,
    remove the taint."""
    DRY_RUN = "dryRun"
    """The policy is in dry run: say what it would do, nothing else."""


@dataclasses.dataclass(frozen=True)
class Facts:
    """One node as the rule needs it."""

    wanted: bool
    """A policy with newNodes selects the node (it has a GPUNode, it is not excluded)."""
    dry_run: bool
    new: bool
    """`is_new` for that policy."""
    tainted: bool
    """It carries our unvalidated taint."""
    failed: bool
    """Its new-node validation failed (annotation): a human's now."""
    started: bool
    """Its validation Job exists (or existed this round)."""
    busy: bool = False
    """A workload pod runs on it (`decisions.workload_pods`; asked only before the first taint)."""


def plan(facts: Facts) -> Step:
    if facts.failed:
        return Step.NOTHING  # stays tainted and labelled until a human returns it
    if facts.tainted and not (facts.wanted and facts.new and not facts.dry_run):
        return Step.CANCEL
    if not facts.wanted or not facts.new:
        return Step.NOTHING
    if facts.dry_run:
        return Step.DRY_RUN
    if not facts.tainted:
        return Step.NOTHING if facts.busy else Step.TAINT
    return Step.OBSERVE if facts.started else Step.START


class Outcome(enum.StrEnum):
    WAIT = "wait"
    PASSED = "passed"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Transition:
    outcome: Outcome
    message: str = ""


def observe(
    job: repair.JobView,
    name: str,
    started: str,
    timeout_seconds: float,
    now: datetime.datetime,
) -> Transition:
    """What the node's validation Job means now (`started`: the Job's creationTimestamp)."""
    if job.phase is repair.JobPhase.SUCCEEDED:
        return Transition(Outcome.PASSED, f"validation Job {name} succeeded")
    if job.phase is repair.JobPhase.FAILED:
        return Transition(Outcome.FAILED, f"validation Job {name} failed: {job.message}")
    if job.phase is repair.JobPhase.MISSING:
        return Transition(Outcome.WAIT)  # not created yet (START), or deleted: created again
    since = times.parse(started) if started else None
    if since is not None and times.seconds_between(since, now) >= timeout_seconds:
        return Transition(Outcome.FAILED, f"validation did not finish within {timeout_seconds:g}s")
    return Transition(Outcome.WAIT)
