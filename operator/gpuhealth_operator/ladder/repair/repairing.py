"""Repair (`spec.repair`, DESIGN.md "Repair", safety rule 8): drained → step → effect → validation → return.

Once a policy's own drain of a node completed (status Drained) and the fault still wants the drain,
`begin` starts a repair cycle: under the admission lock it counts the repairs in progress (every
node with the repair annotation, all policies) against maxConcurrent and the node's cycles in the
attempt window (GPUNode `status.repairs[]`) against maxAttempts, writes the cycle's state on the Node
(`keys.REPAIR_ANNOTATION`, resourceVersion precondition) and creates the step's Job. From then on
`take` owns the node, on every pass (the timer visits a cordoned node every tick, and reads the
Job each time: polling, not a Job watch): it reads the Job and the agent's latest report, asks
`decisions.repair` what they mean and does it — the next step, the validation Job, a validated
return (remediation uncordons at once, no healthyForSeconds wait), or retire (label
`gpuhealth.io/needs-repair=manual`, still cordoned, Event NodeRetired).

A cycle is cancelled (its Job deleted, the annotation removed, Event RemediationPaused) when a human
makes the node schedulable (an override), the node is excluded, the policy is deleted, switched to
dry run, stops selecting the node or loses `spec.repair` (`sweep`, every timer pass, and `take`).
No step's Job is created on a busy node (a workload pod, `decisions.workload_pods`: a phase that
finds one drains again or waits, until its own deadline, `_while_busy`), or while the policy's fleet
circuit breaker holds disruptions back (a running step is still observed). A Job that cannot be created
(4xx: RBAC, quota, admission, an invalid template) fails its step with the API server's words and
the cycle moves to the next step: each step is tried once per cycle, so it never loops.

A restarted or new leader resumes from the annotation: the Job's name is derived from the node,
the cycle and the step (`repair.job_name`), so it adopts the Job it finds (a create meets 409)
and never starts a second one.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Sequence

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import (
    model,
    policies,
    repair,
    step_kinds,
    times,
    workload_pods,
)
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.ladder.repair import (
    gpu_release,
    job_step,
    jobs,
    operands,
    reading,
    records,
    repair_permission,
)
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase


@dataclasses.dataclass(frozen=True)
class Handled:
    """Repair owns the node this pass: the status action; `returned`: validated, uncordon it now."""

    action: NodeAction
    returned: bool = False


# --- the cycle ---------------------------------------------------------------------------------------


async def take(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> Handled | None:
    """Before the node ladder: a retired node stays so; a cycle of this policy in progress goes on.

    None: repair does not own the node this pass (the ladder decides as without repair).
    """
    record = ctx.cache.node(name)
    if record is None:
        return None
    view = record.view
    if view.labels.get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL:
        # A human returned it (a new node that failed its validation: by removing the taint): the mark goes.
        if not view.unschedulable and keys.UNVALIDATED_TAINT not in view.taint_keys:
            ctx.cache.refresh_node(await jobs.clear_retired(ctx.client, name))
            logger.info(
                "retired node %s was made schedulable by a human: label %s removed",
                name,
                keys.NEEDS_REPAIR_LABEL,
            )
            return None
        return Handled(NodeAction.RETIRED) if view.cordoned_by == policy.name else None
    if not view.unschedulable or (
        view.cordoned_by == policy.name and verdict.wanted_action is not vocabulary.Action.DRAIN
    ):
        await reading.stop_waiting(ctx, name)  # a wait for maxConcurrent ends with the cordon, or the fault
    if not view.unschedulable:
        reading.stop_busy_wait(ctx, name)  # a wait for workload pods too (a cycle's ends in `_launch`)
    state = repair.parse(view.annotations.get(keys.REPAIR_ANNOTATION))
    if state is None and keys.OPERANDS_PAUSED_ANNOTATION in view.annotations:
        await operands.restore(ctx, name)  # a cycle that ended without it (a kill -9 between)
    if state is None or state.policy != policy.name:
        return None  # none, or another policy's (`sweep` cancels it when that policy is gone)
    why = reading.cancel_reason(ctx, state, name)
    if why is not None:
        await cancel(ctx, name, state, why, now)
        return None
    assert policy.repair is not None  # cancel_reason checked it
    return await _advance(ctx, policy, policy.repair, name, state, verdict, now)


async def begin(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> NodeAction:
    """The policy drained the node for a fault that still wants the drain: start a repair cycle, wait for
    maxConcurrent (Drained), or retire the node (maxAttempts cycles in the window, or no step applies)."""
    spec = policy.repair
    record = ctx.cache.node(name)
    if spec is None or record is None or verdict.wanted_action is not vocabulary.Action.DRAIN:
        return NodeAction.DRAINED
    if keys.REPAIR_ANNOTATION in record.view.annotations or record.view.cordoned_by != policy.name:
        return NodeAction.DRAINED  # another policy's cycle, or not ours
    if policy.dry_run or stopping.why_stop(ctx, policy.name, name) is not None:
        return NodeAction.DRAINED
    if ctx.breakers.paused(policy.name) is not None:
        return NodeAction.DRAINED  # no new step while the breaker holds disruptions back
    if not repair_permission.may_try(ctx, policy.name, now):
        return NodeAction.DRAINED  # the Job API refused the policy's last create: tried again later
    indexed = reading.reset_gpus(ctx, name, reading.faulty_gpus(ctx, policy, name, verdict))
    gpus = tuple(u for _, u in indexed)
    past = reading.history(ctx, name)
    started = reading.cycles(ctx, name)
    first = repair.first_step(spec, gpus, reading.recovery_actions(ctx, name))
    state: repair.State | None = None
    if first is not None:
        cycle = repair.next_cycle(past, started)
        state = repair.State(
            policy=policy.name,
            cycle=cycle,
            step=first,
            phase=Phase.STEP,
            since=now,
            gpus=gpus,
            boot_id=reading.boot_id(ctx, name),
            job=repair.job_name(name, cycle, first),
            started=now,
            fault=",".join(verdict.issues),
        )
        state = records.sealed(ctx, name, state)
        first_step = job_step.step_of(ctx, policy, spec, name, state)
        why = await first_step.decide(now)
        if why is not None:
            logger.info("repair of node %s by policy %s waits: %s", name, policy.name, why)
            if first_step.found is not None and first_step.found.pods:
                await _say_busy(
                    ctx, name, f"Repair of the drained node by policy {policy.name}", first_step.found
                )
            return NodeAction.DRAINED
        reading.stop_busy_wait(ctx, name)
    async with ctx.admission.lock:  # one count of repairs in progress at a time, with the budgets'
        selected = len(ctx.cache.selection(policy).selected)
        limit = policies.resolve_max_concurrent(spec, selected)
        decision = repair.may_start(
            spec,
            history=past,
            in_progress=reading.in_progress(ctx),
            limit=limit,
            gpus=gpus,
            now=now,
            started=started,
        )
        written = (
            decision is repair.Start.GO
            and state is not None
            and await records.write_state(  # the cycle's start is counted before its first Job exists
                ctx,
                name,
                state,
                also={keys.REPAIR_CYCLES_ANNOTATION: repair.with_cycle(started, state.cycle, now)},
            )
        )
    if decision is repair.Start.WAIT:
        await reading.say_waiting(ctx, policy, name, verdict, limit)
        return NodeAction.DRAINED
    await reading.stop_waiting(ctx, name)
    if decision is repair.Start.RETIRE:
        count = repair.cycles_in_window(past, now, spec.attempt_window_seconds, started)
        return (
            await _retire(
                ctx,
                policy,
                name,
                None,
                f"a fault again after {count} repair cycle(s) within {spec.attempt_window_seconds:g}s "
                f"(maxAttempts {spec.max_attempts})",
                now,
                fault=",".join(verdict.issues),
            )
        ).action
    if decision is repair.Start.NOTHING:
        why = "no step applies: ResetGPU needs the faulty GPUs' UUIDs and none is known (a node-wide fault)"
        return (await _retire(ctx, policy, name, None, why, now, fault=",".join(verdict.issues))).action
    if not written or state is None:
        return NodeAction.DRAINED  # maxConcurrent repairs in progress (or the Node changed): it waits
    handled = await _launch(ctx, policy, spec, name, state, verdict, now, indexed=indexed)
    return handled.action if handled is not None else NodeAction.DRAINED


async def _advance(  # noqa: PLR0917 - one pass's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
) -> Handled | None:
    if state.step >= len(spec.steps):
        return await _retire(
            ctx, policy, name, state, "the policy's repair steps changed under the cycle", now
        )
    step = spec.steps[state.step]
    action = job_step.step_of(ctx, policy, spec, name, state)
    job = await action.observe()
    records.fill_gaps(ctx, name, step.name, action, job)
    if job.phase is repair.JobPhase.MISSING and not records.started(ctx, name, state):
        return await _launch(ctx, policy, spec, name, state, verdict, now)  # written, never created
    seen = reading.report(ctx, policy, name, now, state)
    if state.phase is Phase.STEP:
        transition = repair.observe_step(
            state,
            step,
            job,
            seen,
            now,
            finished_seen=records.finished_seen(ctx, name, state, job, ctx.clock()),
        )
    else:
        transition = repair.observe_validation(state, spec.validation_timeout_seconds or 0.0, job, now)
        if transition.outcome is repair.Outcome.PASSED and not seen.judged:
            return Handled(NodeAction.VALIDATING)  # a Node condition not yet written since the boot
        if transition.outcome is repair.Outcome.PASSED and not seen.fault_gone:
            transition = repair.Transition(
                repair.Outcome.FAILED,
                Result.VALIDATION_FAILED,
                f"{transition.message}, but the agent reports the fault again",
            )
        if transition.outcome is repair.Outcome.PASSED and (
            verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS
            or verdict.health not in (vocabulary.Health.HEALTHY, vocabulary.Health.DEGRADED)
        ):
            return Handled(NodeAction.VALIDATING)  # the verdict catches up with the report next pass
    kind = action.key
    subject = events.subject(ctx.cache, name)
    if transition.outcome is repair.Outcome.WAIT:
        if job.phase in (repair.JobPhase.SUCCEEDED, repair.JobPhase.FAILED) or state.phase is Phase.VALIDATE:
            await _reset_over(ctx, name)  # the reset is over: the agent reports its effect
        return Handled(_phase_action(state))
    await _reset_over(ctx, name)
    if job.phase is repair.JobPhase.ACTIVE:
        await action.undo()  # timed out, or a reboot's pod that outlived the boot: never beside the next Job
    if transition.outcome is repair.Outcome.EFFECT:
        records.note(
            ctx,
            name,
            now,
            state,
            step=step.name,
            action=kind,
            result=Result.SUCCEEDED,
            message=transition.message,
        )
        if spec.validation_timeout_seconds is None:
            if await records.write_state(ctx, name, None):
                records.observe_duration(ctx, state, "returned", now)
                await ctx.recorder.emit(
                    subject,
                    vocabulary.EventReason.REPAIR_SUCCEEDED,
                    f"Repair cycle {state.cycle} by policy {policy.name}: {action.name} worked "
                    f"({transition.message}); no validation is configured, so the node returns to service "
                    f"after {policy.recovery_healthy_for_seconds:g}s of health.",
                )
            return None
        validating = records.sealed(
            ctx,
            name,
            dataclasses.replace(
                state,
                phase=Phase.VALIDATE,
                since=now,
                boot_id=reading.boot_id(ctx, name),
                job=repair.job_name(name, state.cycle, state.step, validation=True),
                previous=repair.Done(step.name, kind, Result.SUCCEEDED, transition.message),
            ),
        )
        if not await records.write_state(ctx, name, validating):
            return Handled(NodeAction.REPAIRING)
        launched = await _launch(ctx, policy, spec, name, validating, verdict, now)
        return launched if launched is not None else Handled(NodeAction.VALIDATING)
    if transition.outcome is repair.Outcome.PASSED:
        records.note(
            ctx,
            name,
            now,
            state,
            step=step.name,
            action=kind,
            result=Result.VALIDATION_PASSED,
            message=transition.message,
        )
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.VALIDATION_PASSED,
            f"Validation after step {step.name} ({step.action.value}) passed: {transition.message}.",
        )
        records.observe_duration(ctx, state, "returned", now)
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.REPAIR_SUCCEEDED,
            f"Repair cycle {state.cycle} by policy {policy.name} succeeded: step {step.name} "
            f"({step.action.value}) and validation; "
            + (
                "the node returns to service now."
                if policy.recovery_uncordon
                else "recovery.uncordon is false: the node stays cordoned for a human to return."
            ),
        )
        if not policy.recovery_uncordon:
            await records.write_state(ctx, name, None)
            return Handled(NodeAction.DRAINED)
        return Handled(NodeAction.VALIDATING, returned=True)
    return await _failed(ctx, policy, spec, name, state, verdict, transition, now)


async def _failed(  # noqa: PLR0917 - one failure's context
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    transition: repair.Transition,
    now: datetime.datetime,
) -> Handled | None:
    """A step or validation failed: say so, then the next step, or retire."""
    await _reset_over(ctx, name)  # no reset runs now: the agent and the operands take the GPUs back
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
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.VALIDATION_FAILED if validating else vocabulary.EventReason.REPAIR_FAILED,
        f"{what} failed ({result.value}): {transition.message}; {then}.",
        events.WARNING,
    )
    if following is None:
        return await _retire(ctx, policy, name, state, f"{what.lower()} failed and no step is left", now)
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
        return Handled(NodeAction.REPAIRING)
    return await _launch(ctx, policy, spec, name, nxt, verdict, now, indexed=indexed)


async def _launch(  # noqa: PLR0917 - one launch's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
    *,
    indexed: Sequence[tuple[int | None, str]] = (),
) -> Handled | None:
    """Create the state's Job (written on the Node already) when the node is safe for it."""
    action = job_step.step_of(ctx, policy, spec, name, state)
    phase = _phase_action(state)
    why = await action.decide(now)
    if why is not None:
        logger.info("repair of node %s: %s waits: %s", name, action.name, why)
        if action.found is not None and action.found.pods:
            return await _while_busy(ctx, policy, spec, name, state, verdict, action, now)
        return Handled(phase)
    reading.stop_busy_wait(ctx, name)
    made = ctx.steps.repair.tokens.get(name)
    if made is None or made[0] != state.token:
        # Written by another process (a restart, an earlier leader) whose token died with it: a new one,
        # its hash on the Node first, so that the Job created now is still known by it after us.
        state = records.sealed(ctx, name, state)
        if not await records.write_state(ctx, name, state):
            return Handled(phase)
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
        held = await _until_operands_gone(ctx, policy, spec, name, state, verdict, action, now)
        if held is None:
            held = await _until_released(ctx, policy, spec, name, state, verdict, action, now)
        if held is not None:
            return held
    try:
        created = await action.start(now)
    except jobs.StaleJob as error:
        logger.info("repair of node %s: %s waits: %s", name, action.name, error)
        return Handled(phase)  # the next pass creates it (not a failed step)
    except jobs.TemplateError as error:
        return await _failed(
            ctx,
            policy,
            spec,
            name,
            state,
            verdict,
            repair.Transition(repair.Outcome.FAILED, Result.FAILED, f"no Job could be made: {error}"),
            now,
        )
    except kube.ApiError as error:
        if not 400 <= error.status < 500 or error.status in (408, 429):
            raise  # transient: the next pass creates it (or adopts it)
        if repair_permission.refused(error.status, _api_message(error)):
            return await _refused(ctx, policy, spec, name, state, verdict, action, error, now)
        return await _failed(
            ctx,
            policy,
            spec,
            name,
            state,
            verdict,
            repair.Transition(
                repair.Outcome.FAILED,
                Result.FAILED,
                f"Job {action.namespace}/{state.job} could not be created: {error.status} {error.reason}: "
                f"{_api_message(error)}",
            ),
            now,
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
        await ctx.recorder.emit(
            events.subject(ctx.cache, name),
            vocabulary.EventReason.REPAIR_STARTED,
            f"Repair cycle {state.cycle} by policy {policy.name}: {action.name} started (Job "
            f"{action.namespace}/{state.job}, timeout {action.timeout_seconds:g}s)"
            f"{_cleared(ctx, name, state)}.",
        )
    else:
        logger.info("node %s: %s started (Job %s/%s)", name, action.name, action.namespace, state.job)
    return Handled(phase)


# --- the GPU Operator's operands step aside for a reset (issue 48, Deliver 2; `operands`) -----------------


def _cleared(ctx: context.Context, name: str, state: repair.State) -> str:
    """What a reset waited for (said in its RepairStarted): the operands paused, the agent's release."""
    if state.phase is not Phase.STEP:
        return ""
    said = []
    labels = operands.paused(ctx, name)
    if labels:
        said.append("the GPU Operator's " + ", ".join(k.rsplit(".", 1)[1] for k in labels) + " left")
    if gpu_release.released(ctx, name) is not None:
        said.append("the agent released the GPUs")
    return f" after {' and '.join(said)}" if said else ""


async def _reset_over(ctx: context.Context, name: str) -> None:
    """No reset runs (any more) on the node: the agent takes the GPUs back, the operands we paused
    come back (only those still ours)."""
    await gpu_release.end(ctx, name)
    await operands.restore(ctx, name)


async def _until_operands_gone(  # noqa: PLR0917 - one wait's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    action: job_step.JobStep,
    now: datetime.datetime,
) -> Handled | None:
    """None: no operand of the GPU Operator holds the GPU (none on the node, or its pods left). Else
    the step waits (the labels turned off first, recorded), until its deadline: then it fails."""
    labels = await operands.pause(ctx, name)
    if labels is None:
        return Handled(NodeAction.REPAIRING)  # the Node changed under the write: decided again
    left = await operands.holders(ctx, name, labels)
    if not left:
        return None
    return await _wait_or_fail(
        ctx,
        policy,
        spec,
        name,
        state,
        verdict,
        action,
        now,
        waiting=f"for operand pods to leave: {left}",
        failure=f"GPU Operator operand pods stayed on the node for {action.timeout_seconds:g}s after their "
        f"labels were turned off ({', '.join(left)}), so no reset ran",
    )


# --- the agent lets go of the GPUs before a reset (issue 48, Deliver 1; `gpu_release`) --------------------


async def _until_released(  # noqa: PLR0917 - one wait's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    action: job_step.JobStep,
    now: datetime.datetime,
) -> Handled | None:
    """None: the agent released the GPUs for this cycle, the reset may start. Else the step waits (the
    ask is written first), until its deadline from the step's start: then it fails, and the cycle moves
    on (a node whose agent is gone is not held for ever)."""
    stamp = repair.cycle_stamp(state)
    if await gpu_release.ready(ctx, name, stamp):
        return None
    return await _wait_or_fail(
        ctx,
        policy,
        spec,
        name,
        state,
        verdict,
        action,
        now,
        waiting="for the agent to release the GPUs",
        failure=f"the agent did not release the GPUs (status.agent.released) within "
        f"{action.timeout_seconds:g}s of the ask (GPUNode annotation "
        f"{keys.RELEASE_GPUS_ANNOTATION}={stamp}), so no reset ran",
    )


# --- the one shape of every wait before a phase's Job: wait until the phase's deadline, then fail ---------


def _phase_action(state: repair.State) -> NodeAction:
    """The status action while the state's phase waits or runs."""
    return NodeAction.REPAIRING if state.phase is Phase.STEP else NodeAction.VALIDATING


async def _wait_or_fail(  # noqa: PLR0917 - one wait's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    action: job_step.JobStep,
    now: datetime.datetime,
    *,
    waiting: str | None,
    failure: str,
    result: Result | None = Result.TIMED_OUT,
) -> Handled | None:
    """The phase's Job may not start yet: it waits (`waiting`: what for, logged; None: say nothing) until
    its deadline, counted from the phase's start (Job or no Job, so nothing holds a maxConcurrent place for
    ever); then the phase fails with `failure` (`result`: None, the phase's own failed result)."""
    if times.seconds_between(state.since, now) < action.timeout_seconds:
        if waiting is not None:
            logger.info("repair of node %s: %s waits %s", name, action.name, waiting)
        return Handled(_phase_action(state))
    return await _timed_out(ctx, policy, spec, name, state, verdict, now, failure=failure, result=result)


async def _timed_out(  # noqa: PLR0917 - one failure's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
    *,
    failure: str,
    result: Result | None,
) -> Handled | None:
    """A wait before a phase's Job reached its deadline: the phase fails, the cycle moves on."""
    transition = repair.Transition(repair.Outcome.FAILED, result, failure)
    return await _failed(ctx, policy, spec, name, state, verdict, transition, now)


# --- no right to create Jobs (issue 45, leftover A): the install's state, not the node's failure -------


async def _refused(  # noqa: PLR0917 - one refusal's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    action: job_step.JobStep,
    error: kube.ApiError,
    now: datetime.datetime,
) -> Handled | None:
    """The Job API refused the create (403: no RBAC, the chart's `repair.enabled=false`; 404: no
    namespace). A cycle's first step is taken back — its state and its counted start go, the node stays
    Drained, no step counts — and tried again after `repair_permission.RETRY_SECONDS`. A later phase
    (the rights withdrawn mid-cycle) waits for them until its own deadline, then fails as a timeout
    would: the reset it follows did run. The policy says so once (`RepairPermitted`, one Event)."""
    message = repair_permission.words(
        policy.name,
        action.namespace,
        state.job,
        status=error.status,
        reason=error.reason,
        api_message=_api_message(error),
    )
    if repair_permission.note_refused(ctx, policy.name, message, now):
        await ctx.recorder.emit(
            events.subject(ctx.cache, name),
            vocabulary.EventReason.REMEDIATION_PAUSED,
            message,
            events.WARNING,
        )
    logger.warning("repair of node %s: %s", name, message)
    phase = _phase_action(state)
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
        return Handled(NodeAction.DRAINED if undone else phase)
    return await _wait_or_fail(
        ctx,
        policy,
        spec,
        name,
        state,
        verdict,
        action,
        now,
        waiting=None,  # said above, and once by the policy
        failure=f"its Job could not be created for {action.timeout_seconds:g}s: {message}",
        result=Result.TIMED_OUT if state.phase is Phase.STEP else None,
    )


# --- a busy node (issue 45): no Job beside a workload pod, and no phase waits for ever --------------------


async def _while_busy(  # noqa: PLR0917 - one wait's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    action: job_step.JobStep,
    now: datetime.datetime,
) -> Handled | None:
    """The phase's Job may not start: pods run on the node. Drain it again where the policy's drain
    evicts one, else wait for them; either way only until the phase's deadline (from its start, Job or
    no Job), then the phase fails, so a pod that never goes holds no maxConcurrent place for ever."""
    assert action.found is not None
    found = action.found
    phase = _phase_action(state)
    step = workload_pods.while_busy(state.since, action.timeout_seconds, now, evictable=bool(found.evictable))
    if step is workload_pods.BusyStep.FAIL:
        reading.stop_busy_wait(ctx, name)
        message = (
            f"the node stayed busy for {action.timeout_seconds:g}s after the phase began, so no Job ran "
            f"beside its {workload_pods.words(found.pods)}"
        )
        return await _timed_out(ctx, policy, spec, name, state, verdict, now, failure=message, result=None)
    await _say_busy(
        ctx,
        name,
        f"Repair cycle {state.cycle} by policy {policy.name}: {action.name}",
        found,
        state=state,
        action=action,
    )
    if step is workload_pods.BusyStep.DRAIN:
        drained = await draining.again(ctx, policy, name, now)
        return Handled(NodeAction.DRAINING if drained is NodeAction.DRAINING else phase)
    return Handled(phase)


async def _say_busy(
    ctx: context.Context,
    name: str,
    what: str,
    found: reading.Busy,
    *,
    state: repair.State | None = None,
    action: job_step.JobStep | None = None,
) -> None:
    """Say once per wait (Event RemediationPaused) which pods hold the repair back, and until when."""
    if name in ctx.steps.repair.busy_said:
        return
    ctx.steps.repair.busy_said.add(name)
    then = (
        "the drain evicts them first"
        if found.evictable
        else "they are pods the policy's drain leaves (no controller without drain.force, emptyDir data, "
        "an excluded namespace) or that ignore the cordon"
    )
    if state is not None and action is not None:
        deadline = state.since + datetime.timedelta(seconds=action.timeout_seconds)
        until = f"; the phase fails at {times.render(deadline)} if they stay"
    else:
        until = "; it starts once they are gone"
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.REMEDIATION_PAUSED,
        f"{what} waits: {workload_pods.words(found.pods)} — no repair or validation Job runs beside a "
        f"workload; {then}{until}.",
    )


def _api_message(error: kube.ApiError) -> str:
    import json  # noqa: PLC0415 - only for a refused create

    try:
        body = json.loads(error.body)
    except ValueError:
        return error.body[:300]
    return str(body.get("message") or error.body)[:300] if isinstance(body, dict) else error.body[:300]


async def _retire(  # noqa: PLR0917 - one retire's inputs
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    state: repair.State | None,
    why: str,
    now: datetime.datetime,
    fault: str = "",
) -> Handled:
    """Give up: label needs-repair=manual, the cordon stays, the repair state goes; say so. The Retired
    entry names the fault that began the cycle (`fault`, else the state's): a retired node may report
    healthy by now, and a human needs to know what it was retired for."""
    if not await records.write_state(ctx, name, None, retired=True):
        return Handled(NodeAction.REPAIRING if state is not None else NodeAction.DRAINED)
    await _reset_over(ctx, name)
    cycle = (
        state.cycle
        if state is not None
        else repair.next_cycle(reading.history(ctx, name), reading.cycles(ctx, name)) - 1
    )
    record = repair.State(
        policy=policy.name,
        cycle=max(cycle, 0),
        step=0,
        phase=Phase.STEP,
        since=now,
        gpus=state.gpus if state is not None else (),
        boot_id=None,
        job="",
    )
    records.note(
        ctx,
        name,
        now,
        record,
        step="",
        action="",
        result=Result.RETIRED,
        message=why,
        fault=fault or (state.fault if state is not None else ""),
    )
    if state is not None:
        records.observe_duration(ctx, state, "retired", now)
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.NODE_RETIRED,
        f"Repair by policy {policy.name} gave up on the node: {why}. It stays cordoned with label "
        f"{keys.NEEDS_REPAIR_LABEL}={keys.NEEDS_REPAIR_MANUAL} until a human returns it "
        f"(kubectl uncordon {name}).",
        events.WARNING,
    )
    return Handled(NodeAction.RETIRED)


async def cancel(
    ctx: context.Context, name: str, state: repair.State, why: str, now: datetime.datetime
) -> None:
    """Stop the cycle: delete its Job, remove the state, record Cancelled, say so."""
    ns = reading.namespace(ctx)
    deleted = await jobs.delete(ctx.client, ns, state.job)
    await _reset_over(ctx, name)
    if not await records.write_state(ctx, name, None):
        return  # changed meanwhile: the next pass decides again
    reading.stop_busy_wait(ctx, name)  # a busy wait said ends with its cycle
    kind = vocabulary.VALIDATION_JOB if state.phase is Phase.VALIDATE else ""
    policy = ctx.cache.policies.get(state.policy)
    if (
        not kind
        and policy is not None
        and policy.repair is not None
        and state.step < len(policy.repair.steps)
    ):
        kind = policy.repair.steps[state.step].action.value
    records.note(
        ctx, name, now, state, step="", action=kind, result=Result.CANCELLED, message=f"cancelled: {why}"
    )
    records.observe_duration(ctx, state, "cancelled", now)
    gone = "deleted" if deleted else "already gone"
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.REMEDIATION_PAUSED,
        f"Repair cycle {state.cycle} by policy {state.policy} cancelled: {why}. Its Job {ns}/{state.job} "
        f"is {gone}; no further repair step runs.",
        events.WARNING,
    )


async def sweep(ctx: context.Context, now: datetime.datetime) -> list[str]:
    """Cancel every cycle that must stop (the timer's pass): nodes a reconcile no longer reaches
    (excluded, no longer selected, the policy deleted or in dry run) included. The nodes cancelled: no
    pass may write their status (an excluded node's), so the caller writes their history."""
    cancelled: list[str] = []
    for name in ctx.cache.in_node_order(ctx.cache.repairing):  # the annotated nodes, not the fleet
        async with ctx.node_locks[name]:
            state = reading.state_of(ctx, name)
            if state is None:
                continue
            why = reading.cancel_reason(ctx, state, name)
            if why is not None:
                try:
                    await cancel(ctx, name, state, why, now)
                except kube.ApiError:
                    logger.warning(
                        "cancelling the repair of node %s failed (will retry)", name, exc_info=True
                    )
                else:
                    cancelled.append(name)
    return cancelled


def dry_run_note(ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict) -> str:
    """What repair would do after the drain a dry run describes ("" when nothing)."""
    spec = policy.repair
    if spec is None or verdict.wanted_action is not vocabulary.Action.DRAIN:
        return ""
    indexed = reading.reset_gpus(ctx, name, reading.faulty_gpus(ctx, policy, name, verdict))
    first = repair.first_step(spec, [u for _, u in indexed], reading.recovery_actions(ctx, name))
    if first is None:
        return " Repair would retire the node: no step applies (no faulty GPU's UUID is known)."
    step = spec.steps[first]
    doing = step_kinds.of(step.action).doing.format(gpus=repair.gpu_words(indexed))
    then = ", then validate" if spec.validation_timeout_seconds is not None else ""
    return f" Repair would then {doing} (step {step.name}, {step.action.value}){then}."
