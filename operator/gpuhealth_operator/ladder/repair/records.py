"""Repair's writes of a node's cycle: the state annotation (version-guarded), its history entries, what
this process saw of a step's Job.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuhealth_api import vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import (
    repair,
    times,
)
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.ladder.repair import jobs, reading
from gpuhealth_operator.shared import context

if TYPE_CHECKING:  # the Job step writes through this module: its type only
    from gpuhealth_operator.ladder.repair import job_step

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase


# --- writing -----------------------------------------------------------------------------------------


async def write_state(
    ctx: context.Context,
    name: str,
    state: repair.State | None,
    *,
    retired: bool = False,
    also: Mapping[str, str | None] | None = None,
) -> bool:
    """Write the node's repair state (None: remove it) on the cached version; False on a conflict."""
    record = ctx.cache.nodes.get(name)
    if record is None:
        return False
    try:
        body = await jobs.set_state(
            ctx.client,
            name,
            value=repair.render(state) if state is not None else None,
            resource_version=record.resource_version,
            retired=retired,
            also=also,
            node_uid=record.uid,
        )
    except kube.ApiError as error:
        if not error.conflict:
            raise
        await node_patches.refresh(ctx, name)
        return False
    return ctx.cache.refresh_node(body) is not None


def sealed(ctx: context.Context, name: str, state: repair.State) -> repair.State:
    """The state with a new Job token: this process keeps the token, the state (on the Node) its hash."""
    token = secrets.token_urlsafe(24)
    digest = repair.token_digest(token)
    ctx.steps.repair.tokens[name] = (digest, token)
    return dataclasses.replace(state, token=digest)


def note(
    ctx: context.Context,
    name: str,
    now: datetime.datetime,
    state: repair.State,
    *,
    step: str,
    action: str,
    result: Result,
    message: str,
    fault: str = "",
) -> None:
    record(
        ctx,
        name,
        now,
        cycle=state.cycle,
        step=step,
        action=action,
        gpus=state.gpus,
        result=result,
        message=message,
        fault=fault,
    )


def record(
    ctx: context.Context,
    name: str,
    now: datetime.datetime,
    *,
    cycle: int,
    step: str,
    action: str,
    gpus: tuple[str, ...],
    result: Result,
    message: str,
    fault: str = "",
) -> None:
    """One `status.repairs[]` entry (written with the node's next status) and its count in the metric."""
    item = repair.entry(
        now, cycle=cycle, step=step, action=action, gpus=gpus, result=result, message=message, fault=fault
    )
    ctx.steps.repair.history[name] = repair.with_entry(reading.history(ctx, name), item)
    ctx.meters.repairs.labels(action or "none", result.value).inc()


def started(ctx: context.Context, name: str, state: repair.State) -> bool:
    """Whether this state's Job was created (its Started entry names it)."""
    return any(
        e.get("result") == Result.STARTED and state.job in str(e.get("message") or "")
        for e in reading.history(ctx, name)
    )


def fill_gaps(
    ctx: context.Context, name: str, step: str, action: job_step.JobStep, job: repair.JobView
) -> None:
    """History a leader made and died before writing (its status write follows the Job by a pass): how
    the phase before this state ended (written on the Node with the state) and this state's Started (its
    Job is there), both dated when the state was written."""
    state = action.state
    done = state.previous
    if done is not None and not repair.recorded(reading.history(ctx, name), state):
        note(
            ctx,
            name,
            state.since,
            state,
            step=done.step,
            action=done.action,
            result=done.result,
            message=done.message,
        )
    if job.phase is not repair.JobPhase.MISSING and not started(ctx, name, state):
        note(
            ctx,
            name,
            state.since,
            state,
            step=step,
            action=action.key,
            result=Result.STARTED,
            message=f"Job {action.namespace}/{state.job} created (recorded by the next leader)",
        )


def finished_seen(
    ctx: context.Context, name: str, state: repair.State, job: repair.JobView, now: datetime.datetime
) -> datetime.datetime | None:
    """When this process first saw the state's Job finished (its clock), `now` the first time; None while
    the Job runs. `now` is read after the Job (a pass's start could precede a report seen meanwhile)."""
    if job.phase not in (repair.JobPhase.SUCCEEDED, repair.JobPhase.FAILED):
        return None
    known = ctx.steps.repair.finished_seen.get(name)
    if known is None or known[0] != state.job:
        known = ctx.steps.repair.finished_seen[name] = (state.job, now)
    return known[1]


def observe_duration(ctx: context.Context, state: repair.State, result: str, now: datetime.datetime) -> None:
    started = state.started or state.since
    ctx.meters.repair_duration.labels(result).observe(max(0.0, times.seconds_between(started, now)))
