"""Fire drills at run time: judge a drilled node as if the condition were real, say what would happen.

After the real pass over a node (whose verdict, Node writes and GPUNode
conditions a drill never touches), `run` judges the node again under every
selecting policy with the drill's synthetic signal (`decisions.drill`), words
what each policy would change with the dry-run machinery
(`node_changes.dry_run_changes`), checks the budget without taking a place,
and says it in `Drill` Events, once per change. The GPUNode shows action
`Drill` unless the real pass did something stronger than a label (a real
fault outranks a drill). The drill metrics (`drill_nodes`, `drill_actions`)
carry what the drill judged; the chart's alerts label them `drill="true"`.

The drill's clock lives on the GPUNode: the first pass writes
`gpuhealth.io/drill-started`; at its TTL the operator removes the drill's
annotations itself (so `kubectl get` shows it is over), and a removed drill
annotation ends the drill at once.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, gpunodes, kube
from gpuhealth_operator.decisions import budget, drill, hysteresis, model, times, verdicts
from gpuhealth_operator.ladder.isolate import isolating
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction

NODE_KEY = ""
"""The `drill_said` key's policy part for what is said about the drill itself (start, end, refusal)."""

OUTRANKED: frozenset[NodeAction] = frozenset({NodeAction.NONE, NodeAction.EVENT, NodeAction.LABELED})
"""Real actions a drill's `Drill` replaces in GPUNode status; anything stronger is shown as it is."""

DRILL_ANNOTATIONS = (keys.DRILL_ANNOTATION, keys.DRILL_TTL_ANNOTATION, keys.DRILL_STARTED_ANNOTATION)


async def run(
    ctx: context.Context,
    name: str,
    selecting: Sequence[model.Policy],
    action: NodeAction,
    now: datetime.datetime,
) -> NodeAction:
    """Run the node's drill, if it has one, after its real pass; the `status.action` to show."""
    gpunode = ctx.cache.gpunodes.get(name)
    if gpunode is None:
        return action
    asked = keys.DRILL_ANNOTATION in gpunode.annotations  # not on nearly every node: `requested` says None
    try:
        wanted = drill.requested(gpunode.annotations) if asked else None
    except drill.DrillError as error:
        await _end(ctx, name)
        await _say(ctx, name, NODE_KEY, f"Drill refused, no drill runs: {error}.", events.WARNING)
        if keys.DRILL_STARTED_ANNOTATION in gpunode.annotations:  # a corrected drill starts afresh
            await _annotate(ctx, name, {keys.DRILL_STARTED_ANNOTATION: None})
        return action
    if wanted is None:
        if keys.DRILL_STARTED_ANNOTATION in gpunode.annotations:
            await _annotate(ctx, name, {keys.DRILL_STARTED_ANNOTATION: None})
        if _running(ctx, name):
            await _end(ctx, name)
            ended = f"Drill ended: the {keys.DRILL_ANNOTATION} annotation was removed."
            await _say(ctx, name, NODE_KEY, ended)
        return action
    if wanted.started is None:
        if not await _annotate(ctx, name, {keys.DRILL_STARTED_ANNOTATION: times.render(now)}):
            return action
        wanted = drill.Drill(wanted.condition, wanted.ttl_seconds, now)
    if wanted.expired(now):
        await _end(ctx, name)
        await _say(
            ctx,
            name,
            NODE_KEY,
            f"Drill ended: its TTL of {wanted.ttl_seconds:g}s ran out at "
            f"{times.render(wanted.expires(now))}; the drill annotations are removed.",
        )
        await _annotate(ctx, name, dict.fromkeys(DRILL_ANNOTATIONS))
        return action
    return await _judge(ctx, name, selecting, wanted, action=action, now=now)


async def _judge(
    ctx: context.Context,
    name: str,
    selecting: Sequence[model.Policy],
    wanted: drill.Drill,
    *,
    action: NodeAction,
    now: datetime.datetime,
) -> NodeAction:
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    if record is None or gpunode is None:
        return action
    await _say(
        ctx,
        name,
        NODE_KEY,
        f"Drill started: {wanted.condition.value} is treated as true on this node until "
        f"{times.render(wanted.expires(now))}; nothing on the Node will be changed.",
    )
    previous = hysteresis.from_status(gpunode.status.get("conditions") or [])
    synthetic = drill.signal(wanted, now)
    for policy in selecting:
        straggler = ctx.judging.stragglers.get((policy.name, name))
        verdict = verdicts.judge(
            policy,
            record.view,
            gpunode.status,
            previous,
            straggler,
            now,
            report_age_seconds=gpunode.report_age(now),
            drill=synthetic,
            agent_pod=ctx.agent_pods.get(name),
            memory=ctx.cache.memory(gpunode),
        )
        stand_in = drill.attribution(wanted, gpunode.status)
        planned = await isolating.plan(
            ctx, policy, record, verdict, attribution=stand_in, named=drill.STAND_IN
        )
        verdict, changes = planned.verdict, planned.changes
        wait = None
        disruptive = verdict.wanted_action in vocabulary.DISRUPTIVE_ACTIONS
        if disruptive and not policy.dry_run and not record.view.unschedulable:
            wait = drill.budget_wait(name, _budgets(ctx, policy))
        message = drill.describe(policy, wanted, verdict, changes, wait) + planned.ladder_note
        message += planned.probe_note
        if await _say(ctx, name, policy.name, message) and changes and verdict.wanted_action is not None:
            ctx.meters.drill_actions.labels(verdict.wanted_action.value, wanted.condition.value).inc()
        ctx.steps.drill.health[(policy.name, name)] = verdict.health.value
    ctx.count_drills()
    return NodeAction.DRILL if action in OUTRANKED else action


def _budgets(ctx: context.Context, policy: model.Policy) -> list[budget.Budget]:
    """The budgets a real cordon would need: this policy's and every other acting policy's, with the
    domains of their topology budgets."""
    others = sorted((p for p in ctx.cache.policies.values() if not p.dry_run), key=lambda p: p.name)
    return ctx.admission.budgets(list({p.name: p for p in (policy, *others)}.values()), ctx.cache)


def _running(ctx: context.Context, name: str) -> bool:
    return any(node == name for _, node in ctx.steps.drill.health)


async def _end(ctx: context.Context, name: str) -> None:
    """Forget the node's drill verdicts (what was said about the drill itself stays, so it is said once)."""
    for key in [k for k in ctx.steps.drill.health if k[1] == name]:
        del ctx.steps.drill.health[key]
    for key in [k for k in ctx.steps.drill.said if k[1] == name and k[0] != NODE_KEY]:
        del ctx.steps.drill.said[key]
    ctx.count_drills()


async def _say(
    ctx: context.Context, name: str, policy: str, message: str, type_: str = events.NORMAL
) -> bool:
    """Emit a Drill Event unless this was the last thing said under (policy, node); whether it was emitted."""
    if ctx.steps.drill.said.get((policy, name)) == message:
        return False
    ctx.steps.drill.said[(policy, name)] = message
    await ctx.recorder.emit_on(ctx.cache, name, vocabulary.EventReason.DRILL, message, type_)
    return True


async def _annotate(ctx: context.Context, name: str, annotations: dict[str, str | None]) -> bool:
    """Write our drill annotations on the GPUNode; False if it is gone or the write was refused."""
    try:
        body = await gpunodes.annotate(ctx.client, name, annotations)
    except kube.ApiError as error:
        if error.status == 404:
            return False
        if error.status == 403:
            logger.warning("cannot annotate GPUNode %s for its drill (RBAC: patch gpunodes): %s", name, error)
            message = "Drill cannot run: the operator may not patch GPUNodes (RBAC verb patch on gpunodes)."
            await _say(ctx, name, NODE_KEY, message, events.WARNING)
            return False
        raise
    return ctx.cache.refresh_gpunode(body, ctx.clock()) is not None
