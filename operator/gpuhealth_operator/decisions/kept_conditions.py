"""A GPUNode's `status.conditions[]` item as the cache keeps it: its keys in slots, not a dict.

Every node holds fifteen of our conditions, each with its own `lastTransitionTime`, so they cannot be
shared across the fleet: as dicts they were 4 KiB of every node's record, a sixth of the operator's
memory per node (issue 29). A condition holding a key we do not write stays a dict.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth_operator.decisions import model, slotted


class KeptCondition(slotted.ReadOnlyMapping):
    """One condition item, read like the dict it was (`get`, `[]`, equality with a dict)."""

    __slots__ = tuple(model.ConditionRecord.__annotations__)


_NAMES = frozenset(KeptCondition.KEYS)


def kept(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """`raw` as a KeptCondition (hashable: nodes holding an equal one share it), or as it is when it holds
    another key or a value that is not a scalar."""
    if not raw.keys() <= _NAMES:
        return raw
    condition = KeptCondition(raw)
    try:
        hash(condition)
    except TypeError:
        return raw
    return condition


def same(held: Sequence[object], raw: Sequence[object]) -> bool:
    """Whether the conditions `raw` (as decoded) equal those `held` (KeptConditions): what every agent
    report asks of the conditions it carries unchanged, so in bulk C calls, not an `__eq__` per item."""
    if len(held) != len(raw):
        return False
    if not all(type(k) is KeptCondition and type(r) is dict for k, r in zip(held, raw, strict=True)):
        return list(held) == list(raw)
    names, keys, absent = _NAMES, KeptCondition.KEYS, itertools.repeat(slotted.ABSENT)
    dicts: Sequence[dict[str, Any]] = raw  # type: ignore[assignment]  # checked above
    return all(r.keys() <= names for r in dicts) and list(map(KeptCondition._all, held)) == [
        tuple(map(r.get, keys, absent)) for r in dicts
    ]
