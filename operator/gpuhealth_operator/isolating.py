"""Isolating GPUs: the DeviceTaintRules of IsolateGPU, created for faulty GPUs and deleted on recovery.

For a node where a policy's IsolateGPU rule fired, one pass here reads what
only the cluster knows — whether it acts on DeviceTaintRules (`probe`, once
per policy generation), the policy's rules in place (label
`gpuhealth.io/policy`), the node's DRA devices (its ResourceSlices) — asks
the pure `decisions.isolation` per faulty GPU, creates a rule per GPU to
isolate (Event `GPUIsolated`) and deletes those of GPUs that recovered
(hysteresis as for an uncordon; Event `GPURestored`). It returns the verdict
with IsolateGPU taken off the node ladder when every faulty GPU is isolated
or waits for the GPU budget (`verdicts.with_isolation`); otherwise the node
is cordoned and drained as before.

A rule of ours that someone else deletes is an override, as a human uncordon
is: the GPU is not isolated again, and the node not drained for it, until
new evidence (a new episode of its condition). What is isolated lives in
GPUNode `status.isolatedGPUs`, so a restarted operator knows it too.

Nodes with no fired IsolateGPU rule and nothing isolated cost no request; a
node whose GPU stays isolated costs the two LISTs once per `recent.SECONDS`,
not once per timer pass.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator import cache, context, kube, node_changes
from gpuhealth_operator.actions import device_rules, events
from gpuhealth_operator.decisions import device_taints, isolation, model, policies, times, verdicts

logger = logging.getLogger(__name__)

Action = vocabulary.Action
Outcome = isolation.Outcome

STATUS_FIELD: Final = "isolatedGPUs"
"""GPUNode status field (operator-owned) listing the isolated GPUs of the reporting policy."""
FRACTION_FIELD: Final = "isolatedFraction"
"""GPUNode status field (operator-owned): `1/8`, isolated GPUs of the node's, for `kubectl get -o wide`."""
STATUS_FIELDS: Final = (STATUS_FIELD, FRACTION_FIELD)
CONDITION: Final = "GPUIsolation"
"""The policy status condition saying whether IsolateGPU isolates GPUs or falls back to the node ladder."""


# --- does the cluster act on rules ----------------------------------------------------------------


async def support(ctx: context.Context, policy: model.Policy) -> isolation.Support:
    """Whether the cluster acts on DeviceTaintRules, probed once per generation of the policy."""
    known = ctx.isolation_support.get(policy.name)
    if known is not None and known.generation == policy.generation:
        return known
    found = await device_rules.probe(ctx.client, policy.name, policy.generation)
    ctx.isolation_support[policy.name] = found
    logger.info("policy %s: DeviceTaintRules: %s", policy.name, found.message)
    return found


def isolates(policy: model.Policy) -> bool:
    return any(r.action is Action.ISOLATE_GPU for r in policy.rules)


async def prepare(ctx: context.Context, policy: model.Policy) -> None:
    """Probe at once for a new or changed policy with an IsolateGPU rule, before any GPU needs it."""
    if isolates(policy) and not policy.dry_run:
        async with ctx.isolation_locks[policy.name]:
            await support(ctx, policy)


def condition(ctx: context.Context, policy: model.Policy) -> dict[str, Any] | None:
    """The policy's `GPUIsolation` condition (without times); None for a policy without IsolateGPU."""
    if not isolates(policy):
        return None
    found = ctx.isolation_support.get(policy.name)
    if policy.dry_run:
        return {
            "type": CONDITION,
            "status": "Unknown",
            "reason": "DryRun",
            "message": "A dry-run policy isolates no GPU; the cluster is probed once it acts.",
        }
    if found is None or found.generation != policy.generation:
        return {
            "type": CONDITION,
            "status": "Unknown",
            "reason": "NotProbed",
            "message": "Whether the cluster acts on DeviceTaintRules is not known yet.",
        }
    return {
        "type": CONDITION,
        "status": "True" if found.api_version else "False",
        "reason": "DeviceTaintRules" if found.api_version else "NodeLadderFallback",
        "message": f"DeviceTaintRules: {found.message}.",
    }


def isolated_gpus(ctx: context.Context, policy: str) -> int:
    """GPUs the policy isolates now, as of the last pass over each node."""
    return sum(len(state.in_place) for (owner, _), state in ctx.isolations.items() if owner == policy)


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


def status_fields(ctx: context.Context, policy: str, name: str) -> dict[str, Any]:
    """The GPUNode status fields of isolation under the reporting policy (empty when nothing to say)."""
    state = ctx.isolations.get((policy, name))
    listed = to_status(state)
    if not listed:
        return {}
    fields: dict[str, Any] = {STATUS_FIELD: listed}
    if state is not None and state.in_place:
        fields[FRACTION_FIELD] = f"{len(state.in_place)}/{_gpu_count(ctx, name) or '?'}"
    return fields


def node_action(
    ctx: context.Context, policy: str, name: str, action: vocabulary.NodeAction
) -> vocabulary.NodeAction:
    """`Isolated` when GPUs are isolated and the node itself has nothing stronger than a taint;
    `Pending` when faulty GPUs only wait for maxUnavailableGPUs."""
    state = ctx.isolations.get((policy, name))
    lesser = action in (
        vocabulary.NodeAction.NONE,
        vocabulary.NodeAction.EVENT,
        vocabulary.NodeAction.LABELED,
        vocabulary.NodeAction.TAINTED,
    )
    if not lesser or state is None:
        return action
    if state.in_place:
        return vocabulary.NodeAction.ISOLATED
    waiting = state.decision is not None and state.decision.with_outcome(Outcome.WAIT)
    return vocabulary.NodeAction.PENDING if waiting else action


async def isolate(
    ctx: context.Context, policy: model.Policy, name: str, verdict: model.NodeVerdict, now: datetime.datetime
) -> model.NodeVerdict:
    """Isolate and restore the node's GPUs under `policy`; the verdict with the node ladder only if needed."""
    key = (policy.name, name)
    wanted = {r.condition for r in verdict.fired_rules if r.action is Action.ISOLATE_GPU}
    gpunode, record = ctx.cache.gpunode(name), ctx.cache.node(name)
    if gpunode is None or record is None:
        return verdict
    state = ctx.isolations.get(key) or from_status(gpunode.status.get(STATUS_FIELD))
    if not wanted and not state.in_place and not state.overridden:
        ctx.isolations.pop(key, None)
        return verdict
    if verdict.health is vocabulary.Health.UNKNOWN:
        return verdicts.with_isolation(verdict, state.decision)  # missing data changes nothing
    async with ctx.isolation_locks[policy.name]:
        found = await support(ctx, policy)
        ours = await _rules(ctx, policy.name, found.api_version, now)
        state = await _pass(ctx, policy, name, verdict, now, state, wanted, found, ours)
    if ctx.cache.gpunode(name) is None or ctx.cache.node(name) is None:
        return verdict  # deleted meanwhile and forgotten: keep no isolation of it (the policy counts them)
    ctx.isolations[key] = state
    amended = verdicts.with_isolation(verdict, state.decision)
    if amended is not verdict and key in ctx.verdicts:
        ctx.verdicts.amend(key, amended)
    return amended


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
    gpunode, record = ctx.cache.gpunode(name), ctx.cache.node(name)
    if not wanted or gpunode is None or record is None or verdict.health is vocabulary.Health.UNKNOWN:
        return None
    known = ctx.isolation_support.get(policy.name)
    if known is None or known.generation != policy.generation:
        version = await device_rules.served_version(ctx.client)
        known = isolation.Support(policy.generation, version, "discovery only (dry run)")
        ctx.isolation_support[policy.name] = known
    if attribution is None:
        attribution = isolation.attribute(
            gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy)
        )
    devices = await _devices(ctx, name, ctx.clock()) if known.api_version is not None else {}
    selected_gpus = sum(_gpu_count(ctx, node) for node in ctx.cache.selection(policy).selected)
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

    @property
    def ladder_note(self) -> str:
        return f" IsolateGPU takes the node ladder: {self.node_ladder}." if self.node_ladder else ""


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
    )


async def _pass(  # noqa: PLR0917 - one pass's inputs
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
    state: isolation.NodeState,
    wanted: set[vocabulary.Condition],
    found: isolation.Support,
    ours: Sequence[kube.JsonObject],
) -> isolation.NodeState:
    gpunode, record = ctx.cache.gpunode(name), ctx.cache.node(name)
    if gpunode is None or record is None:
        return state  # deleted while the probe or the rule list was awaited: nothing left to isolate
    node_label = device_taints.label_value(name)
    here = {
        str(labels.get(keys.GPU_UUID_LABEL)): rule
        for rule in ours
        if (labels := (rule.get("metadata") or {}).get("labels") or {}).get(keys.NODE_LABEL) == node_label
    }
    attribution = isolation.attribute(
        gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy)
    )
    faulty = {gpu.uuid: gpu for gpu in attribution.gpus if gpu.uuid is not None}
    since = _evidence_since(verdict)
    subject = events.subject(ctx.cache, name)

    # Overrides: a rule of ours gone while its GPU is still faulty was deleted by someone else.
    overridden = {
        gpu.uuid: gpu
        for gpu in state.overridden
        if gpu.uuid in faulty and (gpu.since is None or since is None or since <= gpu.since)
    }
    for gpu in state.in_place:
        if gpu.uuid not in here and gpu.uuid in faulty and found.api_version is not None:
            if await device_rules.exists(ctx.client, found.api_version, gpu.rule):
                continue  # another policy's rule of the same name isolates it: not deleted
            overridden[gpu.uuid] = gpu
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.OVERRIDDEN_BY_USER,
                f"DeviceTaintRule {gpu.rule} isolating {_gpu_name(gpu.index, gpu.uuid)} was deleted by "
                f"someone else: policy {policy.name} isolates it again only on new evidence.",
                events.WARNING,
            )

    # Recovery: rules of GPUs no longer faulty go once the conditions have been clear long enough.
    in_place: dict[str, isolation.Isolated] = {}
    restore = isolation.may_restore(policy, verdict, now)
    for uuid, rule in here.items():
        labels = rule["metadata"].get("labels") or {}
        index = _int(labels.get(keys.GPU_INDEX_LABEL))
        entry = next((g for g in state.in_place if g.uuid == uuid), None)
        gpu = isolation.Isolated(index, uuid, rule["metadata"]["name"], entry.since if entry else since)
        if uuid not in faulty and restore and found.api_version is not None:
            try:
                await device_rules.delete(ctx.client, found.api_version, gpu.rule)
            finally:  # also when the answer is lost: the next pass lists what is there
                ctx.rules_read.drop((policy.name, found.api_version))
            ctx.meters.actions.labels("RestoreGPU", "Recovered").inc()
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.GPU_RESTORED,
                f"{_gpu_name(index, uuid)} restored by policy {policy.name}: DeviceTaintRule {gpu.rule} "
                f"deleted after {policy.recovery_healthy_for_seconds:g}s free of faults.",
            )
            continue
        in_place[uuid] = gpu

    if not wanted:
        return isolation.NodeState(None, tuple(in_place.values()), ())
    remaining = isolation.Attribution(
        tuple(gpu for gpu in attribution.gpus if gpu.uuid not in overridden), attribution.unattributed
    )
    if not remaining.gpus and remaining.unattributed is None:
        decision = (
            isolation.NodeIsolation(())
            if overridden or in_place
            else isolation.NodeIsolation((), "no faulty GPU found to isolate in the agent's report")
        )
        return isolation.NodeState(decision, tuple(in_place.values()), tuple(overridden.values()))
    devices = await _devices(ctx, name, now) if found.api_version is not None else {}
    selected_gpus = sum(_gpu_count(ctx, node) for node in ctx.cache.selection(policy).selected)
    decision = isolation.decide(
        remaining,
        devices=devices,
        api_version=found.api_version,
        max_gpus_per_node=policy.isolation_max_gpus_per_node,
        already_isolated=frozenset(in_place),
        budget_left=policies.resolve_max_unavailable_gpus(policy, selected_gpus) - len(ours),
    )
    if decision.node_ladder is None and found.api_version is not None:
        for wanted_gpu in decision.with_outcome(Outcome.ISOLATE):
            new = wanted_gpu.uuid
            if new is None or new in in_place or wanted_gpu.device is None or wanted_gpu.index is None:
                continue
            in_place[new] = await _create(ctx, policy, name, verdict, found.api_version, wanted_gpu, since)
    return isolation.NodeState(decision, tuple(in_place.values()), tuple(overridden.values()))


async def _create(  # noqa: PLR0917
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    api_version: str,
    gpu: isolation.GPUDecision,
    since: str | None,
) -> isolation.Isolated:
    assert gpu.uuid is not None and gpu.device is not None and gpu.index is not None
    body = device_taints.device_taint_rule(
        api_version=api_version,
        policy=policy.name,
        node=name,
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        device=gpu.device,
        condition=gpu.conditions[0],
        effect=policy.isolation_effect,
        node_uid=record.uid if (record := ctx.cache.node(name)) is not None else None,
    )
    rule = body["metadata"]["name"]
    try:
        created = await device_rules.create(ctx.client, api_version, body)
    finally:  # the next pass lists it and counts it against the GPU budget, even if the answer was lost
        ctx.rules_read.drop((policy.name, api_version))
    if not created:
        return isolation.Isolated(gpu.index, gpu.uuid, rule, since)  # already there (a lost response)
    if verdict.detected_at is not None:
        latency = max(0.0, times.seconds_between(verdict.detected_at, datetime.datetime.now(datetime.UTC)))
        ctx.meters.detection_to_action.labels(Action.ISOLATE_GPU.value, gpu.conditions[0].value).observe(
            latency
        )
    ctx.meters.actions.labels(Action.ISOLATE_GPU.value, gpu.conditions[0].value).inc()
    await ctx.recorder.emit(
        events.subject(ctx.cache, name),
        vocabulary.EventReason.GPU_ISOLATED,
        f"{_gpu_name(gpu.index, gpu.uuid)} isolated by policy {policy.name} "
        f"({', '.join(gpu.conditions)}): DeviceTaintRule {rule} taints device {gpu.device.name} of pool "
        f"{gpu.device.pool} ({policy.isolation_effect}); the node's other GPUs stay in service.",
        events.WARNING,
    )
    return isolation.Isolated(gpu.index, gpu.uuid, rule, since)


async def _rules(
    ctx: context.Context, policy: str, api_version: str | None, now: datetime.datetime
) -> list[kube.JsonObject]:
    """The policy's rules of nodes (not its probe's), listed at most once per `recent.SECONDS`.

    Fresh after our own create or delete (they drop the entry), so the GPU budget never counts fewer
    rules than there are; a rule deleted by someone else is seen as an override a little later.
    """
    if api_version is None:
        return []

    async def load() -> list[kube.JsonObject]:
        listed = await device_rules.ours(ctx.client, api_version, policy)
        return [r for r in listed if keys.NODE_LABEL in ((r.get("metadata") or {}).get("labels") or {})]

    return await ctx.rules_read.read((policy, api_version), now, load)


async def _devices(
    ctx: context.Context, name: str, now: datetime.datetime
) -> dict[str, device_taints.Device]:
    """The node's DRA devices by GPU UUID, from its ResourceSlices listed once per `recent.SECONDS`."""
    return await ctx.devices_read.read(name, now, lambda: device_rules.devices(ctx.client, name))


def _gpu_count(ctx: context.Context, node: str) -> int:
    gpunode = ctx.cache.gpunode(node)
    summary = gpunode.status.get("summary") if gpunode is not None else None
    count = summary.get("gpuCount") if isinstance(summary, Mapping) else None
    return count if isinstance(count, int) else 0


def _evidence_since(verdict: model.NodeVerdict) -> str | None:
    """When the episode behind the fired IsolateGPU rules began (RFC 3339), the earliest of them."""
    held = [
        state.observed_since or state.last_transition_time
        for rule in verdict.fired_rules
        if rule.action is Action.ISOLATE_GPU and (state := verdict.conditions.get(rule.condition)) is not None
    ]
    return times.render(min(held)) if held else None


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _gpu_name(index: int | None, uuid: str) -> str:
    return f"GPU {index} ({uuid})" if index is not None else f"GPU {uuid}"
