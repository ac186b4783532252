"""A node at rest whose new report changes nothing a verdict reads: its pass is not run again (issue 29).

Most reports of a healthy fleet are heartbeats. Their GPUs' clocks, temperatures and utilization
move, their faults do not (`signals.still_healthy`), so the cache gives such a version the reading
of the one before it (`cache.GPUNodeRecord.reads_like`). On a node at rest (`decisions.clocks`:
healthy, no action, every condition False with nothing pending; not cordoned, tainted or flagged
by us) time alone changes no verdict either: the timer does not judge such a node
(`ticker.is_due`). So a pass over that report would judge every selecting policy's verdict from
the same inputs as the pass before it, find the Node and the GPUNode status as that pass left
them, and write and say nothing, as that pass did.

`remember` keeps, after a pass that left the node so (nothing written, every verdict healthy and
wanting nothing, no drain, isolation, budget wait or fire drill), what it was judged from: the
Node's reading (a version equal to it but for its resourceVersion, a kubelet's status update,
reads alike: `cache.NodeRecord.reads_like`), the GPUNode's reading, each selecting policy with its
straggler score and the agent pod, and the node's repair history, as they were. `unchanged` is true
while all of that is the same (the same objects; a straggler score only as far as the verdict and the
status read it) and the agent's report is fresh; anything else (a fault in a report, a Node edit, a policy
change, a straggler score worth writing, a pod turning NotReady, a report growing old, what its GPUs'
link cohorts expect moving with other nodes' reports) runs the pass.
A pass that runs forgets what was kept until it ends at rest again.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import liveness, model, stragglers
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache, cohort_members, judged


def fresh(ctx: context.Context, gpunode: cache.GPUNodeRecord, now: datetime.datetime) -> bool:
    """Whether the agent's report stays fresh past the timer's next two ticks (its staleness is the one
    clock of a node at rest: the timer wakes for it that early, `ticker.is_due`)."""
    limit = gpunode.stale_limit
    return limit is not None and gpunode.report_age(now) < limit - 2 * ctx.config.tick_seconds


def _judged(
    ctx: context.Context, name: str, selecting: Sequence[model.Policy], pod: liveness.AgentPod | None
) -> tuple[tuple[model.Policy, object, object], ...]:
    return tuple((p, ctx.judging.stragglers.get((p.name, name)), pod) for p in selecting)


def _quiet(
    ctx: context.Context, name: str, selecting: Sequence[model.Policy], pod: liveness.AgentPod | None
) -> bool:
    """Nothing of the node's runs or waits: no drain, no cordon in flight, no budget wait, no isolation
    (under any policy: the status lists every policy's), an agent pod not known to be NotReady (`pod`:
    the node's, as `agent_pods` holds it; read once for this and `_judged`)."""
    if name in ctx.steps.drain or name in ctx.steps.cordons_unknown or (pod is not None and not pod.ready):
        return False
    isolated = ctx.steps.isolated  # the view once, not once per policy
    if any((policy, name) in isolated for policy in ctx.cache.policies):
        return False
    return not any(ctx.admission.waiting(p.name, name) for p in selecting)


def unchanged(
    ctx: context.Context, name: str, selecting: Sequence[model.Policy], now: datetime.datetime
) -> bool:
    """Whether the last pass, which ended at rest, judged the node from what the cache holds now."""
    rest = ctx.judging.resting.get(name)
    record, gpunode = ctx.cache.nodes.get(name), ctx.cache.gpunodes.get(name)
    if rest is None or record is None or gpunode is None:
        return False
    if rest.node != record.reading or rest.reading != gpunode.reading:
        return False
    if rest.repairs is not ctx.steps.repairs.get(name):
        return False  # its status field changes
    if rest.links != _link_cohorts(ctx, gpunode):
        return False  # what its GPUs' links should be moved with the fleet (`link_cohorts`)
    pod = ctx.agent_pods.nodes.get(name)  # the read-only view: no call (issue 46)
    if (
        len(rest.judged) != len(selecting)
        or not fresh(ctx, gpunode, now)
        or not _quiet(ctx, name, selecting, pod)
    ):
        return False
    written = gpunode.status.get("straggler")
    for (policy, score, pod_then), (policy_now, score_now, pod_now) in zip(
        rest.judged, _judged(ctx, name, selecting, pod), strict=True
    ):
        if policy is not policy_now or pod_then is not pod_now:
            return False
        if score is not score_now and not _same_straggler(score, score_now, written):
            return False
    return True


def _link_cohorts(ctx: context.Context, gpunode: cache.GPUNodeRecord) -> tuple[int | None, ...]:
    """The links up its GPUs' cohorts expect now: they move when other nodes report, not this one."""
    return ctx.cache.memory(gpunode).expectations(gpunode.status.get("gpus"))


def _same_straggler(was: object, now: object, written: object) -> bool:
    """Whether a straggler score `now` in place of `was` changes nothing a pass does: the part the verdict
    reads is the same (`cohort_members.judged_part`) and the status as `written` is not worth writing over."""
    if not (was is None or isinstance(was, model.StragglerScore)):
        return False
    if not (now is None or isinstance(now, model.StragglerScore)):
        return False
    if cohort_members.judged_part(was) != cohort_members.judged_part(now):
        return False
    return not stragglers.status_moved(written, stragglers.status_of(now))


def remember(
    ctx: context.Context,
    name: str,
    record: cache.NodeRecord,
    gpunode: cache.GPUNodeRecord,
    results: Sequence[tuple[model.Policy, model.NodeVerdict, vocabulary.NodeAction]],
) -> None:
    """After a pass judged `record` and `gpunode`: keep what it was judged from if it ended at rest."""
    if ctx.cache.nodes.get(name) is not record or ctx.cache.gpunodes.get(name) is not gpunode:
        return  # it wrote (or a newer version came meanwhile)
    if not (record.at_rest and gpunode.at_rest) or gpunode.annotations or gpunode.status.get("isolatedGPUs"):
        return
    if not all(_wants_nothing(verdict, action) for _, verdict, action in results):
        return  # the records at rest say so too, as the pass wrote them; the verdicts are the source
    selecting = [policy for policy, _, _ in results]
    pod = ctx.agent_pods.nodes.get(name)  # the read-only view: no call (issue 46)
    if _quiet(ctx, name, selecting, pod):
        ctx.judging.resting[name] = judged.Rest(
            record.reading,
            gpunode.reading,
            _judged(ctx, name, selecting, pod),
            ctx.steps.repairs.get(name),
            _link_cohorts(ctx, gpunode),
        )


def _wants_nothing(verdict: model.NodeVerdict, action: vocabulary.NodeAction) -> bool:
    return (
        action is vocabulary.NodeAction.NONE
        and verdict.health is vocabulary.Health.HEALTHY
        and not verdict.issues
        and verdict.wanted_action is None
        and not verdict.overridden
    )
