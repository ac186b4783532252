"""The agent lets go of the GPUs before a reset (issue 48, Deliver 1; DESIGN.md "Repair that releases
the GPU").

`nvidia-smi --gpu-reset` refuses while any process holds the device open, and gpu-health's own agent
holds NVML open for as long as it runs (the drain skips DaemonSet pods). So before a ResetGPU step's Job
the operator asks the node's agent to let go: the GPUNode annotation `keys.RELEASE_GPUS_ANNOTATION`
(value: the cycle's start stamp, so an answer to an earlier cycle's ask is never taken for this one's).
The agent shuts NVML down and answers `status.agent.released` with the same value; the Job is created
only after that answer (`ready`). The ask goes (`end`) once the step's Job ended, the step failed or
timed out, or the cycle was cancelled or retired; the agent then initialises NVML again and reports at
once. An agent that never answers holds the step until its deadline, then the step fails
(`repairing`), so a node whose agent is gone still moves on.

The agent keeps heartbeating while released (its loop runs, only NVML is shut), so the quiet is never
`AgentStale`; its report while released carries the facts it had, which repair does not read as an
effect (`released`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpuhealth_api import keys
from gpuhealth_operator.client import gpunodes, kube
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)


def supported(ctx: context.Context, name: str) -> bool:
    """Whether the node's agent says it releases NVML on request (`status.agent.canRelease`). An agent
    older than issue 48 (a rollout in progress, a hand-written GPUNode) is not asked: its reset runs as
    before, and does not wait for an answer that can never come."""
    gpunode = ctx.cache.gpunodes.get(name)
    agent: Mapping[str, Any] = (gpunode.status.get("agent") or {}) if gpunode is not None else {}
    return isinstance(agent, Mapping) and agent.get("canRelease") is True


def asked(ctx: context.Context, name: str) -> str | None:
    """The ask on the GPUNode as cached (None: none)."""
    gpunode = ctx.cache.gpunodes.get(name)
    return gpunode.annotations.get(keys.RELEASE_GPUS_ANNOTATION) if gpunode is not None else None


def released(ctx: context.Context, name: str) -> str | None:
    """The agent's answer (`status.agent.released`) as cached (None: it holds NVML)."""
    gpunode = ctx.cache.gpunodes.get(name)
    agent: Mapping[str, Any] = (gpunode.status.get("agent") or {}) if gpunode is not None else {}
    value = agent.get("released") if isinstance(agent, Mapping) else None
    return value if isinstance(value, str) and value else None


async def ready(ctx: context.Context, name: str, stamp: str) -> bool:
    """Whether the agent let go for this ask: asks first where not asked yet (the ask before any Job).
    True at once for an agent that cannot release (`supported`)."""
    if (not ctx.config.release_gpus or not supported(ctx, name)) and asked(ctx, name) is None:
        return True
    if asked(ctx, name) != stamp:
        await _annotate(ctx, name, stamp)
        return False
    return released(ctx, name) == stamp


async def end(ctx: context.Context, name: str) -> None:
    """Take the ask back (the agent initialises NVML again); nothing where none is asked."""
    if asked(ctx, name) is not None:
        await _annotate(ctx, name, None)


async def _annotate(ctx: context.Context, name: str, value: str | None) -> None:
    try:
        body = await gpunodes.annotate(ctx.client, name, {keys.RELEASE_GPUS_ANNOTATION: value})
    except kube.ApiError as error:
        if not error.not_found:
            raise
        return  # the GPUNode is gone (its Node deleted): the cycle is cancelled on the next pass
    ctx.cache.refresh_gpunode(body, ctx.clock())
    logger.info(
        "node %s: %s GPU release (%s)", name, "asked for" if value else "ended", keys.RELEASE_GPUS_ANNOTATION
    )
