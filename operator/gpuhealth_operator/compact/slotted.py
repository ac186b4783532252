"""A read-only mapping of fixed string keys, held in slots: what the cache keeps per node many times over.

A dict of a dozen keys costs ~650 bytes of hash table; the same values in slots ~150. The cache keeps
one such record per GPU (`gpu_facts.GPUFacts`) and per GPUNode condition (`kept_conditions`), so at
100,000 nodes the difference is gigabytes. A subclass names its keys once (`__slots__`), and reads
like the dict it replaces: `get`, `[]`, `in`, iteration, equality with a dict.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

ABSENT: Final = object()
"""The value of a slot whose key the source did not hold (every slot is set: `__eq__` reads them in C)."""

Slotted = TypeVar("Slotted", bound="ReadOnlyMapping")


class ReadOnlyMapping(Mapping[str, Any]):
    """A subclass's keys are its `__slots__` (two or more); a key the source did not hold is absent.

    Its reading methods are made per subclass (`_reading`), over its own key set and getter bound in
    closures, so a reading (per GPU per judgement) looks nothing up on the class.
    """

    __slots__ = ()
    KEYS: ClassVar[tuple[str, ...]] = ()
    _all: ClassVar[operator.attrgetter[tuple[Any, ...]]]
    """Every slot's value in KEYS order (ABSENT where unset), in one C call."""

    if TYPE_CHECKING:

        def __getitem__(self, key: str) -> Any: ...
        def __iter__(self) -> Iterator[str]: ...
        def __len__(self) -> int: ...
        def as_dict(self) -> dict[str, Any]: ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.KEYS = tuple(cls.__slots__)
        assert len(cls.KEYS) > 1, "one key: attrgetter would not return a tuple"
        cls._all = operator.attrgetter(*cls.KEYS)
        for name, method in _reading(cls, cls.KEYS, cls._all).items():
            setattr(cls, name, method)

    def __init__(self, values: Mapping[str, Any]) -> None:
        """`values`: key → value, only keys of KEYS."""
        for key in self.KEYS:
            object.__setattr__(self, key, values.get(key, ABSENT))

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only ({key})")

    def __hash__(self) -> int:
        """Read-only, so hashable when its values are (a GPU's nested facts are dicts: TypeError)."""
        return hash(self._all(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"

    def __copy__(self: Slotted) -> Slotted:
        return self

    def __deepcopy__(self: Slotted, memo: dict[int, Any]) -> Slotted:
        return self

    def __reduce__(self) -> tuple[type[ReadOnlyMapping], tuple[dict[str, Any]]]:
        return type(self), (dict(self),)


def _reading(
    kind: type[ReadOnlyMapping], keys: tuple[str, ...], every: operator.attrgetter[tuple[Any, ...]]
) -> dict[str, Callable[..., Any]]:
    names = frozenset(keys)
    absent = ABSENT

    def __getitem__(self: ReadOnlyMapping, key: str) -> Any:
        value = getattr(self, key) if key in names else absent
        if value is absent:
            raise KeyError(key)
        return value

    def get(self: ReadOnlyMapping, key: str, default: Any = None) -> Any:
        if key in names:
            value = getattr(self, key)
            if value is not absent:
                return value
        return default

    def __contains__(self: ReadOnlyMapping, key: object) -> bool:
        return isinstance(key, str) and key in names and getattr(self, key) is not absent

    def __iter__(self: ReadOnlyMapping) -> Iterator[str]:
        return (key for key, value in zip(keys, every(self), strict=True) if value is not absent)

    def __len__(self: ReadOnlyMapping) -> int:
        return sum(value is not absent for value in every(self))

    def as_dict(self: ReadOnlyMapping) -> dict[str, Any]:
        """The dict it reads like, in one call: for a reader that asks many keys in turn (`signals` of
        each GPU, per judgement), whose `get`s are then the dict's, in C, not one call here each."""
        return {key: value for key, value in zip(keys, every(self), strict=True) if value is not absent}

    def __eq__(self: ReadOnlyMapping, other: object) -> bool:
        """Slot by slot, in C (each report is compared with the last one judged)."""
        if type(other) is kind:
            return bool(every(self) == every(other))
        if type(other) is dict:  # the version just decoded against the one kept
            return other.keys() <= names and every(self) == tuple(
                map(other.get, keys, itertools.repeat(absent))
            )
        return Mapping.__eq__(self, other)

    return {
        "__getitem__": __getitem__,
        "get": get,
        "__contains__": __contains__,
        "__iter__": __iter__,
        "__len__": __len__,
        "as_dict": as_dict,
        "__eq__": __eq__,
    }


def as_dicts(items: list[Any]) -> list[Any]:
    """`items` with each ReadOnlyMapping among them as its dict (`as_dict`), the rest as they are: one call
    for a list that is read key by key (`signals`, each GPU of a report per judgement)."""
    return [item.as_dict() if isinstance(item, ReadOnlyMapping) else item for item in items]


def setter(kind: type[ReadOnlyMapping], key: str) -> Callable[[Any, Any], None]:
    """The slot's own setter for `key`: one C call, past the read-only guard."""
    put: Callable[[Any, Any], None] = getattr(kind, key).__set__
    return put
