"""A repair cycle's step, from its launch to its failure (`spec.repair.steps[]`, DESIGN.md "Repair"):
the step's or the validation's Job created (`launch`) once the node is free of workload pods
(`_while_busy`), the GPU Operator's operands and the agent have let the GPUs go (`_until_*`) and the
Job API permits it (`_refused`); each wait ends at the phase's deadline (`_wait_or_fail`), a failed
or timed-out step moves the cycle to the next step or retires the node (`failed`). Split from
`repairing` (issue 46): `launch` and `failed` call each other, so they live together. Each takes the
pass's `Visit` of the cycle, so every wait is one short call.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import NamedTuple

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import (
    model,
    repair,
    step_kinds,
    times,
    workload_pods,
)
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.ladder.repair import (
    gpu_release,
    job_step,
    jobs,
    operands,
    outcomes,
    reading,
    records,
    repair_permission,
)
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase


class Visit(NamedTuple):
    """One pass's look at a node's repair cycle: the node, its policy, the cycle's state, the verdict, now.

    A tuple, so a step unpacks what it reads in one line."""

    ctx: context.Context
    policy: model.Policy
    spec: model.RepairSpec
    name: str
    state: repair.State
    verdict: model.NodeVerdict
    now: datetime.datetime

    def at(self, state: repair.State) -> Visit:
        """The same visit, the cycle in `state` (written on the Node since)."""
        return self._replace(state=state)


async def failed(visit: Visit, transition: repair.Transition) -> outcomes.Handled | None:
    """A step or validation failed: say so, then the next step, or retire."""
    ctx, policy, spec, name, state, verdict, now = visit
    await outcomes.reset_over(ctx, name)  # no reset runs now: the agent and the operands take the GPUs back
    step = spec.steps[state.step] if state.step < len(spec.steps) else None
    validating = state.phase is Phase.VALIDATE
    kind = vocabulary.VALIDATION_JOB if validating else (step.action.value if step else "")
    result = transition.result or (Result.VALIDATION_FAILED if validating else Result.FAILED)
    records.note(
        ctx,
        name,
        now,
        state,
        step=step.name if step else "",
        action=kind,
        result=result,
        message=transition.message,
    )
    what = (
        f"Validation after step {step.name}"
        if validating and step
        else (f"Repair step {step.name} ({kind})" if step else "Repair step")
    )
    indexed = reading.faulty_gpus(ctx, policy, name, verdict)
    gpus = tuple(u for _, u in indexed) or state.gpus
    following = repair.next_step(spec, state.step + 1, gpus)
    then = (
        f"next: step {spec.steps[following].name} ({spec.steps[following].action.value})"
        if following is not None
        else "no step left: the node is retired"
    )
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.VALIDATION_FAILED if validating else vocabulary.EventReason.REPAIR_FAILED,
        f"{what} failed ({result.value}): {transition.message}; {then}.",
        events.WARNING,
    )
    if following is None:
        return await outcomes.retire(
            ctx, policy, name, state, f"{what.lower()} failed and no step is left", now
        )
    nxt = repair.State(
        policy=policy.name,
        cycle=state.cycle,
        step=following,
        phase=Phase.STEP,
        since=now,
        gpus=gpus,
        boot_id=reading.boot_id(ctx, name),
        job=repair.job_name(name, state.cycle, following),
        started=state.started,
        fault=state.fault,
        previous=repair.Done(step.name if step else "", kind, result, transition.message),
    )
    nxt = records.sealed(ctx, name, nxt)
    if not await records.write_state(ctx, name, nxt):
        return outcomes.Handled(NodeAction.REPAIRING)
    return await launch(visit.at(nxt), indexed=indexed)


async def launch(visit: Visit, *, indexed: Sequence[tuple[int | None, str]] = ()) -> outcomes.Handled | None:
    """Create the state's Job (written on the Node already) when the node is safe for it."""
    ctx, policy, spec, name, state, _, now = visit
    action = job_step.step_of(ctx, policy, spec, name, state)
    phase = outcomes.phase_action(state)
    why = await action.decide(now)
    if why is not None:
        logger.info("repair of node %s: %s waits: %s", name, action.name, why)
        if action.found is not None and action.found.pods:
            return await _while_busy(visit, action)
        return outcomes.Handled(phase)
    reading.stop_busy_wait(ctx, name)
    made = ctx.steps.repair.tokens.get(name)
    if made is None or made[0] != state.token:
        # Written by another process (a restart, an earlier leader) whose token died with it: a new one,
        # its hash on the Node first, so that the Job created now is still known by it after us.
        state = records.sealed(ctx, name, state)
        if not await records.write_state(ctx, name, state):
            return outcomes.Handled(phase)
        visit = visit.at(state)
        action = job_step.step_of(ctx, policy, spec, name, state)
    if state.phase is Phase.STEP and indexed:
        action = job_step.JobStep(
            ctx,
            policy,
            name,
            state,
            key=action.key,
            timeout_seconds=action.timeout_seconds,
            words=job_step.step_words(spec.steps[state.step], state, indexed),
        )
    step = spec.steps[state.step]
    if state.phase is Phase.STEP and step_kinds.of(step.action).gpus_free_first:
        # Nothing may hold the GPU open: the GPU Operator's operands leave, then the agent lets go.
        held = await _until_operands_gone(visit, action)
        if held is None:
            held = await _until_released(visit, action)
        if held is not None:
            return held
    try:
        created = await action.start(now)
    except jobs.StaleJob as error:
        logger.info("repair of node %s: %s waits: %s", name, action.name, error)
        return outcomes.Handled(phase)  # the next pass creates it (not a failed step)
    except jobs.TemplateError as error:
        return await failed(
            visit, repair.Transition(repair.Outcome.FAILED, Result.FAILED, f"no Job could be made: {error}")
        )
    except kube.ApiError as error:
        if not 400 <= error.status < 500 or error.status in (408, 429):
            raise  # transient: the next pass creates it (or adopts it)
        if repair_permission.refused(error.status, outcomes.api_message(error)):
            return await _refused(visit, action, error)
        return await failed(
            visit,
            repair.Transition(
                repair.Outcome.FAILED,
                Result.FAILED,
                f"Job {action.namespace}/{state.job} could not be created: {error.status} {error.reason}: "
                f"{outcomes.api_message(error)}",
            ),
        )
    repair_permission.note_permitted(ctx, policy.name)
    records.note(
        ctx,
        name,
        now,
        state,
        step=step.name,
        action=action.key,
        result=Result.STARTED,
        message=f"Job {action.namespace}/{state.job} {'created' if created else 'adopted'}",
        fault=state.fault if state.phase is Phase.STEP else "",
    )
    if state.phase is Phase.STEP:
        await ctx.recorder.emit_on(
            ctx.cache,
            name,
            vocabulary.EventReason.REPAIR_STARTED,
            f"Repair cycle {state.cycle} by policy {policy.name}: {action.name} started (Job "
            f"{action.namespace}/{state.job}, timeout {action.timeout_seconds:g}s)"
            f"{outcomes.cleared(ctx, name, state)}.",
        )
    else:
        logger.info("node %s: %s started (Job %s/%s)", name, action.name, action.namespace, state.job)
    return outcomes.Handled(phase)


async def _until_operands_gone(visit: Visit, action: job_step.JobStep) -> outcomes.Handled | None:
    """None: no operand of the GPU Operator holds the GPU (none on the node, or its pods left). Else
    the step waits (the labels turned off first, recorded), until its deadline: then it fails."""
    labels = await operands.pause(visit.ctx, visit.name)
    if labels is None:
        return outcomes.Handled(NodeAction.REPAIRING)  # the Node changed under the write: decided again
    left = await operands.holders(visit.ctx, visit.name, labels)
    if not left:
        return None
    return await _wait_or_fail(
        visit,
        action,
        waiting=f"for operand pods to leave: {left}",
        failure=f"GPU Operator operand pods stayed on the node for {action.timeout_seconds:g}s after their "
        f"labels were turned off ({', '.join(left)}), so no reset ran",
    )


# --- the agent lets go of the GPUs before a reset (issue 48, Deliver 1; `gpu_release`) --------------------


async def _until_released(visit: Visit, action: job_step.JobStep) -> outcomes.Handled | None:
    """None: the agent released the GPUs for this cycle, the reset may start. Else the step waits (the
    ask is written first), until its deadline from the step's start: then it fails, and the cycle moves
    on (a node whose agent is gone is not held for ever)."""
    stamp = repair.cycle_stamp(visit.state)
    if await gpu_release.ready(visit.ctx, visit.name, stamp):
        return None
    return await _wait_or_fail(
        visit,
        action,
        waiting="for the agent to release the GPUs",
        failure=f"the agent did not release the GPUs (status.agent.released) within "
        f"{action.timeout_seconds:g}s of the ask (GPUNode annotation "
        f"{keys.RELEASE_GPUS_ANNOTATION}={stamp}), so no reset ran",
    )


async def _wait_or_fail(
    visit: Visit,
    action: job_step.JobStep,
    *,
    waiting: str | None,
    failure: str,
    result: Result | None = Result.TIMED_OUT,
) -> outcomes.Handled | None:
    """The phase's Job may not start yet: it waits (`waiting`: what for, logged; None: say nothing) until
    its deadline, counted from the phase's start (Job or no Job, so nothing holds a maxConcurrent place for
    ever); then the phase fails with `failure` (`result`: None, the phase's own failed result)."""
    if times.seconds_between(visit.state.since, visit.now) < action.timeout_seconds:
        if waiting is not None:
            logger.info("repair of node %s: %s waits %s", visit.name, action.name, waiting)
        return outcomes.Handled(outcomes.phase_action(visit.state))
    return await _timed_out(visit, failure=failure, result=result)


async def _timed_out(visit: Visit, *, failure: str, result: Result | None) -> outcomes.Handled | None:
    """A wait before a phase's Job reached its deadline: the phase fails, the cycle moves on."""
    return await failed(visit, repair.Transition(repair.Outcome.FAILED, result, failure))


# --- no right to create Jobs (issue 45, leftover A): the install's state, not the node's failure -------


async def _refused(visit: Visit, action: job_step.JobStep, error: kube.ApiError) -> outcomes.Handled | None:
    """The Job API refused the create (403: no RBAC, the chart's `repair.enabled=false`; 404: no
    namespace). A cycle's first step is taken back — its state and its counted start go, the node stays
    Drained, no step counts — and tried again after `repair_permission.RETRY_SECONDS`. A later phase
    (the rights withdrawn mid-cycle) waits for them until its own deadline, then fails as a timeout
    would: the reset it follows did run. The policy says so once (`RepairPermitted`, one Event)."""
    ctx, policy, _, name, state, _, now = visit
    message = repair_permission.words(
        policy.name,
        action.namespace,
        state.job,
        status=error.status,
        reason=error.reason,
        api_message=outcomes.api_message(error),
    )
    if repair_permission.note_refused(ctx, policy.name, message, now):
        await ctx.recorder.emit_on(
            ctx.cache,
            name,
            vocabulary.EventReason.REMEDIATION_PAUSED,
            message,
            events.WARNING,
        )
    logger.warning("repair of node %s: %s", name, message)
    phase = outcomes.phase_action(state)
    if state.previous is None and state.phase is Phase.STEP:
        undone = await records.write_state(
            ctx,
            name,
            None,
            also={
                keys.REPAIR_CYCLES_ANNOTATION: repair.without_cycle(reading.cycles(ctx, name), state.cycle)
            },
        )
        if undone:
            ctx.steps.repair.tokens.pop(name, None)
        return outcomes.Handled(NodeAction.DRAINED if undone else phase)
    return await _wait_or_fail(
        visit,
        action,
        waiting=None,  # said above, and once by the policy
        failure=f"its Job could not be created for {action.timeout_seconds:g}s: {message}",
        result=Result.TIMED_OUT if state.phase is Phase.STEP else None,
    )


# --- a busy node (issue 45): no Job beside a workload pod, and no phase waits for ever --------------------


async def _while_busy(visit: Visit, action: job_step.JobStep) -> outcomes.Handled | None:
    """The phase's Job may not start: pods run on the node. Drain it again where the policy's drain
    evicts one, else wait for them; either way only until the phase's deadline (from its start, Job or
    no Job), then the phase fails, so a pod that never goes holds no maxConcurrent place for ever."""
    assert action.found is not None
    ctx, policy, _, name, state, _, now = visit
    found = action.found
    phase = outcomes.phase_action(state)
    step = workload_pods.while_busy(state.since, action.timeout_seconds, now, evictable=bool(found.evictable))
    if step is workload_pods.BusyStep.FAIL:
        reading.stop_busy_wait(ctx, name)
        message = (
            f"the node stayed busy for {action.timeout_seconds:g}s after the phase began, so no Job ran "
            f"beside its {workload_pods.words(found.pods)}"
        )
        return await _timed_out(visit, failure=message, result=None)
    await outcomes.say_busy(
        ctx,
        name,
        f"Repair cycle {state.cycle} by policy {policy.name}: {action.name}",
        found,
        state=state,
        action=action,
    )
    if step is workload_pods.BusyStep.DRAIN:
        drained = await draining.again(ctx, policy, name, now)
        return outcomes.Handled(NodeAction.DRAINING if drained is NodeAction.DRAINING else phase)
    return outcomes.Handled(phase)
