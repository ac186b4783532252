"""The IsolateGPU action: a DeviceTaintRule per faulty GPU, created as the GPU budget admits, deleted
on recovery.

One GPU's rule is an action (`gpu_rules.GPURule`, `client.protocol.Action[bool]`): observe whether it is
there, decide whether it may be made, start (create it), undo (delete it). The node pass (`isolate`)
is its caller: for a node where a policy's IsolateGPU rule fired, or whose GPUs it holds isolated, it
reads what only the cluster knows (`isolation_support`: whether the cluster acts on rules, the rules in
place, the node's DRA devices), asks the pure `decisions.isolation` per faulty GPU, has the budget
admit new rules (`admission.admit_gpus`: one GPU budget over all policies, the breakers), creates
them (Event `GPUIsolated`) and deletes those of GPUs that recovered (hysteresis as for an uncordon;
Event `GPURestored`). What it decides is kept in `Context.steps.isolate.isolations`, which the
node's verdict is judged from (`judging`): IsolateGPU comes off the node ladder when every faulty
GPU is isolated or waits for the GPU budget (`verdicts.with_isolation`); otherwise the node is
cordoned and drained.

A rule of ours that someone else deletes is an override, as a human uncordon is: the GPU is not
isolated again, and the node not drained for it, until new evidence (a new episode of its condition).
What is isolated lives in GPUNode `status.isolatedGPUs` (every policy's GPUs of the node, whichever
policy's verdict the status reports), so a restarted operator knows it too. A deleted policy's rules
are `isolation_sweep`'s.

Nodes with no fired IsolateGPU rule and nothing isolated cost no request; a node whose GPU stays
isolated costs the two LISTs once per `recent.SECONDS`, not once per timer pass.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import isolation, model, policies, verdicts
from gpuhealth_operator.ladder.isolate import gpu_rules, isolation_support
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache
from gpuhealth_operator.verdict import node_changes

logger = logging.getLogger(__name__)

Action = vocabulary.Action
Outcome = isolation.Outcome
ALL = isolation_support.ALL

STATUS_FIELD: Final = "isolatedGPUs"
"""GPUNode status field (operator-owned) listing the node's isolated GPUs, whichever policy's."""
FRACTION_FIELD: Final = "isolatedFraction"
"""GPUNode status field (operator-owned): `1/8`, isolated GPUs of the node's, for `kubectl get -o wide`."""
STATUS_FIELDS: Final = (STATUS_FIELD, FRACTION_FIELD)


def isolated_gpus(ctx: context.Context, policy: str) -> int:
    """GPUs the policy isolates now, as of the last pass over each node."""
    return sum(
        len(state.in_place) for (owner, _), state in ctx.steps.isolate.isolations.items() if owner == policy
    )


# --- one node -------------------------------------------------------------------------------------


def from_status(raw: object) -> isolation.NodeState:
    """What a GPUNode's `status.isolatedGPUs` says (after a restart, before any pass here)."""
    in_place: list[isolation.Isolated] = []
    overridden: list[isolation.Isolated] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping) or not isinstance(item.get("uuid"), str):
            continue
        index = item.get("index")
        gpu = isolation.Isolated(
            index if isinstance(index, int) else None,
            item["uuid"],
            str(item.get("rule") or ""),
            item.get("since") if isinstance(item.get("since"), str) else None,
        )
        (overridden if item.get("state") == "Overridden" else in_place).append(gpu)
    return isolation.NodeState(None, tuple(in_place), tuple(overridden))


def to_status(state: isolation.NodeState | None) -> list[dict[str, Any]]:
    """`status.isolatedGPUs` items, by GPU index."""
    if state is None:
        return []
    items = [(gpu, "Isolated") for gpu in state.in_place] + [(gpu, "Overridden") for gpu in state.overridden]
    rendered = []
    for gpu, what in sorted(items, key=lambda item: item[0].index if item[0].index is not None else -1):
        entry: dict[str, Any] = {"uuid": gpu.uuid, "rule": gpu.rule, "state": what}
        if gpu.index is not None:
            entry["index"] = gpu.index
        if gpu.since is not None:
            entry["since"] = gpu.since
        rendered.append(entry)
    return rendered


def status_fields(ctx: context.Context, name: str) -> dict[str, Any]:
    """The GPUNode status fields of isolation (empty when nothing to say): every policy's GPUs of the
    node, not only the reported policy's, so a GPU stays listed while another policy's verdict (a
    drain) is shown, and a restarted operator reads it back (`from_status`)."""
    states = [s for (_, node), s in sorted(ctx.steps.isolate.isolations.items()) if node == name]
    if not states:
        return {}  # no policy's isolation of the node is kept: no GPU to list
    state = isolation.of_node(states)
    listed = to_status(state)
    if not listed:
        return {}
    fields: dict[str, Any] = {STATUS_FIELD: listed}
    if state.in_place:
        fields[FRACTION_FIELD] = f"{len(state.in_place)}/{isolation_support.gpu_count(ctx, name) or '?'}"
    return fields


def node_action(
    ctx: context.Context, policy: str, name: str, action: vocabulary.NodeAction
) -> vocabulary.NodeAction:
    """`Isolated` when GPUs are isolated and the node itself has nothing stronger than a taint;
    `Pending` when faulty GPUs only wait for maxUnavailableGPUs."""
    state = ctx.steps.isolate.isolations.get((policy, name))
    lesser = action in (
        vocabulary.NodeAction.NONE,
        vocabulary.NodeAction.EVENT,
        vocabulary.NodeAction.LABELED,
        vocabulary.NodeAction.TAINTED,
    )
    if not lesser or state is None:
        return action
    if state.in_place or (state.decision is not None and state.decision.with_outcome(Outcome.ISOLATE)):
        return vocabulary.NodeAction.ISOLATED  # isolated by this policy's rules, or another's
    waiting = state.decision is not None and state.decision.with_outcome(Outcome.WAIT)
    return vocabulary.NodeAction.PENDING if waiting else action


async def isolate(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> None:
    """Isolate and restore the node's GPUs under `policy`, and keep what was decided for its verdict
    (`Context.steps.isolate.isolations`: the node ladder only if needed)."""
    key = (policy.name, name)
    wanted = {r.condition for r in verdict.fired_rules if r.action is Action.ISOLATE_GPU}
    gpunode, record = ctx.cache.gpunodes.get(name), ctx.cache.nodes.get(name)
    if gpunode is None or record is None:
        return
    state = ctx.steps.isolate.isolations.get(key)
    if state is None:
        if not wanted and isolation_support.untouched(ctx, policy, name, now):
            return  # nearly every pass of a policy without IsolateGPU: nothing kept, nothing to keep
        # After a restart the status says what is isolated; it lists every policy's GPUs of the node, so
        # only a policy with IsolateGPU reads it (`_pass` keeps its own rules), one without probes nothing.
        state = (
            from_status(gpunode.status.get(STATUS_FIELD))
            if isolation_support.isolates(policy)
            else isolation.NodeState()
        )
    if (
        not wanted
        and not state.in_place
        and not state.overridden
        and not isolation_support.holds(ctx, policy, name, now)
    ):
        ctx.steps.isolate.isolations.pop(key, None)
        return
    if verdict.health is vocabulary.Health.UNKNOWN:
        return  # missing data changes nothing
    async with ctx.steps.isolate.locks[policy.name]:
        found = await isolation_support.support(ctx, policy)
    async with ctx.steps.isolate.locks[ALL]:
        rules = await isolation_support.rules(ctx, found.api_version, now)
        state = await gpu_rules.node_pass(ctx, policy, name, verdict, now, state, wanted, found, rules)
    if ctx.cache.gpunodes.get(name) is None or ctx.cache.nodes.get(name) is None:
        return  # deleted meanwhile and forgotten: keep no isolation of it (the policy counts them)
    ctx.steps.isolate.isolations[key] = state


async def preview(
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    attribution: isolation.Attribution | None = None,
) -> isolation.NodeIsolation | None:
    """What `isolate` would decide for the node's faulty GPUs now, with reads only (a dry run's words).

    Discovery stands in for the probe, which writes a rule: a cluster that serves DeviceTaintRules
    but ignores them (feature gate off) shows here as isolating, and as the node ladder once the
    policy acts and probes. None: no IsolateGPU rule fired, or the agent is stale. `attribution`:
    whose fault it is, if not the facts' (a drill's stand-in GPU).
    """
    wanted = {r.condition for r in verdict.fired_rules if r.action is Action.ISOLATE_GPU}
    gpunode, record = ctx.cache.gpunodes.get(name), ctx.cache.nodes.get(name)
    if not wanted or gpunode is None or record is None or verdict.health is vocabulary.Health.UNKNOWN:
        return None
    now = ctx.clock()
    known = ctx.steps.isolate.support.get(policy.name)
    if known is None or known.generation != policy.generation:
        # Not probed (a dry run never is; an acting policy not yet in this term): discovery, kept
        # apart from the probe's answers, so a drill or a dry run never decides a real action.
        known = await isolation_support.discovered(ctx, policy, now)
    if attribution is None:
        attribution = isolation.attribute(
            gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy)
        )
    if known.at is not None:  # a real probe that met only transient errors: a real fault would wait
        return isolation.undecided(
            attribution, f"whether the cluster acts on DeviceTaintRules is {known.message}"
        )
    devices = await isolation_support.devices(ctx, name, now) if known.api_version is not None else {}
    selected_gpus = sum(
        isolation_support.gpu_count(ctx, node) for node in ctx.cache.selection(policy).selected
    )
    return isolation.decide(
        attribution,
        devices=devices,
        api_version=known.api_version,
        max_gpus_per_node=policy.isolation_max_gpus_per_node,
        budget_left=policies.resolve_max_unavailable_gpus(policy, selected_gpus),
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a policy would do to a node now, in words, with IsolateGPU decided (dry runs and drills)."""

    verdict: model.NodeVerdict
    """As judged, with IsolateGPU taken off the node ladder where its GPUs would be isolated."""
    changes: list[str]
    isolating: bool
    """Whether an IsolateGPU rule fired (its GPUs are isolated, wait, or take the node ladder)."""
    node_ladder: str | None = None
    """Why IsolateGPU would cordon and drain the node instead, in words."""
    unprobed: bool = False
    """The acting policy's probe has no answer in this term yet: the plan rests on discovery alone."""

    @property
    def ladder_note(self) -> str:
        return f" IsolateGPU takes the node ladder: {self.node_ladder}." if self.node_ladder else ""

    @property
    def probe_note(self) -> str:
        """For a drill: a plan of an acting policy that rests on discovery says what a real fault would
        learn first (the probe), since a cluster may serve DeviceTaintRules and ignore them."""
        if not self.unprobed:
            return ""
        return (
            " Whether the cluster acts on DeviceTaintRules is not probed yet: a real fault probes first,"
            " and takes the node ladder if the rules are ignored."
        )


async def plan(
    ctx: context.Context,
    policy: model.Policy,
    record: cache.NodeRecord,
    verdict: model.NodeVerdict,
    *,
    attribution: isolation.Attribution | None = None,
    named: str | None = None,
) -> Plan:
    """`preview`, then the Node changes the verdict it leaves would make (`node_changes`)."""
    decided = await preview(ctx, policy, record.view.name, verdict, attribution)
    verdict = verdicts.with_isolation(verdict, decided)
    changes = node_changes.dry_run_changes(record, policy, verdict)
    if decided is None:
        return Plan(verdict, changes, isolating=False)
    return Plan(
        verdict,
        isolation.dry_run_changes(decided, named) + changes,
        isolating=True,
        node_ladder=decided.node_ladder,
        unprobed=not policy.dry_run and not isolation_support.probed(ctx, policy),
    )
