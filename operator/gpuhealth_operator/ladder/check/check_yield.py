"""A DRA check makes way for a pending pod that wants its node's GPUs: kube-scheduler cannot preempt it.

kube-scheduler 1.36 preempts nothing for DRA devices (`decisions.waiting_pods`), so where a pending
pod that uses GPUs waits for a node whose check holds them through a claim, the operator evicts the
check's pod (the Eviction API, as the scheduler's preemption deletes a victim: its grace period, a
DisruptionTarget condition, at most YIELD_GRACE_SECONDS to stop). The next pass ends the run Preempted
(never a failure) and deletes the Job; a restarted leader that does not remember the eviction learns
the same from the Job, which its podFailurePolicy fails on that condition. The claim is released with
the pod, and the scheduler places the workload. Meanwhile no check starts on a node a pending pod waits
for.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.client import drain
from gpuhealth_operator.decisions import check_gpus, waiting_pods
from gpuhealth_operator.ladder.check import check_jobs
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

YIELD_GRACE_SECONDS: Final = check_jobs.STOP_GRACE_SECONDS
"""Most seconds an evicted check pod is given to stop (less where its template says less): the workload
waits for its claim until the pod is gone."""
_EVICT: Final = drain.Options(
    grace_period_seconds=None, delete_empty_dir_data=True, backoff_initial_seconds=1, backoff_max_seconds=1
)


def waits(ctx: context.Context) -> waiting_pods.Waits:
    """The nodes pending pods that use GPUs wait for, from the watch-fed index (`state/gpu_pods.py`): no
    request. Nothing is known to wait before that index is synced, when no check starts anyway."""
    pods = ctx.steps.check.pods
    return pods.waits if pods.synced else waiting_pods.Waits()


def waited_for(ctx: context.Context, nodes: Sequence[str], found: waiting_pods.Waits) -> set[str]:
    """Of `nodes`, those a pending pod waits for."""
    return {
        name
        for name in nodes
        if found.for_node(name, (record.view.labels if (record := ctx.cache.nodes.get(name)) else {}))
    }


async def make_way(
    ctx: context.Context,
    listed: Sequence[Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    found: waiting_pods.Waits,
) -> None:
    """Evict the pod of every DRA check whose node a pending pod waits for (once: not one being deleted)."""
    for job in listed:
        meta = job.get("metadata") or {}
        node = str((meta.get("labels") or {}).get(keys.NODE_LABEL) or "")
        pod = pods.get(str(meta.get("name") or ""))
        if pod is None or check_gpus.claimed_template(job) is None or drain.is_terminating(dict(pod)):
            continue
        if drain.is_finished(dict(pod)) or not waited_for(ctx, [node], found):
            continue
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        options = dataclasses.replace(
            _EVICT, grace_period_seconds=min(grace if isinstance(grace, int) else 30, YIELD_GRACE_SECONDS)
        )
        outcome, said = await drain.evict(ctx.client, dict(pod), options)
        if outcome in ("evicted", "gone"):
            ctx.steps.check.yielded[str(meta.get("uid") or "")] = node
        logger.info(
            "check Job %s on DRA node %s: a pending pod wants its GPUs, and kube-scheduler does not preempt "
            "for DRA devices: check pod evicted (%s%s)",
            meta.get("name"),
            node,
            outcome,
            f": {said}" if said else "",
        )
