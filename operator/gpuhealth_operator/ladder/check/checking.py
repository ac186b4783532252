"""Active checks (`spec.activeChecks`, issue 51): the step that ends and starts them, on the timer.

Every timer pass (`sweep`):

1. lists the check Jobs (label `keys.CHECK_LABEL`, any policy, any process: a restarted or new leader
   adopts what runs) and their pods; a Job that ended (`checks.result_of`, also TimedOut past its timeout
   and grace) is judged, appended to GPUNode `status.checks[]` (`check_results`), said in an Event, and
   deleted once the status holds it;
2. sees which selected GPU nodes run a pod using GPUs (any pod requesting `nvidia.com/gpu` or a DRA
   claim, but a check's) in the index a watch of pods keeps (`state/gpu_pods.py`: no request per
   pass; until its LIST is in, every node is as if busy and nothing starts): a node is idle since this
   process first saw it without one, or since its last GPU pod left if that is later (a new process
   waits `idleForSeconds` again: it never checks a node whose workload it did not see end);
3. honours on-demand requests (`check_requests`), then asks `checks.plan` which checks start: guards
   (unschedulable, in repair or a new node's validation, excluded, GPU Operator maintenance, overridden
   by a human), idle for `idleForSeconds`, due by `everySeconds`, never two on one node, within
   maxConcurrent over all policies; a dry-run policy's check is a `DryRun` Event "would check";
4. creates each Job (`check_jobs.build`: through the scheduler, every GPU, PriorityClass
   gpu-health-check; on a DRA node a claim of every device, `check_claims`) and sets the gauges (in
   flight, nodes overdue). A node with no GPUs the scheduler could give a check is said once and left
   out of the plan for a while. kube-scheduler preempts nothing for DRA devices, so a DRA check whose
   node a pending GPU pod waits for makes way itself (`check_yield`), and no check starts there.

With no policy wanting checks a pass only refuses the on-demand requests (GPUNode annotations, from the
cache), and asks nothing else of the API server unless a check of this process is still to be ended.
One pass's error is logged; the next pass retries (the Jobs and the status are the state).
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import check_gpus, checks, model, policies, signals, times
from gpuhealth_operator.ladder.check import (
    check_claims,
    check_jobs,
    check_requests,
    check_results,
    check_yield,
)
from gpuhealth_operator.ladder.repair import jobs, reading
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import pass_queue

logger = logging.getLogger(__name__)

Writer = Callable[[context.Context, str], Awaitable[None]]
"""Writes a node's operator status with its check history (`reconciler.write_history`)."""


def _wanting(ctx: context.Context) -> list[model.Policy]:
    return sorted((p for p in ctx.cache.policies.values() if p.active_checks), key=lambda p: p.name)


async def on_timer(ctx: context.Context, now: datetime.datetime, write: Writer) -> None:
    """The timer's sweep of the checks (`ladder/steps.py`): a failed request is logged, tried next pass."""
    try:
        await sweep(ctx, now, write)
    except kube.TRANSIENT_ERRORS:
        logger.warning("the active checks' pass failed (will retry)", exc_info=True)


async def sweep(ctx: context.Context, now: datetime.datetime, write: Writer) -> None:
    """One timer pass (module docstring)."""
    if not ctx.config.run_checks:
        return  # a backtest's replay: no Jobs run there; it is handed the recorded runs instead
    wanting = _wanting(ctx)
    memory = ctx.steps.check
    if not wanting:
        # A request no policy can serve is refused (the GPUNode's annotation and an Event: no Job is
        # listed for it), never left for the plugin to withdraw at its timeout.
        await check_requests.take(ctx, wanting=(), states=(), busy=set(), flying=(), now=now)
    if not wanting and not memory.in_flight and not memory.recorded:
        # Nothing is wanted and this process started nothing: no request at all. The chart grants no
        # right to list Jobs until checks or repair are enabled; a sweep that listed them anyway would be
        # refused every second. (A check of a policy deleted while no replica led ends by its deadline.)
        return
    ns = reading.namespace(ctx)
    listed = await check_jobs.list_jobs(ctx.client, ns)
    pods = await check_jobs.list_pods(ctx.client, ns) if listed else {}
    flying = await _end(ctx, listed, pods, now, write)
    ctx.steps.check.in_flight = len(flying)
    ctx.meters.checks_in_flight.set(len(flying))
    if not wanting:
        ctx.meters.set_checks_overdue({})
        return
    # kube-scheduler preempts nothing for DRA devices: a DRA check makes way itself (`check_yield`).
    waits = check_yield.waits(ctx)
    await check_yield.make_way(ctx, listed, pods, waits)
    busy = _busy_nodes(ctx)
    entries = [
        checks.PolicyChecks(p.name, p.dry_run, p.active_checks, frozenset(ctx.cache.selection(p).selected))
        for p in wanting
    ]
    names = sorted(set().union(*(e.nodes for e in entries)))
    if busy is not None:
        busy = {*busy, *check_yield.waited_for(ctx, names, waits)}  # a pending pod wants it: no check
    _idle_clocks(ctx, names, busy, now)
    states = [s for s in (_state(ctx, name) for name in names) if s is not None]
    counts: dict[tuple[str, str], int] = {(e.policy, c.name): 0 for e in entries for c in e.checks}
    for late in checks.overdue(entries, states, now):
        counts[(late.policy, late.check)] = counts.get((late.policy, late.check), 0) + 1
    ctx.meters.set_checks_overdue(counts)
    if busy is None:
        return  # the pods are not known yet: no check starts, a request waits (the annotation stays)
    requested = await check_requests.take(
        ctx, wanting=wanting, states=states, busy=busy, flying=flying, now=now
    )
    taken = {f.node for f in flying} | {s.node for s, _ in requested}
    plannable = [
        s for s in states if not check_claims.recently_without_gpus(ctx.steps.check.no_gpus, s.name, now)
    ]
    plan = checks.plan(entries, plannable, [*flying, *(_flying(s) for s, _ in requested)], now)
    starting = [*requested, *((s, None) for s in plan.start if s.node not in taken)]
    for start, request in starting:
        try:
            if await _start(ctx, start, request, ns, now):
                ctx.steps.check.in_flight += 1
        except (kube.ApiError, jobs.TemplateError) as error:
            logger.warning("check %s on node %s not started (will retry): %s", start.check, start.node, error)
    ctx.meters.checks_in_flight.set(ctx.steps.check.in_flight)
    await _dry_run(ctx, plan.would_start)


def _idle_clocks(
    ctx: context.Context, names: Sequence[str], busy: AbstractSet[str] | None, now: datetime.datetime
) -> None:
    """A node is idle from the later of this process's first sighting of it without a GPU pod and the
    moment its last GPU pod left (a pod that came and went between two passes counts)."""
    idle_since, freed_at = ctx.steps.check.idle_since, ctx.steps.check.pods.freed_at
    for name in names:
        if busy is None or name in busy:
            idle_since.pop(name, None)
            continue
        since = idle_since.setdefault(name, now)
        freed = freed_at.get(name)
        if freed is not None and freed > since:
            idle_since[name] = freed


def _flying(start: checks.Start) -> checks.InFlight:
    return checks.InFlight(start.node, start.policy, start.check)


async def _end(
    ctx: context.Context,
    listed: Sequence[Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    now: datetime.datetime,
    write: Writer,
) -> list[checks.InFlight]:
    """End the check Jobs that ended; the ones that run."""
    flying: list[checks.InFlight] = []
    ended: list[tuple[Mapping[str, Any], str]] = []
    for job in listed:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        node, uid = str(labels.get(keys.NODE_LABEL) or ""), str(meta.get("uid") or "")
        if uid in ctx.steps.check.recorded:
            ended.append((job, node))  # recorded: its status write or deletion is to be done again
            continue
        pod = pods.get(str(meta.get("name") or ""))
        started = times.parse(check_jobs.started_at(job))
        result = checks.result_of(
            job, pod, started=started, timeout_seconds=check_jobs.timeout_of(job), now=now
        )
        if result is None and uid in ctx.steps.check.yielded:
            result = vocabulary.CheckResult.PREEMPTED  # made way for a pending pod (`check_yield`)
        if result is None:
            if meta.get("deletionTimestamp") is None or pod is not None:  # its pod may hold the GPUs
                policy, check = labels.get(keys.POLICY_LABEL), labels.get(keys.CHECK_LABEL)
                flying.append(checks.InFlight(node, str(policy or ""), str(check or "")))
            continue
        ctx.steps.check.yielded.pop(uid, None)
        node, message, _ = check_results.end(ctx, job, pod, result, now)
        ctx.steps.check.recorded[uid] = node
        if result is vocabulary.CheckResult.PREEMPTED:
            ctx.steps.check.idle_since.pop(node, None)  # work arrived: idle again only from when it is gone
        logger.info("check Job %s on node %s ended: %s", meta.get("name"), node, result.value)
        await check_results.say(ctx, node, result, message)
        ended.append((job, node))
    for job, node in ended:
        meta = job.get("metadata") or {}
        made = ctx.steps.check.history.get(node)
        if made is not None and ctx.cache.gpunodes.get(node) is not None:
            await write(ctx, node)
            # The answer to our own write is in the cache, so its watch event judges nothing: ask for a
            # pass, in which ActiveCheckFailed is judged from the new history (and rules act on it).
            ctx.passes.request(node, pass_queue.Ask("timer"))
            gpunode = ctx.cache.gpunodes.get(node)
            stored = gpunode.status.get(check_results.STATUS_FIELD) if gpunode is not None else None
            if stored is None or check_results.history(ctx, node) != [dict(e) for e in stored]:
                continue  # not written (logged): written and deleted at the next pass
        try:
            await check_jobs.delete(ctx.client, str(meta.get("namespace")), str(meta.get("name")))
        except kube.ApiError:
            logger.warning("deleting check Job %s failed (will retry)", meta.get("name"), exc_info=True)
            continue
        ctx.steps.check.recorded.pop(str(meta.get("uid") or ""), None)
    return flying


def _busy_nodes(ctx: context.Context) -> AbstractSet[str] | None:
    """The nodes a pod using GPUs holds (`state/gpu_pods.py`, fed by a watch: no request); None until
    that watch's LIST has been applied (every node is then as if busy: nothing starts on unseen data)."""
    pods = ctx.steps.check.pods
    return pods.busy if pods.synced else None


def _state(ctx: context.Context, name: str) -> checks.NodeState | None:
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    if record is None or gpunode is None:
        return None
    view = record.view
    return checks.NodeState(
        name=name,
        idle_since=ctx.steps.check.idle_since.get(name),
        known_since=times.parse(gpunode.created),
        runs=check_results.runs(ctx, name),
        schedulable=not view.unschedulable,
        in_repair=keys.REPAIR_ANNOTATION in view.annotations or keys.UNVALIDATED_TAINT in view.taint_keys,
        excluded=policies.excluded(view),
        maintenance=signals.gpu_operator_maintenance(view.labels) is not None,
        overridden=any(
            (v := ctx.verdicts.get((p, name))) is not None and v.overridden for p in ctx.cache.policies
        ),
    )


async def _start(
    ctx: context.Context, start: checks.Start, request: str | None, ns: str, now: datetime.datetime
) -> bool:
    """Create the check's Job (and on a DRA node its claim's template); False when one of the node's
    exists (it runs: adopted next pass), or when nothing of the node's can hold its GPUs."""
    record = ctx.cache.nodes.get(start.node)
    if record is None:
        return False
    template = (await reading.templates(ctx, now)).get(start.template)
    if template is None:
        raise jobs.TemplateError(f"no Job template {start.template!r} in the repair templates")
    how = await check_claims.access(
        ctx.client, start.node, record.view.gpu_capacity or 0, driver=ctx.config.check_dra_driver
    )
    if how.kind is None:
        if request is not None:  # taken already (its annotation removed): said, or its caller waits
            await check_requests.say_refused(ctx, start.node, request, how.why)
        if start.node not in ctx.steps.check.no_gpus:  # said once, not every pass
            logger.warning("check %s on node %s not started: %s", start.check, start.node, how.why)
        ctx.steps.check.no_gpus[start.node] = now
        return False
    ctx.steps.check.no_gpus.pop(start.node, None)
    claim_version = await check_claims.served_version(ctx.client) if how.kind == check_gpus.DRA else None
    if how.kind == check_gpus.DRA and claim_version is None:
        raise jobs.TemplateError(
            f"node {start.node} uses DRA, but no resource.k8s.io version serves ResourceClaimTemplates"
        )
    name = check_jobs.job_name(start.node)
    claim = check_gpus.template_name(name, secrets.token_hex(3)) if claim_version else None
    body = check_jobs.build(
        template,
        start,
        namespace=ns,
        node_uid=record.uid,
        gpus=how.gpus,
        request_id=request,
        claim_template=claim,
    )
    created = await check_jobs.create(ctx.client, body)
    if created is not None and claim_version is not None:
        await _claim(ctx, claim_version, created)
    logger.info(
        "check %s (%s, policy %s) on node %s: Job %s/%s %s (%d GPUs, %s)",
        start.check,
        start.template,
        start.policy,
        start.node,
        ns,
        name,
        "created" if created is not None else "exists",
        how.gpus,
        f"DRA claim {claim} of DeviceClass {ctx.config.check_dra_device_class}"
        if claim
        else keys.GPU_RESOURCE,
    )
    return created is not None


async def _claim(ctx: context.Context, api_version: str, job: Mapping[str, Any]) -> None:
    """The just created DRA check Job's claim template; not made, the Job goes too (its pod could never
    be scheduled) and the error is raised: the check is started again next pass."""
    try:
        await check_claims.create(
            ctx.client, api_version, job, device_class=ctx.config.check_dra_device_class
        )
    except kube.ApiError:
        meta = job.get("metadata") or {}
        try:
            await check_jobs.delete(ctx.client, str(meta.get("namespace")), str(meta.get("name")))
        except kube.ApiError:
            logger.warning("deleting check Job %s failed (it times out)", meta.get("name"), exc_info=True)
        raise


async def _dry_run(ctx: context.Context, would: Sequence[checks.Start]) -> None:
    for start in would:
        key = (start.policy, start.node)
        if ctx.steps.check.dry_run_said.get(key) == start.check:
            continue
        ctx.steps.check.dry_run_said[key] = start.check
        await ctx.recorder.emit(
            events.subject(ctx.cache, start.node),
            vocabulary.EventReason.DRY_RUN,
            f"Dry run: policy {start.policy} would check node {start.node} with active check {start.check} "
            f"(template {start.template}, timeout {start.timeout_seconds:g}s).",
        )
