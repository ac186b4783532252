"""What a repair pass ends in and says: the status action it owns the node with (`Handled`), a retire
(label `gpuhealth.io/needs-repair=manual`, Event NodeRetired), a reset's end (the agent's release and
the operands given back), the words of a wait or a refusal. Split from `repairing` (issue 46): the
leaves every part of a cycle calls.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import (
    model,
    repair,
    times,
    workload_pods,
)
from gpuhealth_operator.ladder.repair import (
    gpu_release,
    job_step,
    operands,
    reading,
    records,
)
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

NodeAction = vocabulary.NodeAction
Result = vocabulary.RepairResult
Phase = repair.Phase


@dataclasses.dataclass(frozen=True)
class Handled:
    """Repair owns the node this pass: the status action; `returned`: validated, uncordon it now."""

    action: NodeAction
    returned: bool = False


# --- the GPU Operator's operands step aside for a reset (issue 48, Deliver 2; `operands`) -----------------


def cleared(ctx: context.Context, name: str, state: repair.State) -> str:
    """What a reset waited for (said in its RepairStarted): the operands paused, the agent's release."""
    if state.phase is not Phase.STEP:
        return ""
    said = []
    labels = operands.paused(ctx, name)
    if labels:
        said.append("the GPU Operator's " + ", ".join(k.rsplit(".", 1)[1] for k in labels) + " left")
    if gpu_release.released(ctx, name) is not None:
        said.append("the agent released the GPUs")
    return f" after {' and '.join(said)}" if said else ""


async def reset_over(ctx: context.Context, name: str) -> None:
    """No reset runs (any more) on the node: the agent takes the GPUs back, the operands we paused
    come back (only those still ours)."""
    await gpu_release.end(ctx, name)
    await operands.restore(ctx, name)


# --- the one shape of every wait before a phase's Job: wait until the phase's deadline, then fail ---------


def phase_action(state: repair.State) -> NodeAction:
    """The status action while the state's phase waits or runs."""
    return NodeAction.REPAIRING if state.phase is Phase.STEP else NodeAction.VALIDATING


async def say_busy(
    ctx: context.Context,
    name: str,
    what: str,
    found: reading.Busy,
    *,
    state: repair.State | None = None,
    action: job_step.JobStep | None = None,
) -> None:
    """Say once per wait (Event RemediationPaused) which pods hold the repair back, and until when."""
    if name in ctx.steps.repair.busy_said:
        return
    ctx.steps.repair.busy_said.add(name)
    then = (
        "the drain evicts them first"
        if found.evictable
        else "they are pods the policy's drain leaves (no controller without drain.force, emptyDir data, "
        "an excluded namespace) or that ignore the cordon"
    )
    if state is not None and action is not None:
        deadline = state.since + datetime.timedelta(seconds=action.timeout_seconds)
        until = f"; the phase fails at {times.render(deadline)} if they stay"
    else:
        until = "; it starts once they are gone"
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.REMEDIATION_PAUSED,
        f"{what} waits: {workload_pods.words(found.pods)} — no repair or validation Job runs beside a "
        f"workload; {then}{until}.",
    )


def api_message(error: kube.ApiError) -> str:
    import json  # noqa: PLC0415 - only for a refused create

    try:
        body = json.loads(error.body)
    except ValueError:
        return error.body[:300]
    return str(body.get("message") or error.body)[:300] if isinstance(body, dict) else error.body[:300]


async def retire(  # noqa: PLR0917 - one retire's inputs
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    state: repair.State | None,
    why: str,
    now: datetime.datetime,
    fault: str = "",
) -> Handled:
    """Give up: label needs-repair=manual, the cordon stays, the repair state goes; say so. The Retired
    entry names the fault that began the cycle (`fault`, else the state's): a retired node may report
    healthy by now, and a human needs to know what it was retired for."""
    if not await records.write_state(ctx, name, None, retired=True):
        return Handled(NodeAction.REPAIRING if state is not None else NodeAction.DRAINED)
    await reset_over(ctx, name)
    cycle = (
        state.cycle
        if state is not None
        else repair.next_cycle(reading.history(ctx, name), reading.cycles(ctx, name)) - 1
    )
    record = repair.State(
        policy=policy.name,
        cycle=max(cycle, 0),
        step=0,
        phase=Phase.STEP,
        since=now,
        gpus=state.gpus if state is not None else (),
        boot_id=None,
        job="",
    )
    records.note(
        ctx,
        name,
        now,
        record,
        step="",
        action="",
        result=Result.RETIRED,
        message=why,
        fault=fault or (state.fault if state is not None else ""),
    )
    if state is not None:
        records.observe_duration(ctx, state, "retired", now)
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.NODE_RETIRED,
        f"Repair by policy {policy.name} gave up on the node: {why}. It stays cordoned with label "
        f"{keys.NEEDS_REPAIR_LABEL}={keys.NEEDS_REPAIR_MANUAL} until a human returns it "
        f"(kubectl uncordon {name}).",
        events.WARNING,
    )
    return Handled(NodeAction.RETIRED)
