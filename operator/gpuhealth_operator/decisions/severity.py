"""How severe each condition is, and which conditions are fatal or sustained.

One ranking serves three readers: `status.issues` lists true conditions most
severe first, the disruption budget admits the most severe nodes first, and a
verdict's health follows from the class of its worst condition.

Fatal conditions are hardware faults whose evidence only disappears with a GPU
reset or a reboot, so they clear as soon as the evidence is gone. Sustained
conditions come and go with load and cooling, so they set after `forSeconds`
and clear only after `recovery.healthyForSeconds` without evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from gpuhealth_api import conditions, vocabulary
from gpuhealth_operator.decisions import isolation, model

Condition = vocabulary.Condition

ORDER: Final = conditions.ORDER
"""Most severe first (`conditions.ROWS`): a lost GPU outranks the faults it is often the end of."""

FATAL: Final = conditions.FATAL
"""Conditions that make a node Unhealthy; computed whatever the rules say (one list with `check`'s exit 1)."""

SUSTAINED: Final = conditions.SUSTAINED
"""Conditions that make a node Degraded and clear only after healthyForSeconds."""

NODE_CONDITION_RANK: Final = len(ORDER)
"""Rank of another tool's Node condition a rule names (`vocabulary.NodeCondition`): after all of ours,
which know the GPUs; among themselves by name."""
LOWEST: Final = len(ORDER) + 1
"""Rank of 'no condition' (sorts after every real condition)."""

_RANKS: Final[dict[str, int]] = {c: i for i, c in enumerate(ORDER)}


def rank(condition: vocabulary.ConditionKey) -> int:
    """0 for the most severe condition, larger for milder ones."""
    return _RANKS.get(condition, NODE_CONDITION_RANK)


def most_severe_first(conditions: Iterable[vocabulary.ConditionKey]) -> tuple[vocabulary.ConditionKey, ...]:
    return tuple(sorted(set(conditions), key=lambda c: (rank(c), str(c))))


def worst_rank(conditions: Iterable[vocabulary.ConditionKey]) -> int:
    """Rank of the most severe of `conditions`; LOWEST when there are none."""
    return min((rank(c) for c in conditions), default=LOWEST)


def budget_rank(verdict: model.NodeVerdict) -> int:
    """Severity rank of the worst condition behind a wanted Cordon/Drain (budget ordering).

    Here, beside `worst_rank`, so the budget's index (`context.Verdicts.wanting`) asks one module once
    per stored verdict (issue 46)."""
    return worst_rank([r.condition for r in verdict.fired_rules if r.action in isolation.DISRUPTING])
