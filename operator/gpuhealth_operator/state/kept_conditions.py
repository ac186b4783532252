"""A GPUNode's `status.conditions[]` item as the cache keeps it: its time of its own, the rest shared.

Every node holds fifteen of our conditions. As dicts they were 4 KiB of every node's record, a sixth of
the operator's memory per node (issue 29). What differs between nodes is mostly `lastTransitionTime`
(when this node was first judged); type, status, reason, message and generation repeat across the
fleet. So a condition is kept as its time and a shared `Shape` of the rest: 48 bytes, where the dict
was 272. A condition holding a key we do not write stays a dict.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

from gpuhealth_api import vocabulary
from gpuhealth_operator.compact import slotted
from gpuhealth_operator.decisions import hysteresis, model

SINCE: Final = "lastTransitionTime"
_ABSENT: Final = slotted.ABSENT


class Shape(slotted.ReadOnlyMapping):
    """A condition's keys but its `lastTransitionTime`: what many nodes' conditions hold alike."""

    __slots__ = tuple(k for k in model.ConditionRecord.__annotations__ if k != SINCE)


_SHAPE_KEYS: Final = frozenset(Shape.KEYS)
_KEYS: Final = _SHAPE_KEYS | {SINCE}
_IN_ORDER: Final = (SINCE, *Shape.KEYS)


class KeptCondition(Mapping[str, Any]):
    """One condition item, read like the dict it was (`get`, `[]`, iteration, equality with a dict)."""

    __slots__ = ("_shape", "_since")
    _shape: Shape
    _since: Any

    def __init__(self, shape: Shape, since: object) -> None:
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_since", since)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"KeptCondition is read-only ({key})")

    def __getitem__(self, key: str) -> Any:
        if key == SINCE:
            if self._since is _ABSENT:
                raise KeyError(key)
            return self._since
        return self._shape[key]

    def get(self, key: str, default: Any = None) -> Any:
        """One call, not two (`Shape.get`): the conditions are read key by key when parsed."""
        value = self._since if key == SINCE else getattr(self._shape, key) if key in _SHAPE_KEYS else _ABSENT
        return default if value is _ABSENT else value

    def __contains__(self, key: object) -> bool:
        return (self._since is not _ABSENT) if key == SINCE else key in self._shape

    def __iter__(self) -> Iterator[str]:
        if self._since is not _ABSENT:
            yield SINCE
        yield from self._shape

    def __len__(self) -> int:
        return len(self._shape) + (self._since is not _ABSENT)

    def values_in_order(self) -> tuple[Any, ...]:
        """Every key's value in `_IN_ORDER` (ABSENT where unset): what `same` compares."""
        return (self._since, *Shape._all(self._shape))

    def __eq__(self, other: object) -> bool:
        if type(other) is KeptCondition:
            return bool(self._since == other._since and self._shape == other._shape)
        if type(other) is dict:
            return _matches(self, other)
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        """Of every value in a C call (not the shape's `__hash__`, a call into `slotted` per condition
        shared): equal conditions hold equal values, so hash alike."""
        return hash(self.values_in_order())

    def __repr__(self) -> str:
        return f"KeptCondition({dict(self)!r})"

    def __copy__(self) -> KeptCondition:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> KeptCondition:
        return self

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _rebuilt, (dict(self),)


_POSITIONS: Final = types.MappingProxyType({key: index for index, key in enumerate(_IN_ORDER)})
"""Each kept key's place in `values_in_order` (read-only: a module holds no state of its own)."""


def rows(items: object, fields: Sequence[str]) -> list[tuple[Any, ...]]:
    """Each Mapping item's values under `fields` (None where it holds none, as `get` reads), in one call:
    a KeptCondition's from its slots at once, where a reader asking key by key made a call here per key,
    seven per condition of fifteen (issue 46). No list or tuple of items: no rows."""
    if not isinstance(items, list | tuple):
        return []
    at = [_POSITIONS.get(field) for field in fields]
    found: list[tuple[Any, ...]] = []
    for item in items:
        if type(item) is KeptCondition:
            values = (*item.values_in_order(), _ABSENT)  # a field we do not keep reads the last: absent
            row = tuple(values[-1 if index is None else index] for index in at)
            found.append(tuple(None if value is _ABSENT else value for value in row))
        elif isinstance(item, Mapping):
            found.append(tuple(map(item.get, fields)))
    return found


def parsed(items: object, table: Table) -> Mapping[vocabulary.ConditionKey, model.ConditionState]:
    """`hysteresis.from_status` of a node's kept conditions, read-only, each state shared in `table`'s
    entries (keyed by its type and itself: one copy across the fleet): read (`rows`) and parsed in a call
    each, not per condition and key, and shared here by `dict.setdefault`, not by a call into the table's
    module (issue 46). No bound checked: a judgement adds a node's fifteen states at most, and the next
    record stored checks it (`compaction.compact_status`)."""
    states = hysteresis.from_rows(rows(items, hysteresis.FIELDS))
    share = table.table.setdefault
    return types.MappingProxyType({key: share((type(state), state), state) for key, state in states.items()})


def _in_order(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(map(raw.get, _IN_ORDER, itertools.repeat(_ABSENT)))


def _matches(kept: KeptCondition, raw: dict[str, Any]) -> bool:
    """`kept == raw`: equal values of every known key, and as many keys, so no other (a missing one reads
    ABSENT)."""
    mine = kept.values_in_order()
    return mine == _in_order(raw) and len(raw) == len(mine) - mine.count(_ABSENT)


def _rebuilt(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    return kept(raw, lambda key, value: value)


def kept(raw: Mapping[str, Any], share: Callable[[Hashable, Any], Any]) -> Mapping[str, Any]:
    """`raw` as a KeptCondition, it and its shape `share`d by key (`share(key, value)`: the value held for
    `key`, else `value`, now held; one copy across the fleet), or `raw` as it is when it holds another
    key or a value that is not a scalar.

    The keys are the values and their types, a tuple hashed and compared in C: keyed by themselves, a
    shape and a condition were hashed by their own `__hash__`, a call into `slotted` and back per look-up
    (issue 46). With the types, a kept 1 never stands for a written True (as in `reuse`)."""
    if not raw.keys() <= _KEYS:
        return raw
    values = tuple(map(raw.get, _IN_ORDER, _ABSENTS))  # its `lastTransitionTime`, then its shape's
    types = tuple(map(type, values))
    try:
        hash(values)
    except TypeError:
        return raw
    shape: Shape = share((Shape, values[1:], types[1:]), _shape(values[1:]))
    condition: KeptCondition = share((KeptCondition, values, types), KeptCondition(shape, values[0]))
    return condition


_SHAPE_SLOTS: Final = tuple(slotted.setter(Shape, key) for key in Shape.KEYS)
"""Each of a Shape's slots' own setter, in KEYS order (`_shape`)."""


def _shape(values: tuple[Any, ...]) -> Shape:
    """`Shape(raw)` of the values `kept` read off `raw` already (KEYS order, ABSENT where unset), set slot by
    slot in C calls: not read off `raw` again by `ReadOnlyMapping.__init__`, a call into `slotted` per
    condition kept."""
    shape: Shape = object.__new__(Shape)
    for put, value in zip(_SHAPE_SLOTS, values, strict=True):
        put(shape, value)
    return shape


class Table(Protocol):
    """What `kept_list` and `parsed` ask of the cache's shared values (`compaction.SharedValues`, a layer
    above)."""

    table: dict[Hashable, Any]
    """Its entries, by key: what `kept_list` shares its conditions and shapes in, `parsed` its states."""

    def each_of(self, raws: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]: ...
    def mapping(self, raw: Mapping[str, Any]) -> dict[str, Any]: ...


def kept_list(raw: object, held: object, table: Table) -> object:
    """`status.conditions` as the cache keeps it (`raw` as decoded; `held`: the older version's, if any):
    the older list when equal (an agent's report leaves the operator's conditions as they were),
    otherwise the older version's equal conditions (`reuse`) and the others shared in `table`, whose
    bound the record's compaction checked (`compaction.compact_status`, once per record).
    Fifteen conditions decoded afresh from every watch event were a third of the memory a node cost."""
    if not isinstance(raw, list):
        return raw
    if isinstance(held, list):
        if held is raw or same(held, raw):
            return held
        found = reuse(held, raw)  # our own write: most conditions as they were
        fresh = iter(_shared([c for c, k in zip(raw, found, strict=True) if k is None], table))
        return [next(fresh) if k is None else k for k in found]
    return _shared(raw, table)


def _shared(raws: list[object], table: Table) -> list[object]:
    """Each status condition as kept: its strings shared (all the list's in one call to `table`, not one
    call per condition: a GPUNode seen first holds fifteen, issue 46), and the whole condition where
    another node holds the same one (nodes first judged in the same second), `kept` in the table's
    entries directly (`dict.setdefault`, a C call: the record checked the bound)."""
    dicts = [c for c in raws if type(c) is dict]
    if not dicts:
        return list(raws)  # the record's own list, as ever: not the decoded body's
    strings = iter(table.each_of(dicts))
    share = table.table.setdefault
    found: list[object] = []
    for raw in raws:
        if type(raw) is not dict:
            found.append(raw)
            continue
        values = next(strings)
        condition = kept(values, share)
        found.append(table.mapping(values) if condition is values else condition)
    return found


def same(held: Sequence[object], raw: Sequence[object]) -> bool:
    """Whether the conditions `raw` (as decoded) equal those `held` (KeptConditions): what every agent
    report asks of the conditions it carries unchanged, so without an `__eq__` dispatch per item.

    One pass, `_matches` inlined: fifteen conditions on every report. A pair that is not a KeptCondition
    and a dict is compared as the lists' `==` compares it (`list(held) == list(raw)` then; an unequal
    pair before it already answered False, as that comparison would)."""
    if len(held) != len(raw):
        return False
    shape_values = Shape._all
    for kept_one, decoded in zip(held, raw, strict=True):
        if type(kept_one) is not KeptCondition or type(decoded) is not dict:
            return list(held) == list(raw)
        mine = (kept_one._since, *shape_values(kept_one._shape))
        if mine != tuple(map(decoded.get, _IN_ORDER, _ABSENTS)) or len(decoded) != len(mine) - mine.count(
            _ABSENT
        ):
            return False
    return True


def reuse(held: Sequence[object], raw: Sequence[object]) -> list[KeptCondition | None]:
    """For each condition of `raw` (as decoded), the KeptCondition of `held` equal to it, of the same
    value types (a kept 1 never stands for a written True), or None: what the answer to our own status
    write takes over from the version before it. That write changes a condition or two of fifteen; each
    compacted and shared again was some thirty calls across modules (issue 46), a dict look-up here."""
    known: dict[tuple[tuple[Any, ...], tuple[type, ...]], KeptCondition] = {}
    for kept_one in held:
        if type(kept_one) is KeptCondition:
            mine = kept_one.values_in_order()
            known.setdefault((mine, tuple(map(type, mine))), kept_one)
    found: list[KeptCondition | None] = []
    for decoded in raw:
        match = None
        if type(decoded) is dict:
            values = tuple(map(decoded.get, _IN_ORDER, _ABSENTS))
            if len(decoded) == len(values) - values.count(_ABSENT):  # no key but ours
                try:
                    match = known.get((values, tuple(map(type, values))))
                except TypeError:  # an unhashable value: no held condition (all hashable) equals it
                    match = None
        found.append(match)
    return found


_ABSENTS: Final = itertools.repeat(_ABSENT)
"""`_in_order`'s default for every key (an endless iterator: `map` stops at `_IN_ORDER`'s end)."""
