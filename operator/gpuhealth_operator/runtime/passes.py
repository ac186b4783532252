"""Running the node passes the watch events asked for (`pass_queue`), off the event path.

A Node or GPUNode event updates the cache and asks for a pass; the pass
(judge, act, report) runs here: one at a time per node, concurrently across
nodes. So a slow write (a struggling API server, a long budget wait) holds up
no event: the cache stays current, and a node that reported three times
during one pass is judged once more, on its newest report, not three times in
turn. The timer and policy events run their passes directly; the node locks
order them with these.

`run` is one of the term's tasks: when the term ends it is cancelled and
cancels the passes it started (their writes are fenced already). A replay has
no term: it hands an event to its handler, then `settle`s, which runs the
asked passes in order, one after another, as the handlers did when they
awaited the passes themselves.
"""

from __future__ import annotations

import asyncio
import logging

from gpuhealth_operator.client import latency
from gpuhealth_operator.ladder import stopping
from gpuhealth_operator.ladder.domain import domain_actions
from gpuhealth_operator.runtime import reconciler
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import pass_queue

logger = logging.getLogger(__name__)


async def run_one(ctx: context.Context, name: str, ask: pass_queue.Ask) -> None:
    """One pass over the node `name`: what the watch handler asked, in the order it asked it."""
    observe = lambda seconds: ctx.meters.event_to_write.labels(ask.handler).observe(seconds)  # noqa: E731
    with latency.carrying(ask.received, observe):
        if ask.stop_drains:
            await stopping.stop_drains(ctx)
        if ask.judge:
            await reconciler.reconcile_node(ctx, name, ask.handler)
            await domain_actions.node_changed(ctx, name)  # its health or domain label moved: judged again
        if ask.wake:
            await reconciler.wake_waiting(ctx, name)


async def run(ctx: context.Context) -> None:
    """Start every pass asked for as soon as its node has none running; until cancelled (the term ends)."""
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            await ctx.passes.ready()
            for name, ask in ctx.passes.take():
                task = asyncio.create_task(_guarded(ctx, name, ask), name=f"pass {name}")
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)


async def _guarded(ctx: context.Context, name: str, ask: pass_queue.Ask) -> None:
    try:
        await run_one(ctx, name, ask)
    except asyncio.CancelledError:
        raise
    except Exception:
        # Transient API errors are the reconciler's to count and retry; this is a bug: logged, counted, and
        # the node's next ask passes it again.
        ctx.meters.reconcile_errors.labels(ask.handler).inc()
        logger.exception("the pass of node %s asked by a %s event failed", name, ask.handler)
    finally:
        ctx.passes.finished(name)


async def settle(ctx: context.Context) -> None:
    """Run every pass asked for, in the order asked, one after another, until none is left (a replay,
    which hands over one event at a time and wants its effects before the next)."""
    while taken := ctx.passes.take(limit=1):
        name, ask = taken[0]
        try:
            await run_one(ctx, name, ask)
        finally:
            ctx.passes.finished(name)
