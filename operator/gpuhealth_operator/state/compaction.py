"""How the cache keeps many GPUs' facts small: one copy of each value they share (`SHARED`), a GPU's
facts compacted into slots (`compact_gpu`), and compacted again when a report changes part of them.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhealth_operator.compact import interning
from gpuhealth_operator.decisions import (
    gpu_facts,
)

GPU_FIELDS = gpu_facts.FIELDS
"""Per-GPU facts the decision core reads (`gpu_facts`); the rest is not kept in memory."""


class SharedValues(interning.Table):
    """One copy of each small value that many GPUs and nodes hold alike (a bounded table).

    A healthy fleet reports the same `ecc`, `remappedRows` and `pcie` dicts, the
    same empty `xids`, the same clocks and, per report, the same `observedTime`
    on every GPU: stored once each, they cost a GPU a few pointers instead of
    ~1 KiB. Shared values are why a cache record must never be mutated (no
    reader does; they all build new objects). The table forgets everything
    when it holds `limit` entries, so values that came and went (heartbeat
    times) do not pile up; what is already shared stays shared. Keys carry
    the values' types: 1, 1.0 and True are equal in Python, not in a fact.

    Compaction runs for every report and every answer to our own status write,
    so the common cases are single C calls (`dict.setdefault`), not a walk.
    """

    def __init__(self, limit: int = 8192) -> None:
        super().__init__(limit)  # `check` once per record, not per value

    def check(self) -> None:
        """Forget every entry once the table is full: once per record (its batch of values), before it is
        shared. Here, not in `interning.Table`: this table's puts are its only callers, and each
        asked it there, a call out and back per record (issue 46)."""
        if len(self.table) >= self.limit:
            self.table.clear()

    def value(self, value: Any) -> Any:
        """A shared equal of a JSON value: strings, numbers, flat lists and flat dicts; others as they are."""
        kind = type(value)
        if kind is str:
            return sys.intern(value) if len(value) <= INTERNED_LENGTH else self.table.setdefault(value, value)
        if kind is int:  # CPython holds one copy of -5..256 already
            return value if -5 <= value <= 256 else self.table.setdefault((int, value), value)
        if kind is float:
            return self.table.setdefault((float, value), value)
        if kind is list:
            return self.sequence(value) if value else _EMPTY_LIST
        if kind is dict:
            return self.mapping(value)
        return value

    def values(self, raw: Iterable[Any]) -> list[Any]:
        """`value` of each, in one call (a Node's label values, its conditions' strings)."""
        return [self.value(v) for v in raw]

    def batch(
        self, lists: Sequence[Sequence[Any]], keyed: Mapping[str, Any]
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        """`check`, then `values` of each of `lists`, and `mapping` of `keyed` with its values shared
        (`values`): a record's few lists of strings in one call, not a call per list (issue 46)."""
        self.check()
        shared = [self.values(raw) for raw in lists]
        return shared, self.mapping(dict(zip(keyed, self.values(keyed.values()), strict=True)))

    def mapping(self, raw: Mapping[str, Any], keys: Iterable[str] | None = None) -> dict[str, Any]:
        """A dict of `raw`'s `keys` (default all); one shared copy when its values are all scalars."""
        kept = {k: raw[k] for k in (raw if keys is None else keys) if k in raw}
        try:
            return self.table.setdefault((dict, *kept, *kept.values(), *map(type, kept.values())), kept)  # type: ignore[no-any-return]
        except TypeError:  # a nested value: share the parts instead
            return self.each(kept)

    def each(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """A dict of `raw`'s items, each key interned and each value shared (`value`); the dict its own."""
        return {sys.intern(k): self.value(v) for k, v in raw.items()}

    def each_of(self, raws: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """`each` of every mapping, in one call (a GPUNode's conditions kept anew, `kept_conditions`)."""
        return [self.each(raw) for raw in raws]

    def part(self, raw: Mapping[str, Any], wanted: tuple[str, ...]) -> dict[str, Any]:
        """`mapping(raw, wanted)` for a GPU's nested facts (`ecc`, `pcie`, ...), looked up in C calls."""
        values = tuple(map(raw.get, wanted, itertools.repeat(_MISSING, len(wanted))))
        try:
            return self.table[(wanted, values, tuple(map(type, values)))]  # type: ignore[no-any-return]
        except KeyError:
            kept = {k: v for k, v in zip(wanted, values, strict=True) if v is not _MISSING}
            shared = self.mapping(kept)
            self.table[(wanted, values, tuple(map(type, values)))] = shared
            return shared
        except TypeError:  # a nested value (PCIe's `aer`): `mapping(raw, wanted)` would fail to hash it
            # too and share each value (`each`); done at once, without its second TypeError.
            share = self.value
            return {sys.intern(k): share(v) for k, v in zip(wanted, values, strict=True) if v is not _MISSING}

    def sequence(self, raw: list[Any]) -> list[Any]:
        """One shared copy of a list of scalars; a list of records with shared parts otherwise."""
        try:
            return self.table.setdefault((list, *raw, *map(type, raw)), raw)  # type: ignore[no-any-return]
        except TypeError:
            return [self.value(v) for v in raw]


INTERNED_LENGTH = 24
"""Short strings (models, reasons, enum values) go to Python's own table for good; longer ones (times)
to `SharedValues`, which can forget them."""

_MISSING: Any = object()
"""A nested fact's key the agent did not report (None is a value)."""

_EMPTY_LIST: list[Any] = []
"""Every GPU's empty `xids` and `clockEventReasons` (read-only, as all cached facts)."""

SHARED = SharedValues()
"""The operator's one table: records of every node draw on it."""

_UNIQUE_FIELDS = frozenset({"uuid"})
"""GPU fields no two GPUs share: not worth a table entry."""
_WHOLE = tuple(
    (sys.intern(k), gpu_facts.setter(k))
    for k, wanted in GPU_FIELDS.items()
    if wanted is None and k not in _UNIQUE_FIELDS
)
_UNIQUE = tuple((k, gpu_facts.setter(k)) for k in _UNIQUE_FIELDS)
_PARTS = tuple(
    (sys.intern(k), gpu_facts.setter(k), tuple(sys.intern(w) for w in sorted(wanted)))
    for k, wanted in GPU_FIELDS.items()
    if wanted is not None
)


def compact_gpu(gpu: Mapping[str, Any], shared: SharedValues = SHARED) -> gpu_facts.GPUFacts:
    """The GPU facts the decisions need (GPU_FIELDS) in slots, their values shared across the fleet.

    Runs once per GPU per GPUNode version (every agent report and every answer to our status write),
    so it walks the few kept keys, not the many reported ones, fills the slots directly, and shares
    the common scalar types inline (`SharedValues.value` for the rest). Facts already compact
    (read-only) are their own compaction: a backtest's in-memory cluster answers a status write with
    the facts it was given.
    """
    if type(gpu) is gpu_facts.GPUFacts:
        return gpu
    table, value, absent, intern = shared.table, shared.value, gpu_facts.ABSENT, sys.intern
    facts = gpu_facts.empty()
    get = gpu.get
    for key, put in _WHOLE:
        raw = get(key, absent)
        kind = type(raw)
        if kind is int:  # the commonest fact (counters, clocks, degrees)
            put(facts, raw if -5 <= raw <= 256 else table.setdefault((int, raw), raw))
        elif kind is str and len(raw) <= INTERNED_LENGTH:
            put(facts, intern(raw))
        elif raw is absent:
            put(facts, absent)
        elif kind is list and not raw:
            put(facts, _EMPTY_LIST)
        else:
            put(facts, value(raw))
    for key, put in _UNIQUE:
        put(facts, get(key, absent))
    part = shared.part
    for key, put, wanted in _PARTS:
        raw = get(key, absent)
        put(facts, part(raw, wanted) if isinstance(raw, Mapping) else value(raw))
    return facts


_SHARED_STATUS = ("summary", "health", "issues", "action")
"""Status fields besides `gpus` whose values repeat across nodes. Not `conditions`, `agent`, `straggler`:
every node has its own times and scores there, so sharing them would only cost a table entry."""


def compact_status(raw: Mapping[str, Any], shared: SharedValues = SHARED) -> dict[str, Any]:
    """A GPUNode's `status` as the cache keeps it, but for its conditions (`kept_conditions`: they take
    over the version before's): its GPUs compacted (`compact_gpu`), the agent block's values shared (its
    heartbeat time is its own in every report), and the fields whose values repeat across nodes
    (`_SHARED_STATUS`) shared whole. One call per status, the table checked once (issue 46)."""
    status = dict(raw)
    shared.check()
    gpus = status.get("gpus")
    # A list of compacted GPUs (a replay's cluster keeps them so, read-only) is its own compaction.
    if isinstance(gpus, list) and not all(type(gpu) is gpu_facts.GPUFacts for gpu in gpus):
        status["gpus"] = [compact_gpu(gpu, shared) if isinstance(gpu, Mapping) else gpu for gpu in gpus]
    agent = status.get("agent")
    if type(agent) is dict:
        status["agent"] = shared.each(agent)
    for key in _SHARED_STATUS:
        if key in status:
            status[key] = shared.value(status[key])
    return status


_COMPACTIONS: dict[str, tuple[Any, Any]] = {
    **{key: (put, None) for key, put in _WHOLE},
    **{key: (put, False) for key, put in _UNIQUE},
    **{key: (put, wanted) for key, put, wanted in _PARTS},
}
"""Per kept field, its slot's setter and how `compact_gpu` keeps it (shared whole, as is, or a part)."""


def recompact_gpu(
    previous: gpu_facts.GPUFacts,
    changed: Mapping[str, Any],
    kept: Mapping[str, Any] | None = None,
    shared: SharedValues = SHARED,
) -> gpu_facts.GPUFacts:
    """`compact_gpu` of a GPU whose reported facts are `previous`'s but for `changed` (each changed
    field's new value, `gpu_facts.ABSENT` if removed): the kept slots copied, the changed ones kept
    as `compact_gpu` keeps them. For a caller that knows what changed (a replay applying a trace's
    patches, where a healthy GPU's report moves two or three of its seventeen kept fields).
    `kept`: changed fields whose new values are given as compaction keeps them already (a nested
    part whose changed values the caller shared), set as they are."""
    fields = [key for key in changed if key in _COMPACTIONS]
    if not fields and not kept:
        return previous
    facts = gpu_facts.copy_of(previous)
    for key in fields:
        put, how = _COMPACTIONS[key]
        raw = changed[key]
        if how is False:
            put(facts, raw)
        elif how is not None and isinstance(raw, Mapping):
            put(facts, shared.part(raw, how))
        elif type(raw) is int and -5 <= raw <= 256:  # compact_gpu's inline case: CPython's own copy
            put(facts, raw)
        else:
            put(facts, shared.value(raw))  # what compact_gpu's inline cases do for the common types
    if kept:
        for key, value in kept.items():
            _COMPACTIONS[key][0](facts, value)
    return facts
