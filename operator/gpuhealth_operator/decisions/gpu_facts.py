"""One GPU's facts as the operator keeps them: the fields the decisions read, in slots.

A GPUNode reports ~30 fields per GPU; the decisions read 21 (FIELDS). Kept
in a dict, those 17 cost a GPU ~650 bytes of hash table; in slots, 150. At
8 GPUs a node and thousands of nodes that is most of the operator's memory
(issue 14). `GPUFacts` reads like the dict it replaces (`get`, `[]`, `in`,
iteration, equality with a dict): code that reads GPU facts accepts either,
through `MAPPINGS`. It is read-only, as every cached fact is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from gpuhealth_api import conditions, status

OTHER_FIELDS: Final = frozenset(
    {"index", "uuid", "model", "smClockMHz", "maxSmClockMHz", "throttledSince", "unreadable", "observedTime"}
)
"""Per-GPU facts read beside the conditions' predicates: the GPU's name, the straggler score's clocks,
when throttling began, which facts the agent cannot read, when a fact last changed."""
FIELDS: Final[Mapping[str, frozenset[str] | None]] = {
    field: conditions.GPU_PATHS.get(field)
    for field in status.GPUStatus.__annotations__
    if field in conditions.GPU_PATHS or field in OTHER_FIELDS
}
"""Per-GPU facts the decision core reads (None: the whole value; else the keys kept of a nested object):
what every condition's predicate reads (`conditions.GPU_PATHS`, so none can be forgotten) and
OTHER_FIELDS, in the order of `status.GPUStatus`."""

_NAMES: Final = frozenset(FIELDS)
ABSENT: Final = object()
"""The value of a slot whose field the agent did not report (every slot is set: `__eq__` reads them in C)."""
_ALL: Final = operator.attrgetter(*FIELDS)


class GPUFacts(Mapping[str, Any]):
    """The kept fields of one reported GPU; a field the agent did not report is absent, as in the dict."""

    __slots__ = tuple(FIELDS)

    def __init__(self, values: Mapping[str, Any]) -> None:
        """`values`: field → value, only fields of FIELDS (the cache fills the slots itself, see `setter`)."""
        for key in FIELDS:
            object.__setattr__(self, key, values.get(key, ABSENT))

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"GPU facts are read-only ({key})")

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key) if key in _NAMES else ABSENT
        if value is ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        if key in _NAMES:
            value = getattr(self, key)
            if value is not ABSENT:
                return value
        return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in _NAMES and getattr(self, key) is not ABSENT

    def __iter__(self) -> Iterator[str]:
        return (key for key, value in zip(FIELDS, _ALL(self), strict=True) if value is not ABSENT)

    def __len__(self) -> int:
        return sum(1 for value in _ALL(self) if value is not ABSENT)

    def __eq__(self, other: object) -> bool:
        """Slot by slot between two GPUFacts, in C (each report is compared with the last one judged)."""
        if type(other) is GPUFacts:
            return bool(_ALL(self) == _ALL(other))
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # read-only, but holding dicts and lists

    def __repr__(self) -> str:
        return f"GPUFacts({dict(self)!r})"

    def __copy__(self) -> GPUFacts:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> GPUFacts:
        return self

    def __reduce__(self) -> tuple[type[GPUFacts], tuple[dict[str, Any]]]:
        return GPUFacts, (dict(self),)


def empty() -> GPUFacts:
    """A GPUFacts with no slot set: the cache fills every one through `setter` (ABSENT if unreported)."""
    return object.__new__(GPUFacts)


def values(facts: GPUFacts) -> tuple[Any, ...]:
    """Every slot's value in FIELDS order (ABSENT for an unreported field), in one C call."""
    return _ALL(facts)


def setter(field: str) -> Callable[[GPUFacts, Any], None]:
    """The slot's own setter for `field`: one C call, past the read-only guard."""
    put: Callable[[GPUFacts, Any], None] = getattr(GPUFacts, field).__set__
    return put


MAPPINGS: Final = (dict, GPUFacts)
"""What a GPU's facts may be: as reported (dict) or as cached. An isinstance check on a tuple of
concrete types, not on the Mapping ABC: it runs per GPU per judgement."""
