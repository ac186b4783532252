"""The watch of pods that feeds the active checks' index of GPU pods (`state/gpu_pods.py`), while wanted.

Only a policy with `spec.activeChecks` needs to know where pods use GPUs, so the watch runs only while
one exists in the cache: started when the first appears, stopped (the index emptied) when the last
goes. A cluster without checks pays nothing for it, and the grant it needs (list and watch pods,
cluster-wide) is the one the drain and the agents' liveness have anyway.

It is our own LIST + WATCH (`watching.Watch`: resume from the last version, a new LIST after 410 Gone,
quiet-stream detection), filtered by the API server to the pods not ended (a pod that ends arrives as
DELETED), and its LISTs replace the index (`watching.Snapshot`). No `resourceVersion=0` for the LIST:
a recent API server (1.34 and later: consistent reads and pages from its watch cache) serves this paged
LIST from the cache anyway, and an older one answers resourceVersion=0 from the cache ignoring the page
size, every pod of the cluster in one response. A LIST happens once per term and after 410 Gone, not
per pass. The index is the term's (`ctx.steps.check.pods`): a new term starts a new watch, and its
checks wait for that watch's LIST like the first term's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import watching
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

PODS_PATH: Final = "/api/v1/pods"
NOT_ENDED: Final = "status.phase!=Succeeded,status.phase!=Failed"
"""The server-side field selector: a pod that ended holds no GPU."""


def wanted(ctx: context.Context) -> bool:
    """Whether a policy in the cache wants active checks (and this process runs them: not a replay)."""
    return ctx.config.run_checks and any(p.active_checks for p in ctx.cache.policies.values())


class _Snapshot:
    """The index told of each LIST (`watching.Snapshot`), stamped with the context's clock."""

    def __init__(self, ctx: context.Context) -> None:
        self._ctx = ctx

    def listing(self) -> None:
        self._ctx.steps.check.pods.listing()

    def listed(self) -> None:
        pods = self._ctx.steps.check.pods
        pods.listed(self._ctx.clock())
        logger.info("GPU pods listed: %d, on %d nodes", len(pods), len(pods.busy))


def watch(ctx: context.Context) -> watching.Watch:
    """The watch of the pods not ended, into `ctx.steps.check.pods`."""
    client = ctx.client
    assert isinstance(client, kube.Kube), "the watches run where the operator talks HTTP"

    async def on_pod(event: watching.Event) -> None:
        body = event.get("object")
        kind = event.get("type")
        if isinstance(body, dict):
            ctx.steps.check.pods.observe(kind if isinstance(kind, str) else None, body, ctx.clock())

    return watching.Watch(client, PODS_PATH, on_pod, field_selector=NOT_ENDED, snapshot=_Snapshot(ctx))


async def run(ctx: context.Context) -> None:
    """For the term: run the watch while `wanted`, looking again every timer period.

    A watch that failed in a way it does not retry by itself ends this task with its error, and so the
    term, as any of the term's watches would."""
    task: asyncio.Task[None] | None = None
    try:
        while True:
            if task is not None and task.done():
                task.result()  # raises what ended it (a watch runs until cancelled)
            if wanted(ctx) and task is None:
                logger.info("a policy wants active checks: watching the pods that use GPUs")
                task = asyncio.create_task(watch(ctx).run(), name="watch gpu pods")
            elif not wanted(ctx) and task is not None:
                logger.info("no policy wants active checks: the watch of GPU pods stops")
                await _stop(task)
                task = None
                ctx.steps.check.pods.clear()
            await asyncio.sleep(ctx.config.tick_seconds)  # the period of the look, as the timer's
    finally:
        if task is not None:
            await _stop(task)


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel the watch and wait until it has stopped (a cancellation of our own still goes through)."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        logger.warning("the watch of GPU pods had failed: %r", task.exception())
