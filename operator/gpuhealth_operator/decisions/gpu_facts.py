"""One GPU's facts as the operator keeps them: the fields the decisions read, in slots.

A GPUNode reports ~30 fields per GPU; the decisions read 21 (FIELDS). Kept
in a dict, those 17 cost a GPU ~650 bytes of hash table; in slots, 150. At
8 GPUs a node and thousands of nodes that is most of the operator's memory
(issue 14). `GPUFacts` reads like the dict it replaces (`get`, `[]`, `in`,
iteration, equality with a dict): code that reads GPU facts accepts either,
through `MAPPINGS`. It is read-only, as every cached fact is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from gpuhealth_api import conditions, status
from gpuhealth_operator.compact import slotted

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

ABSENT: Final = slotted.ABSENT
"""The value of a slot whose field the agent did not report."""


class GPUFacts(slotted.ReadOnlyMapping):
    """The kept fields of one reported GPU; a field the agent did not report is absent, as in the dict."""

    __slots__ = tuple(FIELDS)


_ALL: Final = GPUFacts._all


def empty() -> GPUFacts:
    """A GPUFacts with no slot set: the cache fills every one through `setter` (ABSENT if unreported)."""
    return object.__new__(GPUFacts)


def values(facts: GPUFacts) -> tuple[Any, ...]:
    """Every slot's value in FIELDS order (ABSENT for an unreported field), in one C call."""
    return _ALL(facts)


def setter(field: str) -> Callable[[GPUFacts, Any], None]:
    """The slot's own setter for `field`: one C call, past the read-only guard."""
    return slotted.setter(GPUFacts, field)


def _copier() -> Callable[[GPUFacts], GPUFacts]:
    """`copy_of`, written out slot by slot: a loop over 21 setters was most of re-compacting a GPU whose
    report moved two fields (a replay does it for every GPU of every report). Generated as dataclasses
    generates `__init__`: the slots are FIELDS, known only here."""
    names = [f"v{i}" for i in range(len(GPUFacts.KEYS))]
    lines = ["def copy_of(facts):", f"    {', '.join(names)}, = _all(facts)", "    new = _new(_kind)"]
    lines += [f"    _s{i}(new, {name})" for i, name in enumerate(names)]
    lines.append("    return new")
    scope: dict[str, Any] = {"_all": _ALL, "_new": object.__new__, "_kind": GPUFacts}
    scope.update({f"_s{i}": setter(key) for i, key in enumerate(GPUFacts.KEYS)})
    exec("\n".join(lines), scope)  # our own source, from the slots' names alone
    copy: Callable[[GPUFacts], GPUFacts] = scope["copy_of"]
    return copy


copy_of: Final = _copier()
"""A new GPUFacts holding every slot of the one given, for a caller to set the slots that changed."""


MAPPINGS: Final = (dict, GPUFacts)
"""What a GPU's facts may be: as reported (dict) or as cached. An isinstance check on a tuple of
concrete types, not on the Mapping ABC: it runs per GPU per judgement."""
