"""What repair reads of a node: its stored cycle and history, its workload, the templates, the GPUs
a step is handed, the agent's report as a step's effect sees it; and the maxConcurrent wait, said once.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain, kube, nodes
from gpuhealth_operator.decisions import (
    isolation,
    model,
    policies,
    repair,
    signals,
    times,
    trends,
    workload_pods,
)
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.ladder.repair import gpu_release, jobs
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)


STATUS_FIELD: Final = "repairs"
PACKAGED_KEY: Final = ""
"""The `repair_templates` key of the packaged templates."""


# --- reading -----------------------------------------------------------------------------------------


def state_of(ctx: context.Context, name: str) -> repair.State | None:
    record = ctx.cache.nodes.get(name)
    return repair.parse(record.view.annotations.get(keys.REPAIR_ANNOTATION)) if record is not None else None


def cycles(ctx: context.Context, name: str) -> repair.Cycles:
    """The node's recent cycle starts (`keys.REPAIR_CYCLES_ANNOTATION`): what maxAttempts counts."""
    record = ctx.cache.nodes.get(name)
    return repair.parse_cycles(record.view.annotations.get(keys.REPAIR_CYCLES_ANNOTATION) if record else None)


def history(ctx: context.Context, name: str) -> list[dict[str, Any]]:
    """The node's `status.repairs[]`: as this process last made it, else as stored."""
    made = ctx.steps.repair.history.get(name)
    if made is not None:
        return made
    gpunode = ctx.cache.gpunodes.get(name)
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
    return sorted(repairing | ctx.steps.repair.validations)


async def stop_waiting(ctx: context.Context, name: str, *, busy: bool = False) -> None:
    """The wait for maxConcurrent ended: forget it, and its mark on the Node (written when it was said).
    `busy`: the wait for workload pods ended too (`stop_busy_wait`)."""
    ctx.steps.repair.waiting.discard(name)
    record = ctx.cache.nodes.get(name)
    if record is not None and keys.REPAIR_WAITING_ANNOTATION in record.view.annotations:
        body = await nodes.patch_metadata(
            ctx.client, name, annotations={keys.REPAIR_WAITING_ANNOTATION: None}
        )
        ctx.cache.refresh_node(body)
    if busy:
        stop_busy_wait(ctx, name)


def stop_busy_wait(ctx: context.Context, name: str) -> None:
    ctx.steps.repair.busy_said.discard(name)


async def say_waiting(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, limit: int
) -> None:
    """Say once per wait (an Event on the node) that its repair waits for maxConcurrent, and for whom.
    Once per wait, not per process: the Node keeps the mark (`keys.REPAIR_WAITING_ANNOTATION`), written
    after the Event (a crash between says it twice, never not at all)."""
    if name in ctx.steps.repair.waiting:
        return
    ctx.steps.repair.waiting.add(name)
    record = ctx.cache.nodes.get(name)
    if record is None or record.view.annotations.get(keys.REPAIR_WAITING_ANNOTATION) == policy.name:
        return  # said by an earlier process (a restart, a leader change)
    issues = ", ".join(verdict.issues) or "a fault"
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
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
        return await ctx.steps.repair.templates.read(PACKAGED_KEY, now, _packaged)
    ns, name = where.split("/", 1)
    return await ctx.steps.repair.templates.read(
        where, now, lambda: jobs.read_templates(ctx.client, ns, name)
    )


async def _packaged() -> dict[str, dict[str, Any]]:
    return jobs.packaged_templates()


def faulty_gpus(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict
) -> list[tuple[int | None, str]]:
    """(index, UUID) of the GPUs showing the conditions of the fired Cordon/Drain rules."""
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    if record is None or gpunode is None:
        return []
    wanted = {r.condition for r in verdict.fired_rules if r.action in vocabulary.DISRUPTIVE_ACTIONS} or set(
        verdict.issues
    )
    found = isolation.attribute(gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy))
    faults = {(g.index, g.uuid) for g in found.gpus if g.uuid is not None}
    if vocabulary.Condition.ACTIVE_CHECK_FAILED in wanted:
        # A check runs on every GPU of the node and its verdict names none: each is the failed run's suspect.
        faults |= {
            (f.index, f.uuid)
            for g in isolation.listed_gpus(gpunode.status)
            if (f := isolation.gpu_fault(g, ())).uuid
        }
    return sorted(((i, u) for i, u in faults if u is not None), key=lambda g: (g[0] is None, g[0] or 0, g[1]))


def reset_gpus(
    ctx: context.Context, name: str, faulty: Sequence[tuple[int | None, str]]
) -> list[tuple[int | None, str]]:
    """The GPUs a ResetGPU step of the cycle resets: the faulty ones, or on an NVSwitch board every GPU of
    the board (`decisions.repair.reset_together`)."""
    gpunode = ctx.cache.gpunodes.get(name)
    listed = isolation.listed_gpus(gpunode.status) if gpunode is not None else []
    return repair.reset_together(faulty, listed)


def recovery_actions(ctx: context.Context, name: str) -> list[str]:
    """The recovery actions the driver asks for on the node's GPUs (`gpus[].recoveryAction`)."""
    gpunode = ctx.cache.gpunodes.get(name)
    listed = isolation.listed_gpus(gpunode.status) if gpunode is not None else []
    return [a for g in listed if isinstance(a := g.get("recoveryAction"), str) and a]


def all_gpus(ctx: context.Context, name: str) -> tuple[str, ...]:
    """UUIDs of every GPU the agent lists on the node."""
    gpunode = ctx.cache.gpunodes.get(name)
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
    gpunode = ctx.cache.gpunodes.get(name)
    record = ctx.cache.nodes.get(name)
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
        if rule.condition is vocabulary.Condition.ACTIVE_CHECK_FAILED:
            # Its evidence is a check run, never an agent report, and no check runs on the cordoned node:
            # counted here it would hold every step NoEffect. The validation is its run (`check_runs`).
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


def boot_id(ctx: context.Context, name: str) -> str | None:
    gpunode = ctx.cache.gpunodes.get(name)
    agent = (gpunode.status.get("agent") or {}) if gpunode is not None else {}
    boot = agent.get("bootId") if isinstance(agent, Mapping) else None
    return boot if isinstance(boot, str) and boot else None


def cancel_reason(ctx: context.Context, state: repair.State, name: str) -> str | None:
    """Why the cycle in progress must stop now (None: it goes on)."""
    record = ctx.cache.nodes.get(name)
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
