"""What IsolateGPU learns from the cluster: whether it acts on DeviceTaintRules, the rules in place,
a node's devices.

Whether the cluster acts on rules is probed once per policy generation and term (`support`: a probe
rule written and read back; a transient error leaves the answer unknown, never the node ladder, until
`PROBE_FALLBACK_SECONDS`); a dry run or a drill reads discovery alone, kept apart (`discovered`). The
answer is the policy's `GPUIsolation` status condition (`condition`). The rules of every policy and a
node's ResourceSlices are listed at most once per `recent.SECONDS` (`rules`, `devices`), and listed
afresh after a write of ours (the write drops the entry), so the GPU budget never counts fewer rules
than there are.

No decision is taken here: the IsolateGPU action (`isolating`) and the sweep of a deleted policy's
rules (`isolation_sweep`) act on what this module reads.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import device_taints, isolation, model
from gpuhealth_operator.ladder.isolate import device_rules
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import recent

logger = logging.getLogger(__name__)

CONDITION: Final = vocabulary.PolicyConditionType.GPU_ISOLATION.value
"""The policy status condition saying whether IsolateGPU isolates GPUs or falls back to the node ladder."""

DISCOVERY_ONLY: Final = "discovery only"

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
    known = ctx.steps.isolate.support.get(policy.name)
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
    ctx.steps.isolate.support[policy.name] = found
    if found.api_version is not None:  # the version discovery served: `sweep` finds rules by it later
        ctx.steps.isolate.discovery.put(
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
    """Whether the policy has an IsolateGPU rule."""
    return any(r.action is vocabulary.Action.ISOLATE_GPU for r in policy.rules)


async def prepare(ctx: context.Context, policy: model.Policy) -> None:
    """Probe, before any GPU needs it, for a policy with an IsolateGPU rule whose answer this term does
    not know for its generation: at a term's start (kopf lists every policy), on a change, and
    while the last probe met only transient errors. Cheap when known (no request)."""
    if not isolates(policy) or policy.dry_run:
        return
    known = ctx.steps.isolate.support.get(policy.name)
    if known is not None and known.generation == policy.generation and known.definite and not known.timed_out:
        return
    async with ctx.steps.isolate.locks[policy.name]:
        await support(ctx, policy)


def condition(ctx: context.Context, policy: model.Policy) -> dict[str, Any] | None:
    """The policy's `GPUIsolation` condition (without times); None for a policy without IsolateGPU."""
    if not isolates(policy):
        return None
    found = ctx.steps.isolate.support.get(policy.name)
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


def probed(ctx: context.Context, policy: model.Policy) -> bool:
    """Whether this term has the probe's answer for the policy's generation (definite or not)."""
    known = ctx.steps.isolate.support.get(policy.name)
    return known is not None and known.generation == policy.generation


def known_version(ctx: context.Context, now: datetime.datetime) -> str | None:
    """The version rules are in as this term knows it, with no request: a probe's, else discovery's."""
    for known in ctx.steps.isolate.support.values():
        if known.definite and known.api_version is not None:
            return known.api_version
    seen = ctx.steps.isolate.discovery.get(ALL, now)  # also what the last probe found (`support`)
    return seen.api_version if seen is not None else None


async def any_version(ctx: context.Context, now: datetime.datetime) -> str | None:
    """The version rules are in: a probe's, else discovery's (gpu-health wrote none where none is served);
    None without a reason to look: after the term's first look, an isolating policy, a recent probe
    (the last isolating policy was just deleted) or a GPUNode status listing isolated GPUs."""
    known = known_version(ctx, now)
    if known is not None or ctx.steps.isolate.discovery.get(ALL, now) is not None:
        return known  # None: discovery serves no version, so no rule of ours is anywhere
    first = not len(ctx.steps.isolate.discovery) and bool(ctx.cache.gpunodes)  # the term's first look
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

    return await ctx.steps.isolate.discovery.read(ALL, now, load)


async def discovered(ctx: context.Context, policy: model.Policy, now: datetime.datetime) -> isolation.Support:
    """What discovery alone says (no probe rule written), read once per `recent.SECONDS`; never `definite`."""
    return dataclasses.replace(await _discovered_any(ctx, now), generation=policy.generation)


async def rules(
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

    return await ctx.steps.isolate.rules_read.read((ALL, api_version), now, load)


def holds(ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime) -> bool:
    """Whether the last rule list (no request) shows a rule of the policy on the node: one it adopted,
    or one of a policy that lost its IsolateGPU rule (it neither reads the status back after a
    restart nor is probed); its pass must restore it. Any version known will do (the sweep's)."""
    version = known_version(ctx, now)
    listed = ctx.steps.isolate.rules_read.get((ALL, version), now) if version is not None else None
    if not listed:
        return False  # no rule listed (or none known lately): none of the policy's
    node_label, policy_label = device_taints.label_value(name), device_taints.label_value(policy.name)
    return any(
        owner(rule) == policy_label
        and ((rule.get("metadata") or {}).get("labels") or {}).get(keys.NODE_LABEL) == node_label
        for rule in listed
    )


def untouched(ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime) -> bool:
    """Whether the policy has nothing to isolate or restore on a node it keeps no isolation of, when no
    rule of its fires: it has no IsolateGPU rule (so reads no status back) and `holds` none there. The
    first look of `isolating.isolate`, in one call."""
    return not isolates(policy) and not holds(ctx, policy, name, now)


async def devices(ctx: context.Context, name: str, now: datetime.datetime) -> dict[str, device_taints.Device]:
    """The node's DRA devices by GPU UUID, from its ResourceSlices listed once per `recent.SECONDS`."""
    return await ctx.steps.isolate.devices_read.read(
        name, now, lambda: device_rules.devices(ctx.client, name)
    )


def gpu_count(ctx: context.Context, node: str) -> int:
    """The node's GPUs as its agent counts them (0: no report yet)."""
    gpunode = ctx.cache.gpunode(node)
    summary = gpunode.status.get("summary") if gpunode is not None else None
    count = summary.get("gpuCount") if isinstance(summary, Mapping) else None
    return count if isinstance(count, int) else 0


def owner(rule: Mapping[str, Any]) -> str | None:
    """The `gpuhealth.io/policy` label of a rule: its policy's name as a label value."""
    labels = (rule.get("metadata") or {}).get("labels") or {}
    value = labels.get(keys.POLICY_LABEL)
    return value if isinstance(value, str) else None


def label_int(value: object) -> int | None:
    """A rule's GPU index label as a number (None: not one)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def gpu_name(index: int | None, uuid: str) -> str:
    """A GPU in Events' words."""
    return f"GPU {index} ({uuid})" if index is not None else f"GPU {uuid}"
