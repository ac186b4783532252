"""What a verdict would change on a Node, computed from the cache alone (no request).

Remediation applies these changes; a dry run and a fire drill only say them
in words, so the three never disagree on what "the change" is.
"""

from __future__ import annotations

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import nodes
from gpuhealth_operator.decisions import model, verdicts
from gpuhealth_operator.state import cache

Action = vocabulary.Action


def label_changes(record: cache.NodeRecord, verdict: model.NodeVerdict) -> dict[str, str | None]:
    labels = record.view.labels
    return {k: v for k, v in verdict.wanted_labels.items() if labels.get(k) != v}


def our_taint(record: cache.NodeRecord) -> str | None:
    for taint in record.taints:
        if taint.get("key") == keys.UNHEALTHY_TAINT:
            return str(taint.get("value") or "")
    return None


def marks(record: cache.NodeRecord, verdict: model.NodeVerdict) -> tuple[dict[str, str | None], str | None]:
    """`label_changes` and `our_taint` of the record, in one call: what a writer of the marks reads first."""
    return label_changes(record, verdict), our_taint(record)


def dry_run_changes(record: cache.NodeRecord, policy: model.Policy, verdict: model.NodeVerdict) -> list[str]:
    """What a non-dry-run policy would change on the Node now, in words."""
    changes = []
    for key, value in sorted(label_changes(record, verdict).items()):
        changes.append(f"remove label {key}" if value is None else f"label {key}={value}")
    if our_taint(record) != verdict.wanted_taint:
        changes.append(
            "remove taint " + keys.UNHEALTHY_TAINT
            if verdict.wanted_taint is None
            else f"taint {keys.UNHEALTHY_TAINT}={verdict.wanted_taint}:{nodes.TAINT_EFFECT}"
        )
    if verdict.wanted_action is Action.DRAIN and not record.view.unschedulable:
        changes.append("cordon and drain")
    elif verdict.wanted_action is Action.CORDON and not record.view.unschedulable:
        changes.append("cordon")
    elif record.view.cordoned_by == policy.name and verdicts.may_uncordon(policy, record.view, verdict):
        changes.append("uncordon")
    return changes
