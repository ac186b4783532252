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

from gpuhealth_api import faults, vocabulary

Condition = vocabulary.Condition

ORDER: Final[tuple[Condition, ...]] = (
    Condition.GPU_LOST,
    Condition.ECC_UNCORRECTABLE,
    Condition.ROW_REMAP_FAILURE,
    Condition.XID_CRITICAL,
    Condition.RECOVERY_REQUIRED,
    Condition.FABRIC_UNHEALTHY,
    Condition.PCIE_ERRORS,
    Condition.AGENT_STALE,
    Condition.AGENT_ERROR,
    Condition.GPU_OPERATOR_MAINTENANCE,
    Condition.THERMAL_THROTTLED,
    Condition.POWER_THROTTLED,
    Condition.PCIE_DEGRADED,
    Condition.NVLINK_DEGRADED,
    Condition.NIC_DEGRADED,
    Condition.MEMORY_DEGRADING,
    Condition.STRAGGLER,
)
"""Most severe first. A lost GPU outranks the faults it is often the end of."""

FATAL: Final[frozenset[Condition]] = faults.FATAL
"""Conditions that make a node Unhealthy; computed whatever the rules say (one list with `check`'s exit 1)."""

SUSTAINED: Final[frozenset[Condition]] = frozenset(
    {
        Condition.THERMAL_THROTTLED,
        Condition.POWER_THROTTLED,
        Condition.PCIE_DEGRADED,
        Condition.NVLINK_DEGRADED,
        Condition.NIC_DEGRADED,
        Condition.MEMORY_DEGRADING,
        Condition.STRAGGLER,
    }
)
"""Conditions that make a node Degraded and clear only after healthyForSeconds."""

LOWEST: Final = len(ORDER)
"""Rank of 'no condition' (sorts after every real condition)."""


def rank(condition: Condition) -> int:
    """0 for the most severe condition, larger for milder ones."""
    return ORDER.index(condition)


def most_severe_first(conditions: Iterable[Condition]) -> tuple[Condition, ...]:
    return tuple(sorted(set(conditions), key=rank))


def worst_rank(conditions: Iterable[Condition]) -> int:
    """Rank of the most severe of `conditions`; LOWEST when there are none."""
    return min((rank(c) for c in conditions), default=LOWEST)
