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
finds one drains again or waits, until its own deadline, `stepping`), or while the policy's fleet
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

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import (
    model,
    policies,
    repair,
    step_kinds,
)
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.ladder.repair import (
    job_step,
    jobs,
    operands,
    outcomes,
    reading,
    records,
    repair_permission,
    stepping,
)
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase


Handled = outcomes.Handled
"""Repair owns the node this pass (`outcomes.Handled`, named here as the ladder reads it)."""


# --- the cycle ---------------------------------------------------------------------------------------


async def take(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> outcomes.Handled | None:
    """Before the node ladder: a retired node stays so; a cycle of this policy in progress goes on.

    None: repair does not own the node this pass (the ladder decides as without repair).
    """
    record = ctx.cache.nodes.get(name)
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
        return outcomes.Handled(NodeAction.RETIRED) if view.cordoned_by == policy.name else None
    if not view.unschedulable or (
        view.cordoned_by == policy.name and verdict.wanted_action is not vocabulary.Action.DRAIN
    ):
        # A wait for maxConcurrent ends with the cordon, or the fault; with the cordon a wait for
        # workload pods too (`stepping.launch`).
        await reading.stop_waiting(ctx, name, busy=not view.unschedulable)
    written = view.annotations.get(keys.REPAIR_ANNOTATION)
    state = repair.parse(written) if written else None  # none written (nearly every pass): no cycle
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
    record = ctx.cache.nodes.get(name)
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
                await outcomes.say_busy(
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
            await outcomes.retire(
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
        return (
            await outcomes.retire(ctx, policy, name, None, why, now, fault=",".join(verdict.issues))
        ).action
    if not written or state is None:
        return NodeAction.DRAINED  # maxConcurrent repairs in progress (or the Node changed): it waits
    handled = await stepping.launch(
        stepping.Visit(ctx, policy, spec, name, state, verdict, now), indexed=indexed
    )
    return handled.action if handled is not None else NodeAction.DRAINED


async def _advance(  # noqa: PLR0917 - one pass's inputs
    ctx: context.Context,
    policy: model.Policy,
    spec: model.RepairSpec,
    name: str,
    state: repair.State,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
) -> outcomes.Handled | None:
    if state.step >= len(spec.steps):
        return await outcomes.retire(
            ctx, policy, name, state, "the policy's repair steps changed under the cycle", now
        )
    visit = stepping.Visit(ctx, policy, spec, name, state, verdict, now)
    step = spec.steps[state.step]
    action = job_step.step_of(ctx, policy, spec, name, state)
    job = await action.observe()
    records.fill_gaps(ctx, name, step.name, action, job)
    if job.phase is repair.JobPhase.MISSING and not records.started(ctx, name, state):
        return await stepping.launch(visit)  # written, never created
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
            return outcomes.Handled(NodeAction.VALIDATING)  # a Node condition not yet written since the boot
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
            if _check_failed(verdict) and not _validated(ctx, name, state):
                # Only this validation clears ActiveCheckFailed (`check_runs.check_failed`): record it now,
                # and return the node on a later pass, once the verdict is judged from a status that holds
                # the record (this pass writes it). Uncordoned first, the old failure would cordon again.
                _note_passed(ctx, name, now, state, step, action.key, transition.message)
                await ctx.recorder.emit_on(
                    ctx.cache,
                    name,
                    vocabulary.EventReason.VALIDATION_PASSED,
                    f"Validation after step {step.name} ({step.action.value}) passed: {transition.message}.",
                )
            return outcomes.Handled(NodeAction.VALIDATING)  # the verdict catches up with the report next pass
    kind = action.key
    subject = events.subject(ctx.cache, name)
    if transition.outcome is repair.Outcome.WAIT:
        if job.phase in (repair.JobPhase.SUCCEEDED, repair.JobPhase.FAILED) or state.phase is Phase.VALIDATE:
            await outcomes.reset_over(ctx, name)  # the reset is over: the agent reports its effect
        return outcomes.Handled(outcomes.phase_action(state))
    await outcomes.reset_over(ctx, name)
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
            return outcomes.Handled(NodeAction.REPAIRING)
        launched = await stepping.launch(visit.at(validating))
        return launched if launched is not None else outcomes.Handled(NodeAction.VALIDATING)
    if transition.outcome is repair.Outcome.PASSED:
        if not _validated(ctx, name, state):  # else recorded and said by the pass that cleared a check
            _note_passed(ctx, name, now, state, step, kind, transition.message)
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
            return outcomes.Handled(NodeAction.DRAINED)
        return outcomes.Handled(NodeAction.VALIDATING, returned=True)
    return await stepping.failed(visit, transition)


def _check_failed(verdict: model.NodeVerdict) -> bool:
    state = verdict.conditions.get(vocabulary.Condition.ACTIVE_CHECK_FAILED)
    return state is not None and state.status == "True"


def _validated(ctx: context.Context, name: str, state: repair.State) -> bool:
    """Whether the cycle's ValidationPassed is in the node's history already."""
    return any(
        e.get("cycle") == state.cycle and e.get("result") == Result.VALIDATION_PASSED
        for e in reading.history(ctx, name)
    )


def _note_passed(  # noqa: PLR0917 - the entry's parts
    ctx: context.Context,
    name: str,
    now: datetime.datetime,
    state: repair.State,
    step: model.RepairStep,
    kind: str,
    message: str,
) -> None:
    records.note(
        ctx, name, now, state, step=step.name, action=kind, result=Result.VALIDATION_PASSED, message=message
    )


async def cancel(
    ctx: context.Context, name: str, state: repair.State, why: str, now: datetime.datetime
) -> None:
    """Stop the cycle: delete its Job, remove the state, record Cancelled, say so."""
    ns = reading.namespace(ctx)
    deleted = await jobs.delete(ctx.client, ns, state.job)
    await outcomes.reset_over(ctx, name)
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
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
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
