"""Acting on degraded topology domains: judging them, marking their nodes, saying so.

A policy's `spec.topology.domains` rules are judged per policy, never per
agent report: after a node's pass only when something a domain counts
changed (`node_changed`: its health class under the policy, its domain
label values, its selection), when a policy changes, and on the timer while
a degraded domain's recovery clock runs and on every full pass
(`on_timer`). Each judgement (`decisions.domains.judge`) is followed by one
`apply`, which makes every Node's marks match the union of what the acting
policies' degraded domains want:

- the label `gpuhealth.io/domain-degraded=true` on every selected node of a
  degraded domain (action Label), and the NoSchedule taint of that key too
  (action Taint); never a cordon or a drain: a healthy node of a degraded
  domain stays schedulable for pods that tolerate the taint, and keeps its pods;
- a node that carries a mark no acting policy wants any more (its domain
  recovered, it moved to another domain, the policy went dry-run or was
  deleted) loses it; only our two keys are ever touched;
- a node labelled `gpuhealth.io/exclude=true` is left alone either way.

Each transition is said once, on the GPUHealthPolicy: `DomainDegraded`
(Warning, naming key=value and the counts) and `DomainRecovered` (Normal);
a dry-run policy says `DryRun` instead and writes nothing. The policy status
lists its degraded domains (`status.topology.degraded`) and the gauge
`gpuhealth_operator_topology_domain_degraded{policy,key,value}` is 1 for
each, its series removed when the domain recovers (bounded cardinality).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable

from gpuhealth_api import vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import budget, domains, model, policies
from gpuhealth_operator.ladder import node_patches
from gpuhealth_operator.ladder.domain import domains as marks_patch
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache

logger = logging.getLogger(__name__)

Health = vocabulary.Health

STATUS_LIMIT = 64
"""Degraded domains listed in a policy's status at most (the CRD's maxItems)."""

WRITE_CHUNK = 16
"""Nodes marked at once: an NVL72 rack's 18 nodes in two round trips, without a burst of a fleet."""

TRANSIENT = (kube.ApiError, OSError, asyncio.TimeoutError)


def _with_domains(ctx: context.Context) -> list[model.Policy]:
    return [p for _, p in sorted(ctx.cache.policies.items()) if p.topology.domains]


async def node_changed(ctx: context.Context, name: str) -> None:
    """After a node's pass (a watch event): judge the domains again if what they count of it changed."""
    domain_policies = _with_domains(ctx)
    if not domain_policies:
        return
    record = ctx.cache.nodes.get(name)
    due = False
    for policy in domain_policies:
        selected = record is not None and name in ctx.cache.selection(policy).selected
        health: Health | None = None
        if selected:
            verdict = ctx.verdicts.get((policy.name, name))
            health = verdict.health if verdict is not None else Health.UNKNOWN
        labels = record.view.labels if record is not None else {}
        due = ctx.steps.domain.changed(policy, name, health, labels) or due
    if due:
        await evaluate(ctx, ctx.clock())


async def on_timer(ctx: context.Context, now: datetime.datetime, *, full: bool) -> None:
    """The timer's part: judge while a recovery clock runs (it clears by time alone), and on every full
    pass (marks a human removed come back, a relabelled node's old marks go)."""
    recovering = any(
        s.recovering_since is not None for states in ctx.steps.domain.states.values() for s in states.values()
    )
    if full or recovering or ctx.steps.domain.recorded:
        await evaluate(ctx, now)


async def evaluate(ctx: context.Context, now: datetime.datetime) -> None:
    """Judge every policy's domains, say the transitions, and make the Nodes' marks match."""
    async with ctx.steps.domain.lock:
        for name in [p for p in ctx.steps.domain.states if p not in ctx.cache.policies]:
            ctx.steps.domain.states.pop(name, None)  # invalid now (or deleted): it marks nothing
            ctx.meters.set_degraded_domains(name, ())
        for policy in sorted(ctx.cache.policies.values(), key=lambda p: p.name):
            await _judge(ctx, policy, now)
        await apply(ctx)


async def _judge(ctx: context.Context, policy: model.Policy, now: datetime.datetime) -> None:
    first = policy.name not in ctx.steps.domain.states  # this process's first judgement of the policy
    previous = ctx.steps.domain.previous(policy)
    if not policy.topology.domains and not previous:
        ctx.steps.domain.states.pop(policy.name, None)
        return
    members = []
    for node in ctx.cache.selection(policy).selected:
        record = ctx.cache.nodes.get(node)
        if record is None:
            continue
        verdict = ctx.verdicts.get((policy.name, node))
        health = verdict.health if verdict is not None else Health.UNKNOWN
        members.append(domains.Member(node, record.view.labels, health))
    current = domains.judge(
        policy.topology.domains, members, previous, policy.recovery_healthy_for_seconds, now
    )
    ctx.steps.domain.states[policy.name] = current
    changed = domains.transitions(previous, current)
    for state in changed.degraded:
        if first and _marked_before(ctx, policy, state):
            continue  # said by an earlier process, which marked the nodes and ended before its status
        await _say(ctx, policy, state, degraded=True)
    for state in changed.recovered:
        await _say(ctx, policy, state, degraded=False)
    ctx.meters.set_degraded_domains(policy.name, list(current))


def _marked_before(ctx: context.Context, policy: model.Policy, state: domains.DomainState) -> bool:
    """Whether a degraded domain new to this process was said and marked by an earlier one: its Event
    is said before its marks are written, and the policy's status (what `previous` reads) only at the
    next timer pass, so a restart in between finds every member marked as the domain's action wants and
    no other policy of this process wanting those marks."""
    if policy.dry_run or not state.members:
        return False
    others = domains.wanted_marks(
        states
        for name, states in ctx.steps.domain.states.items()
        if name != policy.name and (other := ctx.cache.policies.get(name)) is not None and not other.dry_run
    )
    want = domains.marks_for(state.action)
    for name in state.members:
        record = ctx.cache.nodes.get(name)
        if record is None or name in others or not all(settled(record, want)):
            return False
    return True


def _marks_text(action: vocabulary.Action) -> str:
    text = f"label {marks_patch.LABEL}=true"
    if action is vocabulary.Action.TAINT:
        text += f" and taint {marks_patch.TAINT}={marks_patch.TAINT_VALUE}:{marks_patch.TAINT_EFFECT}"
    return text


async def _say(
    ctx: context.Context, policy: model.Policy, state: domains.DomainState, *, degraded: bool
) -> None:
    subject = events.policy_subject(policy.name)
    marks = _marks_text(state.action)
    if policy.dry_run:
        verb = f"{marks} on" if degraded else f"remove the {marks} from"
        why = "degraded" if degraded else "recovered"
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.DRY_RUN,
            f"Dry run: policy {policy.name} would {verb} the {state.nodes} selected nodes of domain "
            f"{state.key}={state.value} ({why}: {domains.describe(state)}).",
        )
        return
    if degraded:
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.DOMAIN_DEGRADED,
            f"Domain {domains.describe(state)}: policy {policy.name} sets the {marks} on its "
            f"{state.nodes} selected nodes (no cordon, no drain); lifted once it is below the threshold "
            f"for {policy.recovery_healthy_for_seconds:g}s.",
            events.WARNING,
        )
    else:
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.DOMAIN_RECOVERED,
            f"Domain {domains.describe(state)} for {policy.recovery_healthy_for_seconds:g}s: policy "
            f"{policy.name} removes the {marks} it set.",
        )


def wanted(ctx: context.Context) -> dict[str, domains.Marks]:
    """node → the marks the acting policies' degraded domains want on it."""
    acting = [
        states
        for name, states in ctx.steps.domain.states.items()
        if (policy := ctx.cache.policies.get(name)) is not None and not policy.dry_run
    ]
    return domains.wanted_marks(acting)


def _carries(record: cache.NodeRecord) -> bool:
    return marks_patch.LABEL in record.view.labels or marks_patch.TAINT in record.view.taint_keys


async def apply(ctx: context.Context) -> None:
    """Make every Node's domain marks match `wanted`: set where wanted, removed where no acting policy
    wants them (ours only), an opted-out node left as it is. A failed write is logged; the next
    judgement (at the latest the timer's next full pass) retries it."""
    want = wanted(ctx)
    names = sorted(set(want) | {n for n, r in ctx.cache.nodes.items() if _carries(r)})
    for start in range(0, len(names), WRITE_CHUNK):
        chunk = names[start : start + WRITE_CHUNK]
        results = await asyncio.gather(
            *(_mark(ctx, n, want.get(n, domains.NO_MARKS)) for n in chunk), return_exceptions=True
        )
        for name, result in zip(chunk, results, strict=True):
            if isinstance(result, TRANSIENT):
                ctx.meters.reconcile_errors.labels("timer").inc()
                logger.warning("could not set the domain marks of node %s (will retry): %s", name, result)
            elif isinstance(result, BaseException):
                raise result


def settled(record: cache.NodeRecord, want: domains.Marks) -> tuple[bool, bool]:
    """(label as wanted, taint as wanted) on this version of the Node."""
    labels = record.view.labels
    label_ok = labels.get(marks_patch.LABEL) == "true" if want.label else marks_patch.LABEL not in labels
    return label_ok, (marks_patch.TAINT in record.view.taint_keys) == want.taint


async def _mark(ctx: context.Context, name: str, want: domains.Marks) -> None:
    def left_alone(record: cache.NodeRecord) -> bool:
        return policies.excluded(record.view) or all(settled(record, want))  # opted out, or as wanted

    def mark(record: cache.NodeRecord) -> Awaitable[kube.JsonObject]:
        taint_ok = settled(record, want)[1]
        return marks_patch.mark(
            ctx.client,
            name,
            label=want.label,
            taints=None if taint_ok else marks_patch.with_marks(record.taints, want.taint),
            resource_version=None if taint_ok else record.resource_version,
        )

    try:
        await node_patches.patch_with_retries(ctx, name, left_alone, mark)
    except kube.ApiError as error:
        if not error.not_found:
            raise  # a 404: the Node is gone, nothing to mark


def status(ctx: context.Context, name: str) -> dict[str, object]:
    """The policy's `status.topology` field: its degraded domains and its topology budget domains with no
    free place (`budget.at_budget`, counted as admission counts them); {} while there is neither. Sets
    the at-budget gauge on the way (the degraded one is set by `evaluate`)."""
    topology: dict[str, object] = {}
    degraded = ctx.steps.domain.status(name, STATUS_LIMIT)
    if degraded:
        topology["degraded"] = degraded
    policy = ctx.cache.policies.get(name)
    full: list[tuple[str, str, budget.Budget]] = []
    if policy is not None and policy.topology.budgets:
        for each in budget.at_budget(ctx.admission.budgets([policy], ctx.cache)):
            if each.domain is not None:
                full.append((each.domain.entry.key, each.domain.value, each))
    full.sort(key=lambda item: item[:2])
    ctx.meters.set_domains_at_budget(name, [(key, value) for key, value, _ in full])
    if full:
        topology["atBudget"] = [
            {
                "key": key,
                "value": value,
                "unavailable": len(each.unavailable),
                "maxUnavailable": each.limit,
                "nodes": len(each.selected),
            }
            for key, value, each in full[:STATUS_LIMIT]
        ]
    return {"topology": topology} if topology else {}
