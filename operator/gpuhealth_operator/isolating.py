"""Isolating GPUs: the DeviceTaintRules of IsolateGPU, created for faulty GPUs and deleted on recovery.

For a node where a policy's IsolateGPU rule fired, one pass here reads what
only the cluster knows — whether it acts on DeviceTaintRules (`probe`, once
per policy generation), the policy's rules in place (label
`gpuhealth.io/policy`), the node's DRA devices (its ResourceSlices) — asks
the pure `decisions.isolation` per faulty GPU, creates a rule per GPU to
isolate (Event `GPUIsolated`) and deletes those of GPUs that recovered
(hysteresis as for an uncordon; Event `GPURestored`). What it decides is
kept in `Context.isolations`, which the node's verdict is judged from
(`judging`): IsolateGPU comes off the node ladder when every faulty GPU is
isolated or waits for the GPU budget (`verdicts.with_isolation`); otherwise
the node is cordoned and drained as before.

A rule of ours that someone else deletes is an override, as a human uncordon
is: the GPU is not isolated again, and the node not drained for it, until
new evidence (a new episode of its condition). What is isolated lives in
GPUNode `status.isolatedGPUs` (every policy's GPUs of the node, whichever
policy's verdict the status reports), so a restarted operator knows it too.

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
from gpuhealth_operator import cache, context, kube, node_changes, recent
from gpuhealth_operator.actions import device_rules, events
from gpuhealth_operator.decisions import device_taints, isolation, model, policies, times, verdicts

logger = logging.getLogger(__name__)

Action = vocabulary.Action
Outcome = isolation.Outcome

STATUS_FIELD: Final = "isolatedGPUs"
"""GPUNode status field (operator-owned) listing the node's isolated GPUs, whichever policy's."""
FRACTION_FIELD: Final = "isolatedFraction"
"""GPUNode status field (operator-owned): `1/8`, isolated GPUs of the node's, for `kubectl get -o wide`."""
STATUS_FIELDS: Final = (STATUS_FIELD, FRACTION_FIELD)
CONDITION: Final = vocabulary.PolicyConditionType.GPU_ISOLATION.value
"""The policy status condition saying whether IsolateGPU isolates GPUs or falls back to the node ladder."""


# --- does the cluster act on rules ----------------------------------------------------------------


ALL: Final = ""
"""The `isolation_locks` key of the one lock every isolating pass holds, of whatever policy: the GPU
budget is one over all policies (a node's GPUs count in every policy that selects it), so rules are
counted and created one pass at a time."""


PROBE_FALLBACK_SECONDS: Final = 120.0
"""How long faulty GPUs wait (Pending) on a probe that meets only transient errors before their nodes
take the node ladder: longer than an API server's leader change or restart, short enough that a webhook
or an API server refusing the probe for good does not leave a faulty GPU in service."""


async def support(ctx: context.Context, policy: model.Policy) -> isolation.Support:
    """Whether the cluster acts on DeviceTaintRules, probed once per generation of the policy (and in
    each term: the context is the term's).

    Only a real probe's answer is kept here (a drill or a dry run reads discovery apart, `preview`).
    An answer that is not `definite` (transient errors) is probed again `recent.SECONDS` later; after
    `PROBE_FALLBACK_SECONDS` of such answers the node ladder is taken until a probe answers.
    """
    known = ctx.isolation_support.get(policy.name)
    now = ctx.clock()
    if (
        known is not None
        and known.generation == policy.generation
        and ((known.definite and not known.timed_out) or _retry_later(known, now))
    ):
        return known
    found = await device_rules.probe(ctx.client, policy.name, policy.generation)
    if not found.definite:
        found = _failing(found, known, now)
    ctx.isolation_support[policy.name] = found
    if found.api_version is not None:  # the version discovery served: `sweep` finds rules by it later
        ctx.isolation_discovery.put(
            ALL, isolation.Support(0, found.api_version, DISCOVERY_ONLY, definite=False), now
        )
    if found.definite:
        logger.info("policy %s: DeviceTaintRules: %s", policy.name, found.message)
    else:
        logger.warning("policy %s: DeviceTaintRules: %s", policy.name, found.message)
    return found


def _retry_later(known: isolation.Support, now: datetime.datetime) -> bool:
    return known.at is not None and 0 <= (now - known.at).total_seconds() < recent.SECONDS


def _failing(
    found: isolation.Support, known: isolation.Support | None, now: datetime.datetime
) -> isolation.Support:
    """A probe without an answer, dated; past `PROBE_FALLBACK_SECONDS` of them, the node ladder."""
    since = now
    if known is not None and known.generation == found.generation and known.failing_since is not None:
        since = known.failing_since
    found = dataclasses.replace(found, at=now, failing_since=since)
    waited = (now - since).total_seconds()
    if waited < PROBE_FALLBACK_SECONDS:
        return found
    return dataclasses.replace(
        found,
        definite=True,
        timed_out=True,
        message=f"{found.message}; no answer for {waited:.0f}s, so IsolateGPU takes the node ladder "
        "(Drain) until a probe answers",
    )


def isolates(policy: model.Policy) -> bool:
    return any(r.action is Action.ISOLATE_GPU for r in policy.rules)


async def prepare(ctx: context.Context, policy: model.Policy) -> None:
    """Probe, before any GPU needs it, for a policy with an IsolateGPU rule whose answer this term does
    not know for its generation: at a term's start (kopf lists every policy), on a change, and
    while the last probe met only transient errors. Cheap when known (no request)."""
    if not isolates(policy) or policy.dry_run:
        return
    known = ctx.isolation_support.get(policy.name)
    if known is not None and known.generation == policy.generation and known.definite and not known.timed_out:
        return
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
            "reason": vocabulary.PolicyConditionReason.DRY_RUN.value,
            "message": "A dry-run policy isolates no GPU; the cluster is probed once it acts.",
        }
    if found is None or found.generation != policy.generation:
        return {
            "type": CONDITION,
            "status": "Unknown",
            "reason": vocabulary.PolicyConditionReason.NOT_PROBED.value,
            "message": "Whether the cluster acts on DeviceTaintRules is not known yet.",
        }
    if not found.definite:
        return {
            "type": CONDITION,
            "status": "Unknown",
            "reason": vocabulary.PolicyConditionReason.PROBE_FAILED.value,
            "message": f"DeviceTaintRules: {found.message}; faulty GPUs wait (action Pending) meanwhile, "
            f"for at most {PROBE_FALLBACK_SECONDS:g}s, then their nodes take the node ladder.",
        }
    if found.timed_out:
        return {
            "type": CONDITION,
            "status": "False",
            "reason": vocabulary.PolicyConditionReason.PROBE_TIMED_OUT.value,
            "message": f"DeviceTaintRules: {found.message}.",
        }
    return {
        "type": CONDITION,
        "status": "True" if found.api_version else "False",
        "reason": (
            vocabulary.PolicyConditionReason.DEVICE_TAINT_RULES
            if found.api_version
            else vocabulary.PolicyConditionReason.NODE_LADDER_FALLBACK
        ).value,
        "message": f"DeviceTaintRules: {found.message}.",
    }


def isolated_gpus(ctx: context.Context, policy: str) -> int:
    """GPUs the policy isolates now, as of the last pass over each node."""
    return sum(len(state.in_place) for (owner, _), state in ctx.isolations.items() if owner == policy)


# --- a deleted policy's rules --------------------------------------------------------------------


async def sweep(ctx: context.Context, now: datetime.datetime) -> None:
    """Rules of a policy that is gone (deleted, renamed, or deleted while no operator ran): each is
    adopted by the first acting IsolateGPU policy (by name) that selects its node, which restores the
    GPU once it has recovered, or else restored at once; never left to keep a GPU out for good.

    Once per timer pass, on the rule list reused for `recent.SECONDS` (no request otherwise). A rule
    of an invalid policy (still there) or of a node outside this operator's cache is left alone.
    Errors are logged: the next pass tries again.
    """
    version = await _any_version(ctx, now)
    if version is None:
        return
    try:
        async with ctx.isolation_locks[ALL]:
            await _sweep(ctx, version, now)
    except device_rules.TRANSIENT as error:
        logger.warning(
            "could not restore or adopt the rules of deleted policies (next pass retries): %s", error
        )


def _known_version(ctx: context.Context, now: datetime.datetime) -> str | None:
    """The version rules are in as this term knows it, with no request: a probe's, else discovery's."""
    for known in ctx.isolation_support.values():
        if known.definite and known.api_version is not None:
            return known.api_version
    seen = ctx.isolation_discovery.get(ALL, now)  # also what the last probe found (`support`)
    return seen.api_version if seen is not None else None


async def _any_version(ctx: context.Context, now: datetime.datetime) -> str | None:
    """The version rules are in: a probe's, else discovery's (gpu-health wrote none where none is served);
    None without a reason to look: after the term's first look, an isolating policy, a recent probe
    (the last isolating policy was just deleted) or a GPUNode status listing isolated GPUs."""
    known = _known_version(ctx, now)
    if known is not None or ctx.isolation_discovery.get(ALL, now) is not None:
        return known  # None: discovery serves no version, so no rule of ours is anywhere
    first = not len(ctx.isolation_discovery) and bool(ctx.cache.gpunodes)  # the term's first look
    if (
        not first
        and not any(isolates(p) for p in ctx.cache.policies.values())
        and not ctx.cache.listing_isolated
    ):
        return None  # no isolating policy and no GPU said isolated: no rule of ours to look for
    try:
        return (await _discovered_any(ctx, now)).api_version
    except device_rules.TRANSIENT as error:
        logger.warning("discovery of DeviceTaintRules failed (next pass retries): %s", error)
        return None


async def _discovered_any(ctx: context.Context, now: datetime.datetime) -> isolation.Support:
    async def load() -> isolation.Support:
        return isolation.Support(
            0, await device_rules.served_version(ctx.client), DISCOVERY_ONLY, definite=False
        )

    return await ctx.isolation_discovery.read(ALL, now, load)


async def _sweep(ctx: context.Context, version: str, now: datetime.datetime) -> None:
    present = {device_taints.label_value(n) for n in (*ctx.cache.policies, *ctx.cache.policy_errors)}
    nodes = {device_taints.label_value(n): n for n in ctx.cache.nodes}
    for rule in await _rules(ctx, version, now):
        owner = _owner(rule)
        labels = rule["metadata"].get("labels") or {}
        node = nodes.get(str(labels.get(keys.NODE_LABEL)))
        if owner is None or owner in present or node is None:
            continue
        name = rule["metadata"]["name"]
        index, uuid = _int(labels.get(keys.GPU_INDEX_LABEL)), str(labels.get(keys.GPU_UUID_LABEL))
        gpu = _gpu_name(index, uuid)
        adopter = next(
            (
                p
                for p in sorted(ctx.cache.policies.values(), key=lambda p: p.name)
                if isolates(p) and not p.dry_run and node in ctx.cache.selection(p).selected
            ),
            None,
        )
        try:
            if adopter is not None:
                adopted = await device_rules.adopt(
                    ctx.client, version, name, deleted=owner, policy=device_taints.label_value(adopter.name)
                )
            else:
                adopted = False
                await device_rules.delete(ctx.client, version, name)
        finally:
            ctx.rules_read.drop((ALL, version))
        subject = events.subject(ctx.cache, node)
        if adopter is not None:
            if not adopted:
                continue  # deleted or adopted meanwhile: the next list says what is there
            key = (adopter.name, node)
            state = ctx.isolations.get(key) or isolation.NodeState()
            if all(g.uuid != uuid for g in state.in_place):
                taken = isolation.Isolated(index, uuid, name)
                ctx.isolations[key] = dataclasses.replace(state, in_place=(*state.in_place, taken))
            await ctx.recorder.emit(
                subject,
                vocabulary.EventReason.GPU_ISOLATED,
                f"{gpu} stays isolated: policy {adopter.name} adopts DeviceTaintRule {name} of policy "
                f"{owner}, which is gone, and restores the GPU once it has recovered.",
            )
            continue
        ctx.meters.actions.labels("RestoreGPU", "PolicyDeleted").inc()
        await ctx.recorder.emit(
            subject,
            vocabulary.EventReason.GPU_RESTORED,
            f"{gpu} restored: DeviceTaintRule {name} deleted, as policy {owner} that isolated it was "
            "deleted and no acting IsolateGPU policy selects the node.",
            events.WARNING,
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
    state = isolation.of_node([s for (_, node), s in sorted(ctx.isolations.items()) if node == name])
    listed = to_status(state)
    if not listed:
        return {}
    fields: dict[str, Any] = {STATUS_FIELD: listed}
    if state.in_place:
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
        from_status(gpunode.status.get(STATUS_FIELD)) if isolates(policy) else isolation.NodeState()
    )
    if not wanted and not state.in_place and not state.overridden and not _holds(ctx, policy, name, now):
        ctx.isolations.pop(key, None)
        return
    if verdict.health is vocabulary.Health.UNKNOWN:
        return  # missing data changes nothing
    async with ctx.isolation_locks[policy.name]:
        found = await support(ctx, policy)
    async with ctx.isolation_locks[ALL]:
        rules = await _rules(ctx, found.api_version, now)
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
        known = await _discovered(ctx, policy, now)
    if attribution is None:
        attribution = isolation.attribute(
            gpunode.status, record.view, wanted, critical_xids=policies.rule_xids(policy)
        )
    if known.at is not None:  # a real probe that met only transient errors: a real fault would wait
        return isolation.undecided(
            attribution, f"whether the cluster acts on DeviceTaintRules is {known.message}"
        )
    devices = await _devices(ctx, name, now) if known.api_version is not None else {}
    selected_gpus = sum(_gpu_count(ctx, node) for node in ctx.cache.selection(policy).selected)
    return isolation.decide(
        attribution,
        devices=devices,
        api_version=known.api_version,
        max_gpus_per_node=policy.isolation_max_gpus_per_node,
        budget_left=policies.resolve_max_unavailable_gpus(policy, selected_gpus),
    )


async def _discovered(
    ctx: context.Context, policy: model.Policy, now: datetime.datetime
) -> isolation.Support:
    """What discovery alone says (no probe rule written), read once per `recent.SECONDS`; never `definite`."""
    return dataclasses.replace(await _discovered_any(ctx, now), generation=policy.generation)


DISCOVERY_ONLY: Final = "discovery only"


def probed(ctx: context.Context, policy: model.Policy) -> bool:
    """Whether this term has the probe's answer for the policy's generation (definite or not)."""
    known = ctx.isolation_support.get(policy.name)
    return known is not None and known.generation == policy.generation


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
        unprobed=not policy.dry_run and not probed(ctx, policy),
    )


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
    here = {uuid: rule for uuid, rule in on_node.items() if _owner(rule) == policy_label}
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
        if gpu.uuid not in on_node and gpu.uuid in faulty and found.api_version is not None:
            if await device_rules.exists(ctx.client, found.api_version, gpu.rule):
                continue  # created since the list was read (another policy's rule of the same name)
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
                ctx.rules_read.drop((ALL, found.api_version))
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
    isolated = frozenset(in_place) | others

    def decide(budget_left: int, wait_reason: str | None = None) -> isolation.NodeIsolation:
        return isolation.decide(
            remaining,
            devices=devices,
            api_version=found.api_version,
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
    if decision.node_ladder is None and found.api_version is not None:
        for wanted_gpu in decision.with_outcome(Outcome.ISOLATE):
            new_uuid = wanted_gpu.uuid
            if (
                new_uuid is None
                or new_uuid in isolated
                or wanted_gpu.device is None
                or wanted_gpu.index is None
            ):
                continue
            in_place[new_uuid] = await _create(
                ctx, policy, name, verdict, found.api_version, wanted_gpu, since
            )
    return isolation.NodeState(decision, tuple(in_place.values()), tuple(overridden.values()))


def _owner(rule: Mapping[str, Any]) -> str | None:
    """The `gpuhealth.io/policy` label of a rule: its policy's name as a label value."""
    labels = (rule.get("metadata") or {}).get("labels") or {}
    owner = labels.get(keys.POLICY_LABEL)
    return owner if isinstance(owner, str) else None


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
        if each.dry_run or not isolates(each):
            continue
        selected = ctx.cache.selection(each).selected
        gpus = sum(_gpu_count(ctx, node) for node in selected)
        budgets.append(
            isolation.GPUBudget(
                each.name,
                frozenset(selected),
                policies.resolve_max_unavailable_gpus(each, gpus),
                sum(by_node.get(device_taints.label_value(node), 0) for node in selected),
            )
        )
    return budgets


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
        ctx.rules_read.drop((ALL, api_version))
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
    ctx: context.Context, api_version: str | None, now: datetime.datetime
) -> list[kube.JsonObject]:
    """Every policy's rules of nodes (not the probes'), listed at most once per `recent.SECONDS`.

    Fresh after our own create or delete (they drop the entry), so the GPU budget never counts fewer
    rules than there are; a rule deleted by someone else is seen as an override a little later.
    """
    if api_version is None:
        return []

    async def load() -> list[kube.JsonObject]:
        listed = await device_rules.of_nodes(ctx.client, api_version)
        return [r for r in listed if keys.NODE_LABEL in ((r.get("metadata") or {}).get("labels") or {})]

    return await ctx.rules_read.read((ALL, api_version), now, load)


def _holds(ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime) -> bool:
    """Whether the last rule list (no request) shows a rule of the policy on the node: one it adopted,
    or one of a policy that lost its IsolateGPU rule (it neither reads the status back after a
    restart nor is probed); its pass must restore it. Any version known will do (the sweep's)."""
    version = _known_version(ctx, now)
    listed = ctx.rules_read.get((ALL, version), now) if version is not None else None
    node_label, policy_label = device_taints.label_value(name), device_taints.label_value(policy.name)
    return any(
        _owner(rule) == policy_label
        and ((rule.get("metadata") or {}).get("labels") or {}).get(keys.NODE_LABEL) == node_label
        for rule in listed or ()
    )


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
