"""The IsolateGPU action: a DeviceTaintRule per faulty GPU, created as the GPU budget admits, deleted
on recovery.

One GPU's rule is an action (`GPURule`, `client.protocol.Action[bool]`): observe whether it is
there, decide whether it may be made, start (create it), undo (delete it). The node pass (`isolate`)
is its caller: for a node where a policy's IsolateGPU rule fired, or whose GPUs it holds isolated, it
reads what only the cluster knows (`isolation_support`: whether the cluster acts on rules, the rules in
place, the node's DRA devices), asks the pure `decisions.isolation` per faulty GPU, has the budget
admit new rules (`admission.admit_gpus`: one GPU budget over all policies, the breakers), creates
them (Event `GPUIsolated`) and deletes those of GPUs that recovered (hysteresis as for an uncordon;
Event `GPURestored`). What it decides is kept in `Context.isolations`, which the node's verdict is
judged from (`judging`): IsolateGPU comes off the node ladder when every faulty GPU is isolated or
waits for the GPU budget (`verdicts.with_isolation`); otherwise the node is cordoned and drained.

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
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, kube
from gpuhealth_operator.decisions import device_taints, isolation, model, policies, times, verdicts
from gpuhealth_operator.ladder.isolate import device_rules, isolation_support
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


def status_fields(ctx: context.Context, name: str) -> dict[str, Any]:
    """The GPUNode status fields of isolation (empty when nothing to say): every policy's GPUs of the
    node, not only the reported policy's, so a GPU stays listed while another policy's verdict (a
    drain) is shown, and a restarted operator reads it back (`from_status`)."""
    state = isolation.of_node([s for (_, node), s in sorted(ctx.isolations.items()) if node == name])
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
    state = ctx.isolations.get((policy, name))
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
    (`Context.isolations`: the node ladder only if needed)."""
    key = (policy.name, name)
    wanted = {r.condition for r in verdict.fired_rules if r.action is Action.ISOLATE_GPU}
    gpunode, record = ctx.cache.gpunode(name), ctx.cache.node(name)
    if gpunode is None or record is None:
        return
    # After a restart the status says what is isolated; it lists every policy's GPUs of the node, so
    # only a policy with IsolateGPU reads it (`_pass` keeps its own rules), one without probes nothing.
    state = ctx.isolations.get(key) or (
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
        ctx.isolations.pop(key, None)
        return
    if verdict.health is vocabulary.Health.UNKNOWN:
        return  # missing data changes nothing
    async with ctx.isolation_locks[policy.name]:
        found = await isolation_support.support(ctx, policy)
    async with ctx.isolation_locks[ALL]:
        rules = await isolation_support.rules(ctx, found.api_version, now)
        state = await _pass(ctx, policy, name, verdict, now, state, wanted, found, rules)
    if ctx.cache.gpunode(name) is None or ctx.cache.node(name) is None:
        return  # deleted meanwhile and forgotten: keep no isolation of it (the policy counts them)
    ctx.isolations[key] = state


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
    now = ctx.clock()
    known = ctx.isolation_support.get(policy.name)
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
        record = self.ctx.cache.node(self.node)
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
            self.ctx.rules_read.drop((ALL, self.api_version))
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
            self.ctx.rules_read.drop((ALL, self.api_version))


async def _pass(  # noqa: PLR0917 - one pass's inputs
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
    gpunode, record = ctx.cache.gpunode(name), ctx.cache.node(name)
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
