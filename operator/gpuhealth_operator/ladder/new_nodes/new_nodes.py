"""Validation of new nodes (`spec.repair.validation.newNodes: true`, issue #26 item 4): the requests.

Every timer pass (`sweep`) looks for the nodes a policy with newNodes selects (a GPUNode, not
excluded) that are new to it (`decisions.new_nodes.is_new`: created after the policy, never validated
as new). Such a node gets the NoSchedule taint `keys.UNVALIDATED_TAINT` at once (unless a workload
pod already runs on it, `decisions.workload_pods`, whatever the drain would evict: then it is in
service, not new; remembered per Node UID in `Context.steps.new_nodes.in_service`, forgotten with the
node), then the policy's Validation Job (`decisions.new_nodes.job_name`, adopted on 409), within the
policy's repair maxConcurrent (repairs in progress and running new-node validations together), never
while the policy's fleet circuit breaker holds disruptions back, on a node under repair or busy with a
workload pod.

- Job succeeded: the taint goes, `keys.VALIDATED_ANNOTATION` = the time, Event ValidationPassed, a
  `status.repairs[]` entry.
- Job failed or timed out: the taint stays, label needs-repair=manual, `keys.VALIDATION_FAILED_ANNOTATION`,
  Events ValidationFailed and NodeRetired. A human who removes the taint and label returns the node; it
  is never validated as new again.
- A dry-run policy says "would validate new node" (Event DryRun, once per node and process) and does
  nothing else. A node tainted mid-validation that no longer qualifies (deselected, excluded, the policy
  deleted, in dry run or without newNodes) has its Job deleted and the taint removed; so has a deleted
  node's Job (in this process; otherwise its activeDeadlineSeconds ends it).
"""

from __future__ import annotations

import datetime
import hmac
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube, nodes
from gpuhealth_operator.decisions import model, new_nodes, policies, repair, times
from gpuhealth_operator.ladder.repair import job_step, jobs, reading, records
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache, pass_queue

logger = logging.getLogger(__name__)

Step = new_nodes.Step
Result = vocabulary.RepairResult
STEP_NAME: Final = "new-node"
"""`status.repairs[].step` of a new node's validation (cycle 0)."""


def _wanting(ctx: context.Context) -> list[model.Policy]:
    return sorted(
        (p for p in ctx.cache.policies.values() if p.repair is not None and p.repair.validation_new_nodes),
        key=lambda p: p.name,
    )


def _policy_of(
    ctx: context.Context, wanting: list[model.Policy], record: cache.NodeRecord
) -> model.Policy | None:
    if policies.excluded(record.view):
        return None
    name = record.view.name
    return next((p for p in wanting if name in ctx.cache.selection(p).selected), None)


def _facts(
    ctx: context.Context, policy: model.Policy | None, record: cache.NodeRecord, *, started: bool, busy: bool
) -> new_nodes.Facts:
    annotations = record.view.annotations
    validated = keys.VALIDATED_ANNOTATION in annotations or keys.VALIDATION_FAILED_ANNOTATION in annotations
    return new_nodes.Facts(
        wanted=policy is not None,
        dry_run=policy is not None and policy.dry_run,
        new=policy is not None and new_nodes.is_new(record.created, policy.created, validated=validated),
        tainted=keys.UNVALIDATED_TAINT in record.view.taint_keys,
        failed=keys.VALIDATION_FAILED_ANNOTATION in annotations,
        started=started,
        busy=busy,
    )


async def sweep(ctx: context.Context, now: datetime.datetime) -> None:
    """One timer pass over the fleet; one node's error is logged and retried next pass."""
    for gone in [n for n in ctx.steps.repair.validations if ctx.cache.nodes.get(n) is None]:
        ctx.steps.repair.validations.discard(gone)
        try:
            await jobs.delete(ctx.client, reading.namespace(ctx), new_nodes.job_name(gone))
        except kube.ApiError:
            ctx.steps.repair.validations.add(gone)
            logger.warning(
                "deleting the new-node validation Job of deleted node %s failed", gone, exc_info=True
            )
    wanting = _wanting(ctx)
    candidates: list[tuple[str, model.Policy | None]] = []
    # With no policy validating new nodes, only a tainted node has anything to undo: visit those, not
    # the fleet (issue 29). With one, every node may be new to it.
    names = list(ctx.cache.nodes) if wanting else ctx.cache.in_node_order(ctx.cache.unvalidated)
    for name in names:
        record = ctx.cache.nodes.get(name)
        if record is None:
            continue
        tainted = keys.UNVALIDATED_TAINT in record.view.taint_keys
        if not wanting and not tainted:
            continue
        policy = _policy_of(ctx, wanting, record)
        if tainted or (policy is not None and _facts(ctx, policy, record, started=False, busy=False).new):
            candidates.append((name, policy))
    starting: list[tuple[str, model.Policy]] = []
    for name, policy in candidates:
        try:
            if await _visit(ctx, name, policy, now):
                assert policy is not None
                starting.append((name, policy))
        except (kube.ApiError, jobs.TemplateError):
            logger.warning("validation of new node %s failed this pass (will retry)", name, exc_info=True)
    for name, policy in starting:
        try:
            await _start(ctx, name, policy, now)
        except kube.ApiError:
            logger.warning("validation Job of new node %s not created (will retry)", name, exc_info=True)


async def _visit(
    ctx: context.Context, name: str, policy: model.Policy | None, now: datetime.datetime
) -> bool:
    """Act on one node; True: it waits for its validation Job to be created (`_start`)."""
    async with ctx.node_locks[name]:
        record = ctx.cache.nodes.get(name)
        if record is None:
            return False
        job_name = new_nodes.job_name(name)
        ns = reading.namespace(ctx)
        tainted = keys.UNVALIDATED_TAINT in record.view.taint_keys
        body = await jobs.read(ctx.client, ns, job_name) if tainted else None
        if body is not None and not _belongs(body, record):
            body = None  # an earlier life's Job of the name (a recreated node): `_start` replaces it
        busy = False
        # In service: this Node (its UID: one created again under the name is another node) was busy
        # when first seen new. Forgotten with the node (`Context.forget_node`).
        in_service = ctx.steps.new_nodes.in_service.get(name) == record.uid
        if not tainted and policy is not None and not policy.dry_run and not in_service:
            busy = bool(await reading.workload(ctx, policy, name))
            if busy:
                ctx.steps.new_nodes.in_service[name] = record.uid
                in_service = True
                logger.info(
                    "node %s is new to policy %s but already runs pods: in service", name, policy.name
                )
        if in_service and not tainted:
            return False
        step = new_nodes.plan(_facts(ctx, policy, record, started=body is not None, busy=busy))
        if step is Step.NOTHING:
            return False
        if step is Step.DRY_RUN:
            if ctx.steps.new_nodes.said.get(name) != record.uid:
                ctx.steps.new_nodes.said[name] = record.uid
                assert policy is not None
                await ctx.recorder.emit_on(
                    ctx.cache,
                    name,
                    vocabulary.EventReason.DRY_RUN,
                    f"Policy {policy.name} is in dry run: would validate new node {name} before it takes "
                    f"work (taint {keys.UNVALIDATED_TAINT}, Job {ns}/{job_name}).",
                )
            return False
        if step is Step.TAINT:
            await _set_taint(ctx, record, present=True)
            logger.info(
                "node %s is new to policy %s: tainted %s",
                name,
                policy and policy.name,
                keys.UNVALIDATED_TAINT,
            )
            return False
        if step is Step.CANCEL:
            deleted = body is not None and await jobs.delete(ctx.client, ns, job_name)
            await _set_taint(ctx, record, present=False)
            ctx.steps.repair.validations.discard(name)
            logger.info(
                "validation of new node %s cancelled (no longer a new node of a policy with newNodes)%s",
                name,
                "; its Job was deleted" if deleted else "",
            )
            return False
        if step is Step.START:
            return True
        assert policy is not None and policy.repair is not None
        ctx.steps.repair.validations.add(name)
        timeout = policy.repair.validation_timeout_seconds or 0.0
        view = repair.job_view(body)
        created = str(((body or {}).get("metadata") or {}).get("creationTimestamp") or "")
        transition = new_nodes.observe(view, job_name, created, timeout, now)
        if transition.outcome is new_nodes.Outcome.WAIT:
            return False
        if transition.outcome is new_nodes.Outcome.PASSED:
            await _passed(ctx, record, policy, transition.message, now)
        else:
            await _failed(ctx, record, policy, transition.message, now)
        if view.phase is repair.JobPhase.ACTIVE:
            await jobs.delete(ctx.client, ns, job_name)  # timed out (after the Node says so: no second Job)
        ctx.steps.repair.validations.discard(name)
        return False


def _belongs(job: Mapping[str, Any], record: cache.NodeRecord) -> bool:
    """Whether the Job is ours and of this node's life: it carries the Node's creationTimestamp as its
    cycle stamp (`keys.REPAIR_CYCLE_STARTED_ANNOTATION`; a node deleted and created again under the name
    is new again) and the token whose hash the Node holds (`keys.VALIDATION_TOKEN_ANNOTATION`, written
    before the Job). The name and the stamp are readable by anyone: a Job with only those is not ours."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stamped = annotations.get(keys.REPAIR_CYCLE_STARTED_ANNOTATION)
    created = record.created
    if not (isinstance(stamped, str) and bool(created) and times.parse(stamped) == times.parse(created)):
        return False
    digest = record.view.annotations.get(keys.VALIDATION_TOKEN_ANNOTATION)
    token = annotations.get(keys.REPAIR_TOKEN_ANNOTATION)
    if not digest or not isinstance(token, str):
        return False
    return hmac.compare_digest(repair.token_digest(token), digest)


async def _start(ctx: context.Context, name: str, policy: model.Policy, now: datetime.datetime) -> None:
    """Create the node's validation Job when it is safe and a slot of maxConcurrent is free."""
    spec = policy.repair
    record = ctx.cache.nodes.get(name)
    if spec is None or record is None or keys.REPAIR_ANNOTATION in record.view.annotations:
        return
    paused = ctx.breakers.paused(policy.name)
    if paused is not None:
        logger.info("new node %s waits: policy %s's breaker is %s", name, policy.name, paused.state.value)
        return
    if await reading.workload(ctx, policy, name):
        logger.info("new node %s waits: a workload pod runs on it", name)
        return
    async with ctx.admission.lock:  # the count of repairs in progress with `repairing.begin`'s
        running = len(set(reading.holders(ctx)) - {name})
        limit = policies.resolve_max_concurrent(spec, len(ctx.cache.selection(policy).selected))
        if running >= limit:
            logger.info("new node %s waits: %d of %d repairs/validations run", name, running, limit)
            return
        ctx.steps.repair.validations.add(name)
    ns = reading.namespace(ctx)
    job_name = new_nodes.job_name(name)
    # Our identity on the Job: a new token, its hash on the Node first (a Job never outlives its hash).
    token = secrets.token_urlsafe(24)
    try:
        marked = await ctx.client.patch(
            nodes.node_path(name),
            {"metadata": {"annotations": {keys.VALIDATION_TOKEN_ANNOTATION: repair.token_digest(token)}}},
        )
    except kube.ApiError:
        ctx.steps.repair.validations.discard(name)
        raise  # the next pass tries again
    ours = ctx.cache.refresh_node(marked) or record
    try:
        template = (await reading.templates(ctx, now)).get(vocabulary.VALIDATION_JOB)
        if template is None:
            raise jobs.TemplateError(f"no {vocabulary.VALIDATION_JOB} template")
        body = jobs.fill(
            template,
            name=job_name,
            namespace=ns,
            node=name,
            node_uid=record.uid,
            policy=policy.name,
            cycle=0,
            action=vocabulary.VALIDATION_JOB,
            gpus=reading.all_gpus(ctx, name),
            timeout_seconds=spec.validation_timeout_seconds or 0.0,
            cycle_started=record.created,
            guard=False,  # no repair label on a new node: the ownerReference and `orphan_jobs` only
            extra_env=await job_step.validation_env(ctx, name),
        )
        body["metadata"]["annotations"][keys.REPAIR_TOKEN_ANNOTATION] = token
        _, created = await jobs.create(ctx.client, body, belongs=lambda job: _belongs(job, ours))
    except jobs.StaleJob as error:
        ctx.steps.repair.validations.discard(name)
        logger.info("new node %s waits: %s", name, error)
        return
    except jobs.TemplateError as error:
        ctx.steps.repair.validations.discard(name)
        await _failed(ctx, record, policy, f"no Job could be made: {error}", now)
        return
    except kube.ApiError as error:
        ctx.steps.repair.validations.discard(name)
        if not 400 <= error.status < 500 or error.status in (408, 429):
            raise
        await _failed(
            ctx,
            record,
            policy,
            f"Job {ns}/{job_name} could not be created: {error.status} {error.reason}",
            now,
        )
        return
    _note(ctx, name, now, Result.STARTED, f"Job {ns}/{job_name} {'created' if created else 'adopted'}")
    logger.info(
        "new node %s: validation Job %s/%s %s", name, ns, job_name, "created" if created else "adopted"
    )


async def _set_taint(ctx: context.Context, record: cache.NodeRecord, *, present: bool) -> None:
    """Add or remove our unvalidated taint (the list as of the version read; 409 on change)."""
    body = {
        "metadata": {"resourceVersion": record.resource_version},
        "spec": {"taints": _taints(record, present=present) or None},
    }
    await ctx.client.patch(nodes.node_path(record.view.name), body)


def _taints(record: cache.NodeRecord, *, present: bool) -> list[dict[str, Any]]:
    kept = [dict(t) for t in record.taints if t.get("key") != keys.UNVALIDATED_TAINT]
    if present:
        kept.append({"key": keys.UNVALIDATED_TAINT, "effect": nodes.TAINT_EFFECT})
    return kept


def _note(ctx: context.Context, name: str, now: datetime.datetime, result: Result, message: str) -> None:
    # The entry is written with the node's next status, and the timer's sweep runs outside any pass over
    # the node: ask for one, or a validation's Started waits for its end (a new process loses it).
    ctx.passes.request(name, pass_queue.Ask("timer"))
    records.record(
        ctx,
        name,
        now,
        cycle=0,
        step=STEP_NAME,
        action=vocabulary.VALIDATION_JOB,
        gpus=(),
        result=result,
        message=message,
    )


async def _passed(
    ctx: context.Context, record: cache.NodeRecord, policy: model.Policy, message: str, now: datetime.datetime
) -> None:
    name = record.view.name
    body = {
        "metadata": {
            "resourceVersion": record.resource_version,
            "annotations": {keys.VALIDATED_ANNOTATION: times.render(now)},
        },
        "spec": {"taints": _taints(record, present=False) or None},
    }
    await ctx.client.patch(nodes.node_path(name), body)
    _note(ctx, name, now, Result.VALIDATION_PASSED, message)
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.VALIDATION_PASSED,
        f"New node validated by policy {policy.name}: {message}; taint {keys.UNVALIDATED_TAINT} removed, "
        "the node takes work.",
    )


async def _failed(
    ctx: context.Context, record: cache.NodeRecord, policy: model.Policy, message: str, now: datetime.datetime
) -> None:
    name = record.view.name
    body = {
        "metadata": {
            "resourceVersion": record.resource_version,
            "annotations": {keys.VALIDATION_FAILED_ANNOTATION: times.render(now)},
            "labels": {keys.NEEDS_REPAIR_LABEL: keys.NEEDS_REPAIR_MANUAL},
        },
        "spec": {"taints": _taints(record, present=True)},
    }
    await ctx.client.patch(nodes.node_path(name), body)
    _note(ctx, name, now, Result.VALIDATION_FAILED, message)
    _note(ctx, name, now, Result.RETIRED, "new node failed its validation")
    subject = events.subject(ctx.cache, name)
    await ctx.recorder.emit(
        subject,
        vocabulary.EventReason.VALIDATION_FAILED,
        f"Validation of new node by policy {policy.name} failed: {message}.",
        events.WARNING,
    )
    await ctx.recorder.emit(
        subject,
        vocabulary.EventReason.NODE_RETIRED,
        f"New node failed its validation (policy {policy.name}): it keeps taint {keys.UNVALIDATED_TAINT} and "
        f"label {keys.NEEDS_REPAIR_LABEL}={keys.NEEDS_REPAIR_MANUAL} until a human removes both "
        f"(kubectl taint node {name} {keys.UNVALIDATED_TAINT}-; "
        f"kubectl label node {name} {keys.NEEDS_REPAIR_LABEL}-).",
        events.WARNING,
    )
