"""A repair step's or a validation's Job as an action of the protocol (`client.protocol`): observe it,
decide whether it may start, start it (create from its template), undo it.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain
from gpuhealth_operator.decisions import (
    hostengine,
    model,
    repair,
    step_kinds,
    workload_pods,
)
from gpuhealth_operator.ladder.repair import jobs, reading, records
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

Phase = repair.Phase


# --- the action protocol: a step's Job ---------------------------------------------------------------


class JobStep:
    """One repair step (or validation) as a Job on the node (`client.protocol.Action[repair.JobView]`)."""

    def __init__(
        self,
        ctx: context.Context,
        policy: model.Policy,
        node: str,
        state: repair.State,
        *,
        key: str,
        timeout_seconds: float,
        words: str,
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.node = node
        self.state = state
        self.key = key
        self.timeout_seconds = timeout_seconds
        self._words = words
        self.namespace = reading.namespace(ctx)
        self.found: reading.Busy | None = None
        """What `decide` found on the node (None: it did not look)."""

    @property
    def name(self) -> str:
        return self._words

    async def decide(self, now: datetime.datetime) -> str | None:
        """Why no Job may be created now: the breaker holds disruptions back, or the node is busy
        (`found`: a workload pod, evictable or not)."""
        paused = self.ctx.breakers.paused(self.policy.name)
        if paused is not None:
            return f"the policy's fleet circuit breaker is {paused.state.value}: {paused.reason}"
        self.found = await reading.busy(self.ctx, self.policy, self.node)
        if self.found.pods:
            return workload_pods.words(self.found.pods)
        return None

    async def start(self, now: datetime.datetime) -> bool:
        """Create the Job from its template; False: it existed (adopted). TemplateError, ApiError."""
        found = await reading.templates(self.ctx, now)
        template = found.get(self.key)
        if template is None:
            raise jobs.TemplateError(f"no {self.key} template")
        # A step on the faulty GPUs (ResetGPU) gets those; the others and Validation every GPU listed.
        kind = step_kinds.BY_TEMPLATE.get(self.key)
        faulty = kind is not None and kind.targets is step_kinds.Targets.FAULTY_GPUS
        gpus = self.state.gpus if faulty else reading.all_gpus(self.ctx, self.node)
        record = self.ctx.cache.nodes.get(self.node)
        if record is not None and record.view.labels.get(keys.REPAIR_NODE_UID_LABEL) != record.uid:
            # The state was written without the label its pod selects (by an older operator, or a human
            # removed it): write it first, or the kubelet would refuse the pod.
            if not await records.write_state(self.ctx, self.node, self.state):
                raise jobs.StaleJob(f"the Node {self.node} changed while its repair label was written")
            record = self.ctx.cache.nodes.get(self.node)
        body = jobs.fill(
            template,
            name=self.state.job,
            namespace=self.namespace,
            node=self.node,
            node_uid=record.uid if record is not None else "",
            policy=self.policy.name,
            cycle=self.state.cycle,
            action=self.key,
            gpus=gpus,
            timeout_seconds=self.timeout_seconds,
            cycle_started=repair.cycle_stamp(self.state),
            extra_env=await validation_env(self.ctx, self.node)
            if self.key == vocabulary.VALIDATION_JOB
            else None,
        )
        # Our identity on the Job: the token whose hash the state on the Node holds (`_sealed`).
        made = self.ctx.steps.repair.tokens.get(self.node)
        if made is None or made[0] != self.state.token:
            raise jobs.StaleJob(f"no token of this process for Job {self.state.job}")
        body["metadata"]["annotations"][keys.REPAIR_TOKEN_ANNOTATION] = made[1]
        _, created = await jobs.create(self.ctx.client, body, belongs=self._ours)
        return created

    def _ours(self, job: Mapping[str, Any]) -> bool:
        return repair.belongs(job, self.state)

    async def observe(self) -> repair.JobView:
        """The Job of this cycle: one of the same name from another cycle is none of ours (missing)."""
        found = await jobs.read(self.ctx.client, self.namespace, self.state.job)
        return repair.job_view(found if found is not None and self._ours(found) else None)

    async def undo(self) -> bool:
        return await jobs.delete(self.ctx.client, self.namespace, self.state.job)


async def validation_env(ctx: context.Context, node: str) -> dict[str, str]:
    """A Validation Job's own variables: the node's running DCGM host engine, or "" where it runs none
    (`decisions.hostengine`: the GPU Operator's own DaemonSet pod, in `--gpu-operator-namespace`), so the
    template never starts a second one beside it."""
    found = hostengine.address(await drain.list_pods(ctx.client, node), ctx.config.gpu_operator_namespace)
    return {keys.REPAIR_HOSTENGINE_ENV: found or ""}


def step_of(
    ctx: context.Context, policy: model.Policy, spec: model.RepairSpec, name: str, state: repair.State
) -> JobStep:
    step = spec.steps[state.step]
    if state.phase is Phase.VALIDATE:
        return JobStep(
            ctx,
            policy,
            name,
            state,
            key=vocabulary.VALIDATION_JOB,
            timeout_seconds=spec.validation_timeout_seconds or 0.0,
            words=f"validation after step {step.name} ({step.action.value})",
        )
    return JobStep(
        ctx,
        policy,
        name,
        state,
        key=step.action.value,
        timeout_seconds=step.timeout_seconds,
        words=step_words(step, state),
    )


def step_words(
    step: model.RepairStep, state: repair.State, indexed: Sequence[tuple[int | None, str]] = ()
) -> str:
    if step_kinds.of(step.action).targets is step_kinds.Targets.FAULTY_GPUS:
        named = indexed or [(None, u) for u in state.gpus]
        return f"step {step.name} ({step.action.value}) on {repair.gpu_words(named)}"
    return f"step {step.name} ({step.action.value})"
