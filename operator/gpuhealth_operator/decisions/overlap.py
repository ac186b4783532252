"""Combining the verdicts of several acting policies that select the same node.

Labels and our taint are properties of the Node, not of a policy. If each
policy patched its own wishes, two policies with different rules would undo
each other on every pass and the labels would flap (safety rule 5). So the
Node gets one combined wish: for each key the most severe value any acting
policy wants, and removal only when none wants it. Cordon and drain are not
combined here: the budgets are (`budget.admits_all`, asked by `admission`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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
