"""One GPU's DeviceTaintRule as an action, and one node's pass over its GPUs' rules (IsolateGPU).

`isolating` is the caller: it reads what only the cluster knows and hands this module's `node_pass`
the rules in place; here each faulty GPU's rule is decided, admitted by the GPU budget, created or
deleted, and said (Events `GPUIsolated`, `GPURestored`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Sequence

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import device_taints, isolation, model, policies, times
from gpuhealth_operator.ladder.isolate import device_rules, isolation_support
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)

Action = vocabulary.Action
Outcome = isolation.Outcome
ALL = isolation_support.ALL


# --- one GPU's rule: the action --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class GPURule:
    """One GPU isolated by one policy: its DeviceTaintRule (`client.protocol.Action[bool]`).

    `observe`: whether the rule is there (a rule of ours gone while its GPU is faulty was deleted by
    someone else: an override); `decide`: why it may not be made now; `start`: create it (Event
    `GPUIsolated`, the detection-to-action latency), adopting one of its name already there; `undo`:
    delete it. Every write drops the reused rule list, so the next pass, and the GPU budget, count
    what is there even if the answer was lost. Which GPUs to isolate within which budget, and when a
    recovered GPU is given back, is the node pass's (`_pass`), from `decisions.isolation`.
    """

    ctx: context.Context
    policy: model.Policy
    node: str
    api_version: str
    gpu: isolation.GPUDecision | isolation.Isolated
    verdict: model.NodeVerdict | None = None
    """The verdict a rule is made on (its detection time gives the detection-to-action latency)."""

    @property
    def name(self) -> str:
        uuid = self.gpu.uuid or "?"
        return f"isolation of {isolation_support.gpu_name(self.gpu.index, uuid)} by policy {self.policy.name}"

    @property
    def rule(self) -> str:
        """Its DeviceTaintRule's name ("" for a GPU without an index: no rule can be made for it)."""
        if isinstance(self.gpu, isolation.Isolated):
            return self.gpu.rule
        return device_taints.rule_name(self.node, self.gpu.index) if self.gpu.index is not None else ""

    async def observe(self) -> bool:
        """Whether its rule is there: a GET, as the rule list it is missing from may predate a create
        (another policy's rule of the same name)."""
        return await device_rules.exists(self.ctx.client, self.api_version, self.rule)

    async def decide(self, now: datetime.datetime) -> str | None:
        """Why no rule may be made for it: the pass decided to isolate it, and a rule selects one DRA
        device by the GPU's index and UUID."""
        gpu = self.gpu
        if not isinstance(gpu, isolation.GPUDecision) or gpu.outcome is not Outcome.ISOLATE:
            return "it is not decided to be isolated"
        if gpu.uuid is None or gpu.index is None:
            return "the agent names no index or UUID for it"
        if gpu.device is None:
            return "no DRA device of the node is this GPU"
        return None

    async def start(self, now: datetime.datetime) -> bool:
        """Create the rule; False when one of its name was there (a lost answer: adopted, no Event)."""
        gpu, policy, verdict = self.gpu, self.policy, self.verdict
        assert isinstance(gpu, isolation.GPUDecision)
        assert gpu.uuid is not None and gpu.device is not None and gpu.index is not None
        record = self.ctx.cache.nodes.get(self.node)
        body = device_taints.device_taint_rule(
            api_version=self.api_version,
            policy=policy.name,
            node=self.node,
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            device=gpu.device,
            condition=gpu.conditions[0],
            effect=policy.isolation_effect,
            node_uid=record.uid if record is not None else None,
        )
        try:
            created = await device_rules.create(self.ctx.client, self.api_version, body)
        finally:  # the next pass lists it and counts it against the GPU budget, even if the answer was lost
            self.ctx.steps.isolate.rules_read.drop((ALL, self.api_version))
        if not created:
            return False
        meters = self.ctx.meters
        if verdict is not None and verdict.detected_at is not None:
            latency = max(
                0.0, times.seconds_between(verdict.detected_at, datetime.datetime.now(datetime.UTC))
            )
            meters.detection_to_action.labels(Action.ISOLATE_GPU.value, gpu.conditions[0].value).observe(
                latency
            )
        meters.actions.labels(Action.ISOLATE_GPU.value, gpu.conditions[0].value).inc()
        await self.ctx.recorder.emit(
            events.subject(self.ctx.cache, self.node),
            vocabulary.EventReason.GPU_ISOLATED,
            f"{isolation_support.gpu_name(gpu.index, gpu.uuid)} isolated by policy {policy.name} "
            f"({', '.join(gpu.conditions)}): DeviceTaintRule {self.rule} taints device {gpu.device.name} of "
            f"pool {gpu.device.pool} ({policy.isolation_effect}); the node's other GPUs stay in service.",
            events.WARNING,
        )
        return True

    async def undo(self) -> bool:
        """Delete the rule; False when it was not there."""
        try:
            return await device_rules.delete(self.ctx.client, self.api_version, self.rule)
        finally:  # also when the answer is lost: the next pass lists what is there
            self.ctx.steps.isolate.rules_read.drop((ALL, self.api_version))


async def node_pass(  # noqa: PLR0917 - one pass's inputs
    ctx: context.Context,
    policy: model.Policy,
    name: str,
    verdict: model.NodeVerdict,
    now: datetime.datetime,
    state: isolation.NodeState,
    wanted: set[vocabulary.ConditionKey],
    found: isolation.Support,
    rules: Sequence[kube.JsonObject],
) -> isolation.NodeState:
    gpunode, record = ctx.cache.gpunodes.get(name), ctx.cache.nodes.get(name)
    if gpunode is None or record is None:
        return state  # deleted while the probe or the rule list was awaited: nothing left to isolate
    attribution = isolation.attribute(
        gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy)
    )
    version = found.api_version
    if not found.definite:  # no answer to act on: nothing created, restored or taken to the ladder
        decision = isolation.undecided(attribution, f"DeviceTaintRules {found.message}") if wanted else None
        return isolation.NodeState(decision, state.in_place, state.overridden)
    node_label = device_taints.label_value(name)
    policy_label = device_taints.label_value(policy.name)
    on_node = {
        str(labels.get(keys.GPU_UUID_LABEL)): rule
        for rule in rules
        if (labels := (rule.get("metadata") or {}).get("labels") or {}).get(keys.NODE_LABEL) == node_label
    }
    here = {uuid: rule for uuid, rule in on_node.items() if isolation_support.owner(rule) == policy_label}
    others = frozenset(on_node) - frozenset(here)
    """GPUs of the node another policy's rule isolates: isolated, by no new rule or budget of ours."""
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
        if gpu.uuid not in on_node and gpu.uuid in faulty and version is not None:
            if await GPURule(ctx, policy, name, version, gpu).observe():
                continue  # created since the list was read (another policy's rule of the same name)
            overridden[gpu.uuid] = gpu
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.OVERRIDDEN_BY_USER,
                f"DeviceTaintRule {gpu.rule} isolating {isolation_support.gpu_name(gpu.index, gpu.uuid)} was "
                f"deleted by someone else: policy {policy.name} isolates it again only on new evidence.",
                events.WARNING,
            )

    # Recovery: rules of GPUs no longer faulty go once the conditions have been clear long enough.
    in_place: dict[str, isolation.Isolated] = {}
    restore = isolation.may_restore(policy, verdict, now)
    for uuid, rule in here.items():
        labels = rule["metadata"].get("labels") or {}
        index = isolation_support.label_int(labels.get(keys.GPU_INDEX_LABEL))
        entry = next((g for g in state.in_place if g.uuid == uuid), None)
        gpu = isolation.Isolated(index, uuid, rule["metadata"]["name"], entry.since if entry else since)
        if uuid not in faulty and restore and version is not None:
            await GPURule(ctx, policy, name, version, gpu).undo()
            ctx.meters.actions.labels("RestoreGPU", "Recovered").inc()
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.GPU_RESTORED,
                f"{isolation_support.gpu_name(index, uuid)} restored by policy {policy.name}: "
                f"DeviceTaintRule {gpu.rule} deleted after {policy.recovery_healthy_for_seconds:g}s free of "
                "faults.",
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
    devices = await isolation_support.devices(ctx, name, now) if version is not None else {}
    isolated = frozenset(in_place) | others

    def decide(budget_left: int, wait_reason: str | None = None) -> isolation.NodeIsolation:
        return isolation.decide(
            remaining,
            devices=devices,
            api_version=version,
            max_gpus_per_node=policy.isolation_max_gpus_per_node,
            already_isolated=isolated,
            budget_left=budget_left,
            wait_reason=wait_reason,
        )

    # Isolating is a disruption: new rules only as the one GPU budget over all isolating policies and
    # every selecting policy's fleet circuit breaker admit (`admission`, under its one lock).
    decision = decide(len(remaining.gpus))  # room for all: which need a new rule, or the ladder
    new = [gpu for gpu in decision.with_outcome(Outcome.ISOLATE) if gpu.uuid not in isolated]
    if decision.node_ladder is None and new:
        granted, why = await ctx.admission.admit_gpus(
            policy, name, ctx.cache, _gpu_budgets(ctx, rules), len(new), now
        )
        if granted < len(new):
            decision = decide(granted, why)
    if decision.node_ladder is None and version is not None:
        for wanted_gpu in decision.with_outcome(Outcome.ISOLATE):
            new_uuid = wanted_gpu.uuid
            if new_uuid is None or new_uuid in isolated:
                continue
            action = GPURule(ctx, policy, name, version, wanted_gpu, verdict)
            if await action.decide(now) is None:
                await action.start(now)
                in_place[new_uuid] = isolation.Isolated(wanted_gpu.index, new_uuid, action.rule, since)
    return isolation.NodeState(decision, tuple(in_place.values()), tuple(overridden.values()))


def _gpu_budgets(ctx: context.Context, rules: Sequence[kube.JsonObject]) -> list[isolation.GPUBudget]:
    """maxUnavailableGPUs of every acting isolating policy, each counting the GPUs under a rule of
    gpu-health (whichever policy's) on the nodes it selects, as a cordon counts in every budget."""
    by_node: dict[str, int] = {}
    for rule in rules:
        node = ((rule.get("metadata") or {}).get("labels") or {}).get(keys.NODE_LABEL)
        if isinstance(node, str):
            by_node[node] = by_node.get(node, 0) + 1
    budgets = []
    for each in sorted(ctx.cache.policies.values(), key=lambda p: p.name):
        if each.dry_run or not isolation_support.isolates(each):
            continue
        selected = ctx.cache.selection(each).selected
        gpus = sum(isolation_support.gpu_count(ctx, node) for node in selected)
        budgets.append(
            isolation.GPUBudget(
                each.name,
                frozenset(selected),
                policies.resolve_max_unavailable_gpus(each, gpus),
                sum(by_node.get(device_taints.label_value(node), 0) for node in selected),
            )
        )
    return budgets


def _evidence_since(verdict: model.NodeVerdict) -> str | None:
    """When the episode behind the fired IsolateGPU rules began (RFC 3339), the earliest of them."""
    held = [
        state.observed_since or state.last_transition_time
        for rule in verdict.fired_rules
        if rule.action is Action.ISOLATE_GPU and (state := verdict.conditions.get(rule.condition)) is not None
    ]
    return times.render(min(held)) if held else None
