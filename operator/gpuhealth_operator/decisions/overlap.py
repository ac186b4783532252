"""Combining the verdicts of several acting policies that select the same node.

Labels and our taint are properties of the Node, not of a policy. If each
policy patched its own wishes, two policies with different rules would undo
each other on every pass and the labels would flap (safety rule 5). So the
Node gets one combined wish: for each key the most severe value any acting
policy wants, and removal only when none wants it. Cordon and drain are not
combined here: the budgets are (`budget.admits_all`, asked by `admission`).

The GPUNode's status and the Node's GPUHealthy condition report one verdict:
the acting policies' strongest (`reported`), so a dry-run preview or a policy
with milder rules never hides what another did or waits to do; each selecting
policy's own verdict is listed beside it (`status.policies`). Its conditions
are the reported verdict's plus those only other policies judge
(`shown_conditions`): the hysteresis clocks live in those conditions, so a
policy that is not reported must still find its own there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, severity

LABEL_SEVERITY: dict[str, int] = {
    vocabulary.Health.HEALTHY.value.lower(): 0,
    vocabulary.Health.DEGRADED.value.lower(): 1,
    vocabulary.Health.UNHEALTHY.value.lower(): 2,
    "true": 3,
}


def _label_rank(value: str | None) -> int:
    return -1 if value is None else LABEL_SEVERITY.get(value, 0)


def combined_labels(verdicts: Sequence[model.NodeVerdict]) -> dict[str, str | None]:
    """Per label key, the most severe value wanted by any verdict; None (remove) only if all say so."""
    combined: dict[str, str | None] = {}
    for verdict in verdicts:
        for key, value in verdict.wanted_labels.items():
            if key not in combined or _label_rank(value) > _label_rank(combined[key]):
                combined[key] = value
    return combined


def combined_taint(verdicts: Sequence[model.NodeVerdict]) -> str | None:
    """The taint value of the most severe condition any verdict wants tainted; None if none does."""
    wanted = [v.wanted_taint for v in verdicts if v.wanted_taint is not None]
    known = {c.value for c in vocabulary.Condition}
    by_condition = [vocabulary.Condition(w) for w in wanted if w in known]
    if by_condition:
        return severity.most_severe_first(by_condition)[0].value
    return wanted[0] if wanted else None


def combine(verdicts: Sequence[model.NodeVerdict]) -> list[model.NodeVerdict]:
    """The same verdicts, each carrying the node's combined labels and taint."""
    labels = combined_labels(verdicts)
    taint = combined_taint(verdicts)
    return [dataclasses.replace(v, wanted_labels=labels, wanted_taint=taint) for v in verdicts]


HEALTH_STRENGTH: Final[dict[vocabulary.Health, int]] = {
    vocabulary.Health.HEALTHY: 0,
    vocabulary.Health.DEGRADED: 1,
    vocabulary.Health.UNKNOWN: 2,
    vocabulary.Health.UNHEALTHY: 3,
}

_NodeAction = vocabulary.NodeAction
ACTION_STRENGTH: Final[dict[vocabulary.NodeAction, int]] = {
    _NodeAction.NONE: 0,
    _NodeAction.DRY_RUN: 1,
    _NodeAction.DRILL: 1,
    _NodeAction.EVENT: 1,
    _NodeAction.LABELED: 2,
    _NodeAction.TAINTED: 3,
    _NodeAction.ISOLATED: 4,
    _NodeAction.OVERRIDDEN: 5,
    _NodeAction.PENDING: 6,
    _NodeAction.CORDONED: 7,
    _NodeAction.DRAINING: 8,
    _NodeAction.DRAINED: 9,
    _NodeAction.REPAIRING: 10,
    _NodeAction.VALIDATING: 10,
    _NodeAction.RETIRED: 11,
}
"""How much a status action says about the node: a cordon waiting for the budget (Pending) says more
than a label, a cordon made more than one waited for, a drain more than its cordon."""


def reported(judged: Sequence[tuple[bool, vocabulary.Health, vocabulary.NodeAction]]) -> int:
    """Which of a node's verdicts (dry run?, health, action; in policy-name order) its status reports.

    The acting policies' strongest: the most severe health, then the strongest
    action; the first by name on a tie. A dry-run policy's only where no acting
    policy selects the node (it changes nothing, so it must not hide what was done).
    """
    acting = [i for i, (dry_run, _, _) in enumerate(judged) if not dry_run]
    candidates = acting or list(range(len(judged)))
    return max(
        candidates,
        key=lambda i: (HEALTH_STRENGTH.get(judged[i][1], 0), ACTION_STRENGTH.get(judged[i][2], 0), -i),
    )


def shown_conditions(
    reported_verdict: model.NodeVerdict, others: Sequence[model.NodeVerdict]
) -> dict[vocabulary.ConditionKey, model.ConditionState]:
    """The conditions a node's status holds: the reported verdict's, and each condition only other
    policies judge as the first of them (by name) judged it.

    Every policy reads its previous condition states (forSeconds and clearing clocks) from the
    status; without the others' conditions there, a policy whose verdict is not reported would
    start its clocks afresh on every pass, and its sustained conditions would never set, or would
    clear and set again (flapping labels) as the reported policy changes.
    """
    shown: dict[vocabulary.ConditionKey, model.ConditionState] = {}
    for verdict in others:
        for condition, state in verdict.conditions.items():
            shown.setdefault(condition, state)
    shown.update(reported_verdict.conditions)
    return shown
