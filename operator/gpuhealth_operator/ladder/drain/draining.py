"""A node's drain as an action (`client.protocol.Action[Progress]`), and the one answer to where it stands.

The step of the node ladder after the cordon. `NodeDrain` offers the protocol:
`observe` says how far the drain got (in this process, else from what survives
a restart: the Node's `drain-started` annotation and the GPUNode's
`status.action`), `decide` why it may not start now, `start` begins it (its
deadline kept across a restart), `undo` cancels it. `advance` is the
transition `remediation` asks for on a node it cordoned to drain; the timer's
DrainFailed gauge (`timed_out`) and a kept cordon's action (`shown`) read the
same answers, so "did this drain fail?" has one owner.

The eviction loop itself is `client.drain`; this process's drain bookkeeping
is `drains.Drains`. A schedulable node has no drain (`forget`), and Drained
keeps meaning empty: a pod bound since is drained too (`_still_empty`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import logging
import time

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain, events, nodes
from gpuhealth_operator.decisions import model, times
from gpuhealth_operator.ladder import announcements, stopping
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction

DRAINED_RECHECK_SECONDS = 10.0
"""How often a Drained node's pods are looked at again (a pod bound to it after the drain is drained too)."""


class Progress(enum.Enum):
    """How far a node's drain got."""

    NOT_STARTED = "not started"
    RUNNING = "running"
    """Its task runs in this process."""
    STARTED = "started"
    """Begun before a restart (or a new leader's term): resumed with the deadline it began with."""
    DRAINED = "drained"
    """Completed here, or before a restart (status Drained)."""
    FAILED = "failed"
    """This term's drain timed out: a human takes over (DrainFailed was said)."""
    GONE = "gone"
    """The Node is gone: nothing left to drain."""


@dataclasses.dataclass(frozen=True)
class Standing:
    """Where a node's drain stands, read once from memory and the cache (`NodeDrain.standing`)."""

    progress: Progress
    started: datetime.datetime | None = None
    """The Node's `drain-started` annotation, where a start resumes from it (not started, begun before a
    restart, failed); None there when absent, and elsewhere (running, gone, ended in this process)."""


class NodeDrain:
    """`policy`'s drain of one node (`client.protocol.Action[Progress]`)."""

    def __init__(self, ctx: context.Context, policy: model.Policy, node: str) -> None:
        self.ctx = ctx
        self.policy = policy
        self.node = node

    @property
    def name(self) -> str:
        return f"drain of node {self.node} by policy {self.policy.name}"

    async def observe(self) -> Progress:
        return self.progress()

    def progress(self) -> Progress:
        """`observe`, from memory and the cache alone."""
        return self.standing().progress

    def standing(self) -> Standing:
        """Where the drain stands, read once: `advance` decides and starts from this one reading."""
        drains, name = self.ctx.steps.drain, self.node
        if drains.running(name):
            return Standing(Progress.RUNNING)
        result = drains.results.get(name)
        record = self.ctx.cache.nodes.get(name)
        if result is not None and not result.completed:
            return Standing(Progress.FAILED, _started(record) if record is not None else None)
        if record is None:
            return Standing(Progress.GONE)
        if result is not None:
            return Standing(Progress.DRAINED)
        started = _started(record)
        if started is None:
            return Standing(Progress.NOT_STARTED)
        drained = _status_action(self.ctx, name) == NodeAction.DRAINED
        return Standing(Progress.DRAINED if drained else Progress.STARTED, started)

    async def decide(self, now: datetime.datetime) -> str | None:
        """Why no drain may start now. A Drained node's pods are looked at (now and then): one bound
        since is drained too."""
        return await self._why_not(self.standing(), now)

    async def _why_not(self, standing: Standing, now: datetime.datetime) -> str | None:
        """`decide`, from where the drain stands."""
        progress = standing.progress
        if progress is Progress.RUNNING:
            return "it is draining"
        if progress is Progress.FAILED:
            return "its drain timed out; a human takes over"
        if progress is Progress.GONE:
            return "the Node is gone"
        if progress is Progress.DRAINED:
            if await _still_empty(self.ctx, self.node, self.policy):
                return "it is drained and holds no evictable pod"
            return None
        if (
            progress is Progress.STARTED
            and standing.started is not None
            and _failed_before_a_restart(self.ctx, self.policy, self.node, standing.started, now)
        ):
            return "its drain timed out before a restart; a human takes over"
        return None

    async def start(self, now: datetime.datetime, *, fresh: bool = False) -> bool:
        """Begin the drain: with a fresh deadline on a Drained node a pod came to (or `fresh`: one under
        repair, whatever the status says), with the one it began with after a restart, else stamped
        `drain-started` now. False: it runs, or the Node is gone."""
        return await self._begin(self.standing(), now, fresh=fresh)

    async def _begin(self, standing: Standing, now: datetime.datetime, *, fresh: bool = False) -> bool:
        """`start`, from where the drain stands."""
        progress = standing.progress
        if progress in (Progress.RUNNING, Progress.GONE):
            return False
        drained = fresh or progress is Progress.DRAINED  # a pod came to it: a drain of its own, from now
        started = standing.started if not drained else None
        if started is None:
            started = now
            if not drained:
                body = await nodes.set_drain_started(self.ctx.client, self.node, times.render(now))
                if self.ctx.cache.refresh_node(body) is None:
                    return False
        deadline = _deadline(self.policy, started)
        task = asyncio.create_task(self._run(started, deadline), name=f"drain-{self.node}")
        self.ctx.steps.drain.start(self.node, self.policy.name, task)
        return True

    async def undo(self) -> bool:
        """Cancel the drain and forget how it ended (its cordon is gone); False when none was kept."""
        kept = self.node in self.ctx.steps.drain
        self.ctx.steps.drain.stop(self.node)
        return kept

    async def _run(self, started: datetime.datetime, deadline: datetime.datetime) -> drain.Result:
        ctx, policy, name = self.ctx, self.policy, self.node
        try:
            result = await drain.drain(
                ctx.client,
                name,
                options=ctx.drain_options(policy),
                deadline=deadline,
                semaphore=ctx.steps.drain.eviction_slots,
                on_eviction=lambda outcome: ctx.meters.evictions.labels(outcome).inc(),
                should_stop=lambda: stopping.why_stop(ctx, policy.name, name) is not None,
            )
        except Exception:
            logger.exception("drain of node %s crashed; the next reconcile retries it", name)
            raise
        if result.stopped:  # an emergency stop: the cordon stays, a later reconcile may resume the drain
            reason = stopping.why_stop(ctx, policy.name, name)
            if reason is not None and ctx.cache.nodes.get(name) is not None:
                await stopping.say_stopped(ctx, policy.name, name, reason)
            return result
        elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        unsaid = None
        if result.completed:
            ctx.meters.drain_duration.labels("completed").observe(elapsed)
            message = drain.drained_message(policy.name, result)
            if not await announcements.drained(ctx, name, message):
                unsaid = message  # Drained all the same (an Event is a report); said when next looked at
        else:
            ctx.meters.drain_duration.labels("failed").observe(elapsed)
            await ctx.recorder.emit_on(
                ctx.cache,
                name,
                vocabulary.EventReason.DRAIN_FAILED,
                drain.failed_message(policy.name, policy.drain_timeout_seconds, result),
                events.WARNING,
            )
        ctx.steps.drain.finished(name, result, unsaid=unsaid)
        return result


async def advance(
    ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime
) -> NodeAction:
    """The next step of `policy`'s drain of a node it cordoned to drain; the node's `status.action`."""
    action = NodeDrain(ctx, policy, name)
    standing = action.standing()
    progress = standing.progress
    if progress is Progress.RUNNING:
        return NodeAction.DRAINING
    if progress is Progress.FAILED:
        return NodeAction.CORDONED
    if progress is Progress.GONE:
        return NodeAction.NONE
    looked = ctx.steps.drain.checked.get(name)
    why_not = await action._why_not(standing, now)
    if why_not is None:
        # A Drained node's pods were just listed (an await): where its drain stands is read again.
        if progress is Progress.DRAINED:
            standing = action.standing()
        return NodeAction.DRAINING if await action._begin(standing, now) else NodeAction.NONE
    if progress is not Progress.DRAINED:
        return NodeAction.CORDONED  # timed out before a restart
    unsaid = ctx.steps.drain.unsaid.get(name)
    if (
        unsaid is not None
        and ctx.steps.drain.checked.get(name) != looked  # once per look at the pods, not once per pass
        and await announcements.drained(ctx, name, unsaid)
    ):
        ctx.steps.drain.said(name)
    return NodeAction.DRAINED


async def again(ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime) -> NodeAction:
    """Drain a node under repair once more: the caller saw a pod its drain may evict come to it after a
    step. With a deadline of its own from now (the cordon's first drain, or one a restart lost, is no
    reason to give up on this pod). DRAINING while it runs, CORDONED once this term's drain of it failed
    (DrainFailed was said; the repair phase's own deadline ends the wait)."""
    action = NodeDrain(ctx, policy, name)
    progress = action.progress()
    if progress is Progress.RUNNING:
        return NodeAction.DRAINING
    if progress is Progress.FAILED:
        return NodeAction.CORDONED
    if progress is Progress.GONE:
        return NodeAction.NONE
    return NodeAction.DRAINING if await action.start(now, fresh=True) else NodeAction.NONE


def shown(ctx: context.Context, name: str) -> NodeAction:
    """Where a cordoned node's drain stands when none is to be advanced (a Cordon rule, a kept cordon)."""
    if ctx.steps.drain.running(name):
        return NodeAction.DRAINING
    result = ctx.steps.drain.results.get(name)
    if (result is not None and result.completed) or _status_action(ctx, name) == NodeAction.DRAINED:
        return NodeAction.DRAINED
    return NodeAction.CORDONED


def timed_out(
    ctx: context.Context, policy: model.Policy, record: cache.NodeRecord, now: datetime.datetime
) -> bool:
    """A node `policy` cordoned whose drain timed out, waiting for a human (GPUHealthDrainFailed).

    A failed result of this term, or (after a restart or a new term, nothing in memory) what `decide`
    calls a drain that timed out before a restart: one that would resume is not failed.
    """
    name = record.view.name
    result = ctx.steps.drain.results.get(name)
    if result is not None:
        return not result.completed
    if name in ctx.steps.drain:
        return False
    started = _started(record)
    return started is not None and _failed_before_a_restart(ctx, policy, name, started, now)


async def say_done(ctx: context.Context, policy: model.Policy, name: str) -> None:
    """Before the cordon is lifted: say NodeDrained of a drain of this cordon that emptied the node and was
    not said yet, since it goes with the cordon. Said when this term's drain completed with its Event
    refused, or when a drain began before a restart (the term that ran it may have died between the
    last eviction and its Event) and the node holds no evictable pod now. `announcements` names the
    Event after the cordon, so a drain a dead term did say is not said twice. A drain that did not
    empty the node is not said."""
    result, unsaid = ctx.steps.drain.results.get(name), ctx.steps.drain.unsaid.get(name)
    record = ctx.cache.nodes.get(name)
    if unsaid is None:
        if (
            result is not None  # this term's drain ended: said, or failed or stopped
            or ctx.steps.drain.running(name)
            or record is None
            or keys.DRAIN_STARTED_ANNOTATION not in record.view.annotations
        ):
            return
        pods = await drain.list_pods(ctx.client, name)
        ended = drain.emptied(drain.classify(pods, ctx.drain_options(policy)))
        if ended is None or not ended.completed:
            return
        unsaid = drain.drained_message(policy.name, ended)
    if await announcements.drained(ctx, name, unsaid):
        ctx.steps.drain.said(name)


async def forget(ctx: context.Context, name: str) -> None:
    """A schedulable node has no drain: whoever uncordoned it, the drain belonged to that cordon."""
    record = ctx.cache.nodes.get(name)
    if record is None or record.view.unschedulable:
        return
    ctx.steps.drain.stop(name)
    if keys.DRAIN_STARTED_ANNOTATION in record.view.annotations:
        ctx.cache.refresh_node(await nodes.set_drain_started(ctx.client, name, None))


async def _still_empty(ctx: context.Context, name: str, policy: model.Policy) -> bool:
    """Whether a Drained node still holds no evictable pod (by `policy`'s drain options); looked at once
    per DRAINED_RECHECK_SECONDS.

    A pod can land on a cordoned node (bound by `nodeName`, or tolerating the
    cordon); `kubectl drain` would evict it, and so do we.
    """
    checked = ctx.steps.drain.checked.get(name)
    clock = time.monotonic()
    if checked is not None and clock - checked < DRAINED_RECHECK_SECONDS:
        return True
    ctx.steps.drain.looked(name, clock)
    return not drain.classify(await drain.list_pods(ctx.client, name), ctx.drain_options(policy)).wanted


def _failed_before_a_restart(
    ctx: context.Context, policy: model.Policy, name: str, started: datetime.datetime, now: datetime.datetime
) -> bool:
    """A drain begun (`started`, its annotation) before a restart (nothing of it in memory), the status
    saying Cordoned, and its deadline passed. Not before the deadline: the status write of Draining may be
    what was lost."""
    if _status_action(ctx, name) != NodeAction.CORDONED:
        return False
    return _deadline(policy, started) <= now


def _deadline(policy: model.Policy, started: datetime.datetime) -> datetime.datetime:
    return started + datetime.timedelta(seconds=policy.drain_timeout_seconds)


def _started(record: cache.NodeRecord) -> datetime.datetime | None:
    return times.parse(record.view.annotations.get(keys.DRAIN_STARTED_ANNOTATION))


def _status_action(ctx: context.Context, name: str) -> str | None:
    gpunode = ctx.cache.gpunodes.get(name)
    return gpunode.status.get("action") if gpunode else None
