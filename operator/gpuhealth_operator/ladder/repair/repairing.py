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
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain, events, kube, nodes
from gpuhealth_operator.decisions import (
    hostengine,
    isolation,
    model,
    policies,
    repair,
    signals,
    step_kinds,
    times,
    trends,
    workload_pods,
)
from gpuhealth_operator.ladder import node_patches, stopping
from gpuhealth_operator.ladder.drain import draining
from gpuhealth_operator.ladder.repair import gpu_release, jobs, operands, repair_permission
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase
STATUS_FIELD: Final = "repairs"
PACKAGED_KEY: Final = ""
"""The `repair_templates` key of the packaged templates."""


@dataclasses.dataclass(frozen=True)
class Handled:
    """Repair owns the node this pass: the status action; `returned`: validated, uncordon it now."""

    action: NodeAction
    returned: bool = False


# --- reading -----------------------------------------------------------------------------------------


def state_of(ctx: context.Context, name: str) -> repair.State | None:
    record = ctx.cache.node(name)
    return repair.parse(record.view.annotations.get(keys.REPAIR_ANNOTATION)) if record is not None else None


def cycles(ctx: context.Context, name: str) -> repair.Cycles:
    """The node's recent cycle starts (`keys.REPAIR_CYCLES_ANNOTATION`): what maxAttempts counts."""
    record = ctx.cache.node(name)
    return repair.parse_cycles(record.view.annotations.get(keys.REPAIR_CYCLES_ANNOTATION) if record else None)


def history(ctx: context.Context, name: str) -> list[dict[str, Any]]:
    """The node's `status.repairs[]`: as this process last made it, else as stored."""
    made = ctx.repair_history.get(name)
    if made is not None:
        return made
    gpunode = ctx.cache.gpunode(name)
    stored = gpunode.status.get(STATUS_FIELD) if gpunode is not None else None
    return [dict(e) for e in stored if isinstance(e, Mapping)] if isinstance(stored, list) else []


def status_fields(ctx: context.Context, name: str) -> dict[str, Any]:
    """The GPUNode status field of repair (kept in every status write: it is ours under server-side apply)."""
    listed = history(ctx, name)
    return {STATUS_FIELD: listed} if listed else {}


@dataclasses.dataclass(frozen=True)
class Busy:
    """The pods that make a node busy (`decisions.workload_pods`), and those of them the policy's drain
    evicts: no repair step, validation or new-node validation starts beside any of `pods`."""

    pods: list[kube.JsonObject]
    evictable: list[kube.JsonObject]


async def busy(ctx: context.Context, policy: model.Policy, name: str) -> Busy:
    """What runs on the node that repair must not run beside, whatever the drain's skip rules."""
    found = [dict(p) for p in workload_pods.busy(await drain.list_pods(ctx.client, name), namespace(ctx))]
    return Busy(found, drain.classify(found, ctx.drain_options(policy)).wanted)


async def workload(ctx: context.Context, policy: model.Policy, name: str) -> list[kube.JsonObject]:
    """The pods that make the node busy (`busy`)."""
    return (await busy(ctx, policy, name)).pods


def in_progress(ctx: context.Context) -> int:
    """Repairs in progress, all policies: nodes with the repair annotation."""
    return len(holders(ctx))


def holders(ctx: context.Context) -> list[str]:
    """The nodes with a repair in progress (all policies) or a new node's validation Job running
    (`new_nodes`): they hold maxConcurrent places."""
    repairing = {n for n, r in ctx.cache.nodes.items() if keys.REPAIR_ANNOTATION in r.view.annotations}
    return sorted(repairing | ctx.validations_running)


async def _stop_waiting(ctx: context.Context, name: str) -> None:
    """The wait for maxConcurrent ended: forget it, and its mark on the Node (written when it was said)."""
    ctx.repair_waiting.discard(name)
    record = ctx.cache.node(name)
    if record is not None and keys.REPAIR_WAITING_ANNOTATION in record.view.annotations:
        body = await nodes.patch_metadata(
            ctx.client, name, annotations={keys.REPAIR_WAITING_ANNOTATION: None}
        )
        ctx.cache.refresh_node(body)


def _stop_busy_wait(ctx: context.Context, name: str) -> None:
    ctx.repair_busy_said.discard(name)


async def _say_waiting(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, limit: int
) -> None:
    """Say once per wait (an Event on the node) that its repair waits for maxConcurrent, and for whom.
    Once per wait, not per process: the Node keeps the mark (`keys.REPAIR_WAITING_ANNOTATION`), written
    after the Event (a crash between says it twice, never not at all)."""
    if name in ctx.repair_waiting:
        return
    ctx.repair_waiting.add(name)
    record = ctx.cache.node(name)
    if record is None or record.view.annotations.get(keys.REPAIR_WAITING_ANNOTATION) == policy.name:
        return  # said by an earlier process (a restart, a leader change)
    issues = ", ".join(verdict.issues) or "a fault"
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.BUDGET_EXCEEDED,
        f"Policy {policy.name} would repair the drained node ({issues}) but "
        f"{repair.wait_words(limit, holders(ctx))}; it waits, drained, for a place.",
    )
    body = await nodes.patch_metadata(
        ctx.client, name, annotations={keys.REPAIR_WAITING_ANNOTATION: policy.name}
    )
    ctx.cache.refresh_node(body)


def namespace(ctx: context.Context) -> str:
    if ctx.config.repair_namespace:
        return ctx.config.repair_namespace
    if ctx.config.repair_templates:
        return ctx.config.repair_templates.split("/", 1)[0]
    return jobs.DEFAULT_NAMESPACE


async def templates(ctx: context.Context, now: datetime.datetime) -> dict[str, dict[str, Any]]:
    """The Job templates (`--repair-templates`, else packaged); TemplateError says why none."""
    where = ctx.config.repair_templates
    if not where:
        return await ctx.repair_templates.read(PACKAGED_KEY, now, _packaged)
    ns, name = where.split("/", 1)
    return await ctx.repair_templates.read(where, now, lambda: jobs.read_templates(ctx.client, ns, name))


async def _packaged() -> dict[str, dict[str, Any]]:
    return jobs.packaged_templates()


def faulty_gpus(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> list[tuple[int | None, str]]:
    """(index, UUID) of the GPUs showing the conditions of the fired Cordon/Drain rules."""
    record = ctx.cache.node(name)
    gpunode = ctx.cache.gpunode(name)
    if record is None or gpunode is None:
        return []
    wanted = {r.condition for r in verdict.fired_rules if r.action in vocabulary.DISRUPTIVE_ACTIONS} or set(
        verdict.issues
    )
    found = isolation.attribute(gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy))
    return sorted(
        ((g.index, g.uuid) for g in found.gpus if g.uuid is not None),
        key=lambda g: (g[0] is None, g[0] or 0, g[1]),
    )


def reset_gpus(
    ctx: context.Context, name: str, faulty: Sequence[tuple[int | None, str]]
) -> list[tuple[int | None, str]]:
    """The GPUs a ResetGPU step of the cycle resets: the faulty ones, or on an NVSwitch board every GPU of
    the board (`decisions.repair.reset_together`)."""
    gpunode = ctx.cache.gpunode(name)
    listed = isolation.listed_gpus(gpunode.status) if gpunode is not None else []
    return repair.reset_together(faulty, listed)


def recovery_actions(ctx: context.Context, name: str) -> list[str]:
    """The recovery actions the driver asks for on the node's GPUs (`gpus[].recoveryAction`)."""
    gpunode = ctx.cache.gpunode(name)
    listed = isolation.listed_gpus(gpunode.status) if gpunode is not None else []
    return [a for g in listed if isinstance(a := g.get("recoveryAction"), str) and a]


def all_gpus(ctx: context.Context, name: str) -> tuple[str, ...]:
    """UUIDs of every GPU the agent lists on the node."""
    gpunode = ctx.cache.gpunode(name)
    listed = isolation.listed_gpus(gpunode.status) if gpunode is not None else []
    return tuple(u for g in listed if isinstance(u := g.get("uuid"), str) and u)


FRESH_CONDITION_WAIT_SECONDS: Final = 300.0
"""How long after the boot a `nodeCondition` rule's condition, not written again since, is waited for
before it is judged as the Node holds it (its tool uninstalled, or one that writes on change only).
node-problem-detector writes each of its conditions when it starts, seconds after the boot."""


def report(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    now: datetime.datetime,
    state: repair.State | None = None,
) -> repair.Report:
    """The agent's latest report as repair reads it: when it was seen, its bootId, and whether it shows
    the fault of the policy's Cordon/Drain rules — all from the one stored version, read without an
    await in between (a verdict judged before an await could be of an older report than `seen_at`).

    Another tool's Node condition counts only in a version written after the node's boot (issue 45,
    item 5): the kubelet keeps the one written before a reboot until that tool writes again, and a
    reboot that fixed the fault is not NoEffect on the old one. `state`: the cycle in progress."""
    gpunode = ctx.cache.gpunode(name)
    record = ctx.cache.node(name)
    if gpunode is None or record is None:
        return repair.Report(seen_at=None, boot_id=None, fault_gone=False)
    agent: Mapping[str, Any] = gpunode.status.get("agent") or {}
    boot = agent.get("bootId") if isinstance(agent, Mapping) else None
    if gpu_release.released(ctx, name) is not None:
        # Written while NVML was shut for a reset: the facts from before it, no evidence of its effect.
        return repair.Report(
            seen_at=None, boot_id=boot if isinstance(boot, str) and boot else None, fault_gone=False
        )
    raw = signals.raw_signals(
        gpunode.status,
        record.view,
        policies.rule_xids(policy),
        now,
        gpunode.report_age(now),
        agent_pod=ctx.agent_pods.get(name),
        known=gpunode.fact_signals,
        thresholds=trends.thresholds(policy),
        memory=ctx.cache.memory(gpunode),
    )
    booted = _booted_at(agent, boot, state)
    shown: list[bool | None] = []
    judged = True
    for rule in policy.rules:
        if isolation.node_action(rule.action) not in vocabulary.DISRUPTIVE_ACTIONS:
            continue
        if isinstance(rule.condition, vocabulary.NodeCondition):
            if _written_before(record.condition_written.get(rule.condition.node_type), booted, now):
                judged = False
                shown.append(None)  # not yet written since the boot: unknown, wait for a fresh one
                continue
            shown.append(signals.node_condition_signal(record.view, rule.condition).present)
        elif rule.condition in raw:
            shown.append(raw[rule.condition].present)
    return repair.Report(
        seen_at=gpunode.report_seen_at,
        boot_id=boot if isinstance(boot, str) and boot else None,
        fault_gone=all(present is False for present in shown),  # unknown (a stale agent) is not gone
        judged=judged,
    )


def _booted_at(
    agent: Mapping[str, Any], boot: object, state: repair.State | None
) -> datetime.datetime | None:
    """Since when the node runs its current boot: the agent's `bootTime` (the node's clock, as the
    Node conditions' stamps), else, after a reboot step saw a new bootId, the step's start."""
    booted = times.parse(agent.get("bootTime")) if isinstance(agent, Mapping) else None
    if booted is not None:
        return booted
    if state is not None and state.boot_id and isinstance(boot, str) and boot and boot != state.boot_id:
        return state.since
    return None


def _written_before(written: str | None, booted: datetime.datetime | None, now: datetime.datetime) -> bool:
    """Whether a Node condition last written at `written` is older than the boot at `booted`, within
    FRESH_CONDITION_WAIT_SECONDS of it (after that it is judged as it stands: the wait is bounded, also
    for a `bootTime` ahead of the operator's clock, a skewed node's or a lying agent's)."""
    if booted is None or abs(times.seconds_between(booted, now)) >= FRESH_CONDITION_WAIT_SECONDS:
        return False
    stamp = times.parse(written)
    return stamp is None or stamp <= booted


def _boot_id(ctx: context.Context, name: str) -> str | None:
    gpunode = ctx.cache.gpunode(name)
    agent = (gpunode.status.get("agent") or {}) if gpunode is not None else {}
    boot = agent.get("bootId") if isinstance(agent, Mapping) else None
    return boot if isinstance(boot, str) and boot else None


def cancel_reason(ctx: context.Context, state: repair.State, name: str) -> str | None:
    """Why the cycle in progress must stop now (None: it goes on)."""
    record = ctx.cache.node(name)
    if record is None:
        return "the node is gone"
    view = record.view
    if not view.unschedulable or view.cordoned_by != state.policy or record.cordon_taken_over:
        return "the node was made schedulable by someone other than gpu-health"
    why = stopping.why_stop(ctx, state.policy, name)
    if why is not None:
        return why
    current = ctx.cache.policies.get(state.policy)
    if current is None or current.repair is None:
        return f"policy {state.policy} no longer has spec.repair"
    return None


# --- the action protocol: a step's Job ---------------------------------------------------------------


class JobStep:
    """One repair step (or validation) as a Job on the node (`client.protocol.Action[repair.JobView]`)."""

    def __init__(
        self,
        ctx: context.Context,
        policy: model.Policy,
        node: str,
        state: repair.State,
        *,
        key: str,
        timeout_seconds: float,
        words: str,
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.node = node
        self.state = state
        self.key = key
        self.timeout_seconds = timeout_seconds
        self._words = words
        self.namespace = namespace(ctx)
        self.found: Busy | None = None
        """What `decide` found on the node (None: it did not look)."""

    @property
    def name(self) -> str:
        return self._words

    async def decide(self, now: datetime.datetime) -> str | None:
        """Why no Job may be created now: the breaker holds disruptions back, or the node is busy
        (`found`: a workload pod, evictable or not)."""
        paused = self.ctx.breakers.paused(self.policy.name)
        if paused is not None:
            return f"the policy's fleet circuit breaker is {paused.state.value}: {paused.reason}"
        self.found = await busy(self.ctx, self.policy, self.node)
        if self.found.pods:
            return workload_pods.words(self.found.pods)
        return None

    async def start(self, now: datetime.datetime) -> bool:
        """Create the Job from its template; False: it existed (adopted). TemplateError, ApiError."""
        found = await templates(self.ctx, now)
        template = found.get(self.key)
        if template is None:
            raise jobs.TemplateError(f"no {self.key} template")
        # A step on the faulty GPUs (ResetGPU) gets those; the others and Validation every GPU listed.
        kind = step_kinds.BY_TEMPLATE.get(self.key)
        faulty = kind is not None and kind.targets is step_kinds.Targets.FAULTY_GPUS
        gpus = self.state.gpus if faulty else all_gpus(self.ctx, self.node)
        record = self.ctx.cache.node(self.node)
        if record is not None and record.view.labels.get(keys.REPAIR_NODE_UID_LABEL) != record.uid:
            # The state was written without the label its pod selects (by an older operator, or a human
            # removed it): write it first, or the kubelet would refuse the pod.
            if not await _write_state(self.ctx, self.node, self.state):
                raise jobs.StaleJob(f"the Node {self.node} changed while its repair label was written")
            record = self.ctx.cache.node(self.node)
        body = jobs.fill(
            template,
            name=self.state.job,
            namespace=self.namespace,
            node=self.node,
            node_uid=record.uid if record is not None else "",
            policy=self.policy.name,
            cycle=self.state.cycle,
            action=self.key,
            gpus=gpus,
            timeout_seconds=self.timeout_seconds,
            cycle_started=repair.cycle_stamp(self.state),
            extra_env=await validation_env(self.ctx, self.node)
            if self.key == vocabulary.VALIDATION_JOB
            else None,
        )
        # Our identity on the Job: the token whose hash the state on the Node holds (`_sealed`).
        made = self.ctx.repair_tokens.get(self.node)
        if made is None or made[0] != self.state.token:
            raise jobs.StaleJob(f"no token of this process for Job {self.state.job}")
        body["metadata"]["annotations"][keys.REPAIR_TOKEN_ANNOTATION] = made[1]
        _, created = await jobs.create(self.ctx.client, body, belongs=self._ours)
        return created

    def _ours(self, job: Mapping[str, Any]) -> bool:
        return repair.belongs(job, self.state)

    async def observe(self) -> repair.JobView:
        """The Job of this cycle: one of the same name from another cycle is none of ours (missing)."""
        found = await jobs.read(self.ctx.client, self.namespace, self.state.job)
        return repair.job_view(found if found is not None and self._ours(found) else None)

    async def undo(self) -> bool:
        return await jobs.delete(self.ctx.client, self.namespace, self.state.job)


async def validation_env(ctx: context.Context, node: str) -> dict[str, str]:
    """A Validation Job's own variables: the node's running DCGM host engine, or "" where it runs none
    (`decisions.hostengine`), so the template never starts a second one beside it."""
    found = hostengine.address(await drain.list_pods(ctx.client, node))
    return {keys.REPAIR_HOSTENGINE_ENV: found or ""}


def _step_of(
    ctx: context.Context, policy: model.Policy, spec: model.RepairSpec, name: str, state: repair.State
) -> JobStep:
    step = spec.steps[state.step]
    if state.phase is Phase.VALIDATE:
        return JobStep(
            ctx,
            policy,
            name,
            state,
            key=vocabulary.VALIDATION_JOB,
            timeout_seconds=spec.validation_timeout_seconds or 0.0,
            words=f"validation after step {step.name} ({step.action.value})",
        )
    return JobStep(
        ctx,
        policy,
        name,
        state,
        key=step.action.value,
        timeout_seconds=step.timeout_seconds,
        words=_step_words(step, state),
    )


def _step_words(
    step: model.RepairStep, state: repair.State, indexed: Sequence[tuple[int | None, str]] = ()
) -> str:
    if step_kinds.of(step.action).targets is step_kinds.Targets.FAULTY_GPUS:
        named = indexed or [(None, u) for u in state.gpus]
        return f"step {step.name} ({step.action.value}) on {repair.gpu_words(named)}"
    return f"step {step.name} ({step.action.value})"


# --- writing -----------------------------------------------------------------------------------------


async def _write_state(
    ctx: context.Context,
    name: str,
    state: repair.State | None,
    *,
    retired: bool = False,
    also: Mapping[str, str | None] | None = None,
) -> bool:
    """Write the node's repair state (None: remove it) on the cached version; False on a conflict."""
    record = ctx.cache.node(name)
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


def _sealed(ctx: context.Context, name: str, state: repair.State) -> repair.State:
    """The state with a new Job token: this process keeps the token, the state (on the Node) its hash."""
    token = secrets.token_urlsafe(24)
    digest = repair.token_digest(token)
    ctx.repair_tokens[name] = (digest, token)
    return dataclasses.replace(state, token=digest)


def _note(
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
    ctx.repair_history[name] = repair.with_entry(history(ctx, name), item)
    ctx.meters.repairs.labels(action or "none", result.value).inc()


def _started(ctx: context.Context, name: str, state: repair.State) -> bool:
    """Whether this state's Job was created (its Started entry names it)."""
    return any(
        e.get("result") == Result.STARTED and state.job in str(e.get("message") or "")
        for e in history(ctx, name)
    )


def _fill_gaps(ctx: context.Context, name: str, step: str, action: JobStep, job: repair.JobView) -> None:
    """History a leader made and died before writing (its status write follows the Job by a pass): how
    the phase before this state ended (written on the Node with the state) and this state's Started (its
    Job is there), both dated when the state was written."""
    state = action.state
    done = state.previous
    if done is not None and not repair.recorded(history(ctx, name), state):
        _note(
            ctx,
            name,
            state.since,
            state,
            step=done.step,
            action=done.action,
            result=done.result,
            message=done.message,
        )
    if job.phase is not repair.JobPhase.MISSING and not _started(ctx, name, state):
        _note(
            ctx,
            name,
            state.since,
            state,
            step=step,
            action=action.key,
            result=Result.STARTED,
            message=f"Job {action.namespace}/{state.job} created (recorded by the next leader)",
        )


def _finished_seen(
    ctx: context.Context, name: str, state: repair.State, job: repair.JobView, now: datetime.datetime
) -> datetime.datetime | None:
    """When this process first saw the state's Job finished (its clock), `now` the first time; None while
    the Job runs. `now` is read after the Job (a pass's start could precede a report seen meanwhile)."""
    if job.phase not in (repair.JobPhase.SUCCEEDED, repair.JobPhase.FAILED):
        return None
    known = ctx.repair_finished_seen.get(name)
    if known is None or known[0] != state.job:
        known = ctx.repair_finished_seen[name] = (state.job, now)
    return known[1]


def _observe_duration(ctx: context.Context, state: repair.State, result: str, now: datetime.datetime) -> None:
    started = state.started or state.since
    ctx.meters.repair_duration.labels(result).observe(max(0.0, times.seconds_between(started, now)))


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
        await _stop_waiting(ctx, name)  # a wait for maxConcurrent ends with the cordon, or the fault
    if not view.unschedulable:
        _stop_busy_wait(ctx, name)  # a wait for workload pods too (a cycle's ends in `_launch`)
    state = repair.parse(view.annotations.get(keys.REPAIR_ANNOTATION))
    if state is None and keys.OPERANDS_PAUSED_ANNOTATION in view.annotations:
        await operands.restore(ctx, name)  # a cycle that ended without it (a kill -9 between)
    if state is None or state.policy != policy.name:
        return None  # none, or another policy's (`sweep` cancels it when that policy is gone)
    why = cancel_reason(ctx, state, name)
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
    indexed = reset_gpus(ctx, name, faulty_gpus(ctx, policy, name, verdict))
    gpus = tuple(u for _, u in indexed)
    past = history(ctx, name)
    started = cycles(ctx, name)
    first = repair.first_step(spec, gpus, recovery_actions(ctx, name))
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
            boot_id=_boot_id(ctx, name),
            job=repair.job_name(name, cycle, first),
            started=now,
            fault=",".join(verdict.issues),
        )
        state = _sealed(ctx, name, state)
        first_step = _step_of(ctx, policy, spec, name, state)
        why = await first_step.decide(now)
        if why is not None:
            logger.info("repair of node %s by policy %s waits: %s", name, policy.name, why)
            if first_step.found is not None and first_step.found.pods:
                await _say_busy(
                    ctx, name, f"Repair of the drained node by policy {policy.name}", first_step.found
                )
            return NodeAction.DRAINED
        _stop_busy_wait(ctx, name)
    async with ctx.admission.lock:  # one count of repairs in progress at a time, with the budgets'
        selected = len(ctx.cache.selection(policy).selected)
        limit = policies.resolve_max_concurrent(spec, selected)
        decision = repair.may_start(
            spec, history=past, in_progress=in_progress(ctx), limit=limit, gpus=gpus, now=now, started=started
        )
        written = (
            decision is repair.Start.GO
            and state is not None
            and await _write_state(  # the cycle's start is counted before its first Job exists
                ctx,
                name,
                state,
                also={keys.REPAIR_CYCLES_ANNOTATION: repair.with_cycle(started, state.cycle, now)},
            )
        )
    if decision is repair.Start.WAIT:
        await _say_waiting(ctx, policy, name, verdict, limit)
        return NodeAction.DRAINED
    await _stop_waiting(ctx, name)
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
    action = _step_of(ctx, policy, spec, name, state)
    job = await action.observe()
    _fill_gaps(ctx, name, step.name, action, job)
    if job.phase is repair.JobPhase.MISSING and not _started(ctx, name, state):
        return await _launch(ctx, policy, spec, name, state, verdict, now)  # written, never created
    seen = report(ctx, policy, name, now, state)
    if state.phase is Phase.STEP:
        transition = repair.observe_step(
            state, step, job, seen, now, finished_seen=_finished_seen(ctx, name, state, job, ctx.clock())
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
        _note(
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
            if await _write_state(ctx, name, None):
                _observe_duration(ctx, state, "returned", now)
                await ctx.recorder.emit(
                    subject,
                    vocabulary.EventReason.REPAIR_SUCCEEDED,
                    f"Repair cycle {state.cycle} by policy {policy.name}: {action.name} worked "
                    f"({transition.message}); no validation is configured, so the node returns to service "
                    f"after {policy.recovery_healthy_for_seconds:g}s of health.",
                )
            return None
        validating = _sealed(
            ctx,
            name,
            dataclasses.replace(
                state,
                phase=Phase.VALIDATE,
                since=now,
                boot_id=_boot_id(ctx, name),
                job=repair.job_name(name, state.cycle, state.step, validation=True),
                previous=repair.Done(step.name, kind, Result.SUCCEEDED, transition.message),
            ),
        )
        if not await _write_state(ctx, name, validating):
            return Handled(NodeAction.REPAIRING)
        launched = await _launch(ctx, policy, spec, name, validating, verdict, now)
        return launched if launched is not None else Handled(NodeAction.VALIDATING)
    if transition.outcome is repair.Outcome.PASSED:
        _note(
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
        _observe_duration(ctx, state, "returned", now)
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
            await _write_state(ctx, name, None)
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
    _note(
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
    indexed = faulty_gpus(ctx, policy, name, verdict)
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
        boot_id=_boot_id(ctx, name),
        job=repair.job_name(name, state.cycle, following),
        started=state.started,
        fault=state.fault,
        previous=repair.Done(step.name if step else "", kind, result, transition.message),
    )
    nxt = _sealed(ctx, name, nxt)
    if not await _write_state(ctx, name, nxt):
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
    action = _step_of(ctx, policy, spec, name, state)
    phase = _phase_action(state)
    why = await action.decide(now)
    if why is not None:
        logger.info("repair of node %s: %s waits: %s", name, action.name, why)
        if action.found is not None and action.found.pods:
            return await _while_busy(ctx, policy, spec, name, state, verdict, action, now)
        return Handled(phase)
    _stop_busy_wait(ctx, name)
    made = ctx.repair_tokens.get(name)
    if made is None or made[0] != state.token:
        # Written by another process (a restart, an earlier leader) whose token died with it: a new one,
        # its hash on the Node first, so that the Job created now is still known by it after us.
        state = _sealed(ctx, name, state)
        if not await _write_state(ctx, name, state):
            return Handled(phase)
        action = _step_of(ctx, policy, spec, name, state)
    if state.phase is Phase.STEP and indexed:
        action = JobStep(
            ctx,
            policy,
            name,
            state,
            key=action.key,
            timeout_seconds=action.timeout_seconds,
            words=_step_words(spec.steps[state.step], state, indexed),
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
    _note(
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
    action: JobStep,
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
    action: JobStep,
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
    action: JobStep,
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
    action: JobStep,
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
        undone = await _write_state(
            ctx,
            name,
            None,
            also={keys.REPAIR_CYCLES_ANNOTATION: repair.without_cycle(cycles(ctx, name), state.cycle)},
        )
        if undone:
            ctx.repair_tokens.pop(name, None)
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
    action: JobStep,
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
        _stop_busy_wait(ctx, name)
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
    found: Busy,
    *,
    state: repair.State | None = None,
    action: JobStep | None = None,
) -> None:
    """Say once per wait (Event RemediationPaused) which pods hold the repair back, and until when."""
    if name in ctx.repair_busy_said:
        return
    ctx.repair_busy_said.add(name)
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
    if not await _write_state(ctx, name, None, retired=True):
        return Handled(NodeAction.REPAIRING if state is not None else NodeAction.DRAINED)
    await _reset_over(ctx, name)
    cycle = state.cycle if state is not None else repair.next_cycle(history(ctx, name), cycles(ctx, name)) - 1
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
    _note(
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
        _observe_duration(ctx, state, "retired", now)
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
    ns = namespace(ctx)
    deleted = await jobs.delete(ctx.client, ns, state.job)
    await _reset_over(ctx, name)
    if not await _write_state(ctx, name, None):
        return  # changed meanwhile: the next pass decides again
    _stop_busy_wait(ctx, name)  # a busy wait said ends with its cycle
    kind = vocabulary.VALIDATION_JOB if state.phase is Phase.VALIDATE else ""
    policy = ctx.cache.policies.get(state.policy)
    if (
        not kind
        and policy is not None
        and policy.repair is not None
        and state.step < len(policy.repair.steps)
    ):
        kind = policy.repair.steps[state.step].action.value
    _note(ctx, name, now, state, step="", action=kind, result=Result.CANCELLED, message=f"cancelled: {why}")
    _observe_duration(ctx, state, "cancelled", now)
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
            state = state_of(ctx, name)
            if state is None:
                continue
            why = cancel_reason(ctx, state, name)
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
    indexed = reset_gpus(ctx, name, faulty_gpus(ctx, policy, name, verdict))
    first = repair.first_step(spec, [u for _, u in indexed], recovery_actions(ctx, name))
    if first is None:
        return " Repair would retire the node: no step applies (no faulty GPU's UUID is known)."
    step = spec.steps[first]
    doing = step_kinds.of(step.action).doing.format(gpus=repair.gpu_words(indexed))
    then = ", then validate" if spec.validation_timeout_seconds is not None else ""
    return f" Repair would then {doing} (step {step.name}, {step.action.value}){then}."
