"""Human overrides: the evidence that stood when someone uncordoned a node we cordoned, and what is new since.

Anyone making a node we cordoned schedulable again (`kubectl uncordon`)
overrides us (DESIGN.md, safety rule 1): we drop our claim and act again only
on *new* evidence. "New" is measured against a baseline of the facts at the
override, kept on the Node (annotation `gpuhealth.io/overridden-evidence`) so a
restart remembers it:

- a condition's episode: the `lastTransitionTime` of each condition True at the
  override. A condition that clears and returns starts a new episode (a later
  transition time), and so is new evidence;
- counters that only grow between GPU resets: the uncorrected volatile ECC count
  and the count of each critical XID, per GPU. A count past the baseline (or a
  GPU or XID code the baseline does not know) is new evidence.

Pure functions only; `gpuhealth_operator.ladder.override.overrides` does the I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhealth_api import conditions, keys, status, vocabulary
from gpuhealth_operator.decisions import hysteresis, model, policies, times

Condition = vocabulary.Condition
_NAMES = frozenset(c.value for c in Condition)
_NO_EVIDENCE = conditions.BLIND
"""Conditions that say why nothing is judged, never a fault: no new evidence after an override."""


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the facts showed at one instant, as far as "new evidence" is concerned."""

    episodes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """True condition → its lastTransitionTime (RFC 3339): which episode of it this is."""
    ecc: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """GPU (uuid, else index) → uncorrected volatile ECC count, where above 0."""
    xids: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    """GPU → critical XID code (as a string, as JSON keys are) → count, where above 0."""


def _gpu_key(gpu: status.GPUStatus) -> str:
    return str(gpu.get("uuid") or gpu.get("index", "?"))


def _count(value: object) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0


def _episodes(verdict: model.NodeVerdict) -> dict[str, str]:
    """The verdict's True conditions → their lastTransitionTime."""
    return {
        condition.value: times.render(state.last_transition_time)
        for condition, state in verdict.conditions.items()
        if state.status == hysteresis.TRUE and condition not in _NO_EVIDENCE
    }


def gather(verdict: model.NodeVerdict, facts: status.GPUNodeStatus, rule_xids: frozenset[int]) -> Evidence:
    """The evidence in `verdict` (its True conditions) and in the agent's `facts` (its counters)."""
    episodes = _episodes(verdict)
    ecc: dict[str, int] = {}
    xids: dict[str, dict[str, int]] = {}
    gpus = facts.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        if not isinstance(gpu, Mapping):
            continue
        key = _gpu_key(gpu)
        raw_ecc = gpu.get("ecc")
        count = _count(raw_ecc.get("uncorrectedVolatile")) if isinstance(raw_ecc, Mapping) else 0
        if count:
            ecc[key] = count
        raw_xids = gpu.get("xids")
        codes = {
            str(_count(x.get("code"))): _count(x.get("count"))
            for x in (raw_xids if isinstance(raw_xids, list) else [])
            if isinstance(x, Mapping) and _count(x.get("code")) in rule_xids and _count(x.get("count"))
        }
        if codes:
            xids[key] = codes
    return Evidence(episodes=episodes, ecc=ecc, xids=xids)


def gather_all(
    judged: Sequence[tuple[model.Policy, model.NodeVerdict]], facts: status.GPUNodeStatus
) -> Evidence:
    """The evidence standing for every policy that judged the node (the first's episodes first): each
    policy later compares its own evidence with this one baseline (`apply`), so a policy counting more
    critical XIDs, or with a condition true that another lacks, must find them in it, or it would take
    what stood at the override for new evidence and cordon the node again."""
    if not judged:
        return Evidence()
    rule_xids = frozenset[int]().union(*(policies.rule_xids(p) for p, _ in judged))
    found = gather(judged[0][1], facts, rule_xids)  # the counters once; the other verdicts' episodes
    episodes = dict(found.episodes)
    for _, verdict in judged[1:]:
        for condition, since in _episodes(verdict).items():
            episodes.setdefault(condition, since)
    return dataclasses.replace(found, episodes=episodes)


def driving(verdict: model.NodeVerdict) -> tuple[vocabulary.ConditionKey, ...]:
    """The conditions behind the verdict's wanted Cordon or Drain."""
    return tuple(
        dict.fromkeys(r.condition for r in verdict.fired_rules if r.action in vocabulary.DISRUPTIVE_ACTIONS)
    )


def new_evidence(
    baseline: Evidence, current: Evidence, conditions: Iterable[vocabulary.ConditionKey]
) -> list[str]:
    """What, among the evidence for `conditions`, is new since `baseline`, in words (empty: nothing new)."""
    found: list[str] = []
    for condition in conditions:
        since = current.episodes.get(condition.value)
        if since is None:
            continue  # not true now: no evidence at all
        if baseline.episodes.get(condition.value) != since:
            found.append(f"{condition.value} is a new episode (true since {since})")
            continue
        if condition is Condition.ECC_UNCORRECTABLE:
            found.extend(
                f"GPU {gpu}: uncorrectable ECC count {count}, was {baseline.ecc.get(gpu, 0)} at the override"
                for gpu, count in sorted(current.ecc.items())
                if count > baseline.ecc.get(gpu, 0)
            )
        elif condition is Condition.XID_CRITICAL:
            for gpu, codes in sorted(current.xids.items()):
                before = baseline.xids.get(gpu, {})
                found.extend(
                    f"GPU {gpu}: XID {code} seen {count} time(s), {before.get(code, 0)} at the override"
                    for code, count in sorted(codes.items())
                    if count > before.get(code, 0)
                )
    return found


def still_stands(baseline: Evidence, verdict: model.NodeVerdict) -> bool:
    """Whether any condition of the baseline is still True (else the override has nothing left to hold)."""
    return any(
        (state := verdict.conditions.get(key)) is not None and state.status == hysteresis.TRUE
        for name in baseline.episodes
        if (key := Condition(name) if name in _NAMES else vocabulary.parse_node_condition(name)) is not None
    )


def standing_text(verdict: model.NodeVerdict) -> str:
    """The evidence that still stands, in words, for the OverriddenByUser Event."""
    states = verdict.conditions
    parts = [f"{c.value} ({states[c].message})" for c in verdict.issues if c in states]
    return "; ".join(parts) if parts else "none"


def apply(
    policy: model.Policy, node: model.NodeView, facts: status.GPUNodeStatus, verdict: model.NodeVerdict
) -> model.NodeVerdict:
    """The verdict with a wanted Cordon/Drain withdrawn while a human override stands and nothing is new.

    The node then wants the strongest lesser action that fired, and is marked
    `overridden`; a baseline that does not parse (edited by hand) holds back
    too: missing data never disrupts, and removing the annotation hands the
    node back. A node a policy has cordoned since carries no baseline.
    """
    text = node.annotations.get(keys.OVERRIDDEN_EVIDENCE_ANNOTATION)
    if (
        text is None
        or node.cordoned_by is not None
        or verdict.wanted_action not in vocabulary.DISRUPTIVE_ACTIONS
    ):
        return verdict
    baseline = parse(text)
    if baseline is not None:
        current = gather(verdict, facts, policies.rule_xids(policy))
        if new_evidence(baseline, current, driving(verdict)):
            return verdict
    lesser = [r.action for r in verdict.fired_rules if r.action not in vocabulary.DISRUPTIVE_ACTIONS]
    return dataclasses.replace(verdict, wanted_action=lesser[0] if lesser else None, overridden=True)


def cordon_taken_over(metadata: Mapping[str, Any]) -> bool:
    """Whether a Node's `spec.unschedulable` was last set by someone other than the writer of our claim.

    Our cordon sets the flag and its identity (`cordoned-at`; before that annotation
    existed, `cordoned-by`) in one write, so one field manager owns both. A human's
    uncordon and cordon since (`kubectl`, whatever the operator saw of it: it may have
    restarted in between) moves the flag to their manager and leaves our annotations
    alone. Then the flag is theirs: the claim is stale, the cordon not ours to lift.
    Without managedFields, or with no owner known for either, the flag alone decides
    (False), as it did before.
    """
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping) or keys.CORDONED_BY_ANNOTATION not in annotations:
        return False
    identity = (
        keys.CORDONED_AT_ANNOTATION
        if keys.CORDONED_AT_ANNOTATION in annotations
        else keys.CORDONED_BY_ANNOTATION
    )
    entries = metadata.get("managedFields")
    if not isinstance(entries, list):
        return False
    claim: set[str] = set()
    flag: set[str] = set()
    for entry in entries:
        fields = entry.get("fieldsV1") if isinstance(entry, Mapping) else None
        if not isinstance(fields, Mapping):
            continue
        manager = str(entry.get("manager", ""))
        meta = fields.get("f:metadata")
        owned = meta.get("f:annotations") if isinstance(meta, Mapping) else None
        if isinstance(owned, Mapping) and f"f:{identity}" in owned:
            claim.add(manager)
        spec = fields.get("f:spec")
        if isinstance(spec, Mapping) and "f:unschedulable" in spec:
            flag.add(manager)
    return bool(claim and flag) and not claim & flag


def render(evidence: Evidence, at: datetime.datetime, policy: str) -> str:
    """The annotation value: compact JSON, keys sorted so the same evidence renders the same."""
    body: dict[str, Any] = {"at": times.render(at), "policy": policy, "episodes": dict(evidence.episodes)}
    if evidence.ecc:
        body["ecc"] = dict(evidence.ecc)
    if evidence.xids:
        body["xids"] = {gpu: dict(codes) for gpu, codes in evidence.xids.items()}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def parse(text: str | None) -> Evidence | None:
    """The baseline from the annotation; None when absent or not ours to read (edited by hand, garbage)."""
    if not text:
        return None
    try:
        body = json.loads(text)
        episodes = body.get("episodes") or {}
        ecc = body.get("ecc") or {}
        xids = body.get("xids") or {}
        if not all(isinstance(v, Mapping) for v in (episodes, ecc, xids)):
            return None
        return Evidence(
            episodes={str(k): str(v) for k, v in episodes.items()},
            ecc={str(k): _count(v) for k, v in ecc.items()},
            xids={str(g): {str(c): _count(n) for c, n in codes.items()} for g, codes in xids.items()},
        )
    except (ValueError, AttributeError, TypeError):
        return None
