"""Hysteresis: turning a run of raw signals into a condition that does not flap.

A condition sets only after its signal held continuously for `for_seconds`
(`observed_since` remembers the first sighting in the episode) and clears
only after the signal was absent continuously for `clear_seconds`
(`recovering_since` remembers the first absence). A single sample the other
way restarts the respective clock, so a temperature oscillating around the
threshold neither sets nor clears the condition. An unknown signal (stale
agent, missing facts) changes no condition's status: missing data is neither
fault nor cure; but it ends a pending episode, since forSeconds of evidence
must be forSeconds seen (`_unknown`).

Every clock here is the operator's: `observed_since` starts at the receipt of
the first report showing the evidence (or a `Signal.observed_at` of the
operator's own clock), never at the agent's `observedTime`, so an agent whose
clock runs minutes slow cannot turn one sample into forSeconds of evidence.

Both timestamps are stored in GPUNode `status.conditions[]` (observedSince,
recoveringSince) through `to_status`/`from_status`, so an operator restart
resumes every clock where it stood.

On a False condition `recovering_since` keeps meaning "evidence absent since"
when a pending episode (signal seen, not yet for `for_seconds`) ended; the
verdict's recovery clock reads it (see `healthy_since`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, text, times

TRUE: Final = "True"
FALSE: Final = "False"
UNKNOWN: Final = "Unknown"
_STATUSES: Final = frozenset({TRUE, FALSE, UNKNOWN})
_CONDITIONS: Final = frozenset(c.value for c in vocabulary.Condition)

# Condition reasons (CamelCase, as Kubernetes conditions expect).
DETECTED: Final = "Detected"
"""True: the evidence held for forSeconds."""
RECOVERING: Final = "Recovering"
"""True still: the evidence is gone, waiting for clear_seconds."""
PENDING: Final = "Pending"
"""Not True yet: the evidence is present, waiting for forSeconds."""
NOT_DETECTED: Final = "NotDetected"
"""False: no evidence."""
NO_DATA: Final = "NoData"
"""Unknown: the facts cannot tell (stale agent, GPUs not reported)."""


def advance(
    previous: model.ConditionState | None,
    signal: model.Signal,
    for_seconds: float,
    clear_seconds: float,
    now: datetime.datetime,
) -> model.ConditionState:
    """The condition's state after seeing `signal` at `now`; its message escaped and cut to size."""
    return _bounded([_next(previous, signal, (for_seconds, clear_seconds), now)])[0]


def advance_all(
    previous: Mapping[vocabulary.ConditionKey, model.ConditionState],
    signals: Mapping[vocabulary.ConditionKey, model.Signal],
    clocks: Iterable[tuple[vocabulary.ConditionKey, float, float]],
    now: datetime.datetime,
) -> dict[vocabulary.ConditionKey, model.ConditionState]:
    """`advance` of each condition of `clocks` (with its forSeconds and clear seconds), in their order,
    from its state in `previous` on its signal in `signals`: a verdict's every condition in one call, and
    their messages bounded in one, where a call per condition and one more per message crossed modules
    sixty times a judgement (issue 46)."""
    states = {
        condition: _next(previous.get(condition), signals[condition], (for_seconds, clear_seconds), now)
        for condition, for_seconds, clear_seconds in clocks
    }
    return dict(zip(states, _bounded(list(states.values())), strict=True))


def _next(
    previous: model.ConditionState | None,
    signal: model.Signal,
    seconds: tuple[float, float],
    now: datetime.datetime,
) -> model.ConditionState:
    """`advance` but for bounding the message; `seconds`: forSeconds and clear seconds."""
    if signal.present is None:
        return _unknown(previous, signal, now)
    if signal.present:
        return _present(previous, signal, seconds[0], now)
    return _absent(previous, signal, seconds[1], now)


def _bounded(states: list[model.ConditionState]) -> list[model.ConditionState]:
    """Each state with its message escaped and cut to size: the message quotes agent-supplied strings,
    bounded here, every writer of it is safe."""
    messages = text.bounded_each([state.message for state in states], text.CONDITION_MESSAGE_MAX)
    return [
        state if message == state.message else dataclasses.replace(state, message=message)
        for state, message in zip(states, messages, strict=True)
    ]


def _unknown(
    previous: model.ConditionState | None, signal: model.Signal, now: datetime.datetime
) -> model.ConditionState:
    """The facts cannot tell: a condition keeps its status, but a pending episode ends (issue 47).

    forSeconds means the evidence was seen throughout: a time nobody could see it (a stale agent, an
    unreadable fact) breaks the run, so a stale agent's old report, judged again on its return, cannot
    bring the rule due; the next report that shows the evidence starts the window again. As an ended
    episode does, it restarts the recovery clock (`recovering_since`).
    """
    if previous is None:
        return model.ConditionState(signal.condition, UNKNOWN, NO_DATA, signal.message, now)
    if previous.status == TRUE or previous.observed_since is None:
        return previous
    return model.ConditionState(
        signal.condition,
        previous.status,
        NO_DATA,
        signal.message,
        previous.last_transition_time,
        recovering_since=now,
    )


def _present(
    previous: model.ConditionState | None, signal: model.Signal, for_seconds: float, now: datetime.datetime
) -> model.ConditionState:
    if previous is not None and previous.status == TRUE:
        if _unchanged(previous, signal, DETECTED) and previous.recovering_since is None:
            return previous  # held, as it was: the common case of a fault's every later report
        return model.ConditionState(
            signal.condition,
            TRUE,
            DETECTED,
            signal.message,
            previous.last_transition_time,
            observed_since=previous.observed_since,
        )
    since = previous.observed_since if previous is not None else None
    if since is None:
        # From when the operator received the evidence (`now`, the report's receipt), or since when it
        # holds by the operator's clock (`observed_at`): never the agent's clock (issue 24).
        since = min(signal.observed_at or now, now)
    # Subtracted here, not through `times.seconds_between`: every present signal of every judgement asks.
    if (now - since).total_seconds() >= for_seconds:
        return model.ConditionState(
            signal.condition, TRUE, DETECTED, signal.message, now, observed_since=since
        )
    return model.ConditionState(
        signal.condition,
        previous.status if previous is not None else FALSE,
        PENDING,
        f"{signal.message} (since {times.render(since)}, needs {for_seconds:g}s)",
        previous.last_transition_time if previous is not None else now,
        observed_since=since,
    )


def _absent(
    previous: model.ConditionState | None, signal: model.Signal, clear_seconds: float, now: datetime.datetime
) -> model.ConditionState:
    if previous is None:
        return model.ConditionState(signal.condition, FALSE, NOT_DETECTED, signal.message, now)
    if previous.status == TRUE:
        gone_since = previous.recovering_since or now
        if (now - gone_since).total_seconds() >= clear_seconds:  # a subtraction, as in `_present`
            return model.ConditionState(
                signal.condition, FALSE, NOT_DETECTED, signal.message, now, recovering_since=gone_since
            )
        return model.ConditionState(
            signal.condition,
            TRUE,
            RECOVERING,
            f"{signal.message} since {times.render(gone_since)}, clears after {clear_seconds:g}s",
            previous.last_transition_time,
            observed_since=previous.observed_since,
            recovering_since=gone_since,
        )
    if (
        previous.status == FALSE
        and previous.observed_since is None
        and _unchanged(previous, signal, NOT_DETECTED)
    ):
        return previous  # absent, as it was: the common case of a healthy node's every report
    # A pending episode that ended restarts the recovery clock: the node was not healthy throughout.
    recovering_since = now if previous.observed_since is not None else previous.recovering_since
    transition = previous.last_transition_time if previous.status == FALSE else now
    return model.ConditionState(
        signal.condition, FALSE, NOT_DETECTED, signal.message, transition, recovering_since=recovering_since
    )


def _unchanged(previous: model.ConditionState, signal: model.Signal, reason: str) -> bool:
    """Whether the state built from `signal` would equal `previous` in these fields (the rest are
    checked by the caller): then `previous` itself is the new state, not a copy."""
    return (
        previous.reason == reason and previous.message == signal.message and previous.type == signal.condition
    )


def healthy_since(state: model.ConditionState) -> datetime.datetime | None:
    """Since when this condition has shown no evidence; None while it is True or pending."""
    if state.status == TRUE or state.observed_since is not None:
        return None
    return state.recovering_since or state.last_transition_time


def healthy_since_each(states: Iterable[model.ConditionState]) -> list[datetime.datetime | None]:
    """`healthy_since` of each state, in one call (a verdict's recovery reads every condition's)."""
    return [healthy_since(s) for s in states]


def to_status(states: Iterable[model.ConditionState], generation: int) -> list[model.ConditionRecord]:
    """`status.conditions[]` items, sorted by type so an unchanged state renders byte-identical."""
    records = []
    for state in sorted(states, key=lambda s: s.type.value):
        record = model.ConditionRecord(
            type=state.type.value,
            status=state.status,
            reason=state.reason,
            message=state.message,
            lastTransitionTime=times.render(state.last_transition_time),
            observedGeneration=generation,
        )
        if state.observed_since is not None:
            record["observedSince"] = times.render(state.observed_since)
        if state.recovering_since is not None:
            record["recoveringSince"] = times.render(state.recovering_since)
        records.append(record)
    return records


FIELDS: Final = (
    "type",
    "status",
    "reason",
    "message",
    "lastTransitionTime",
    "observedSince",
    "recoveringSince",
)
"""The keys of a `status.conditions[]` item that a condition state is parsed from, in a row's order
(`from_rows`): its times last."""
_TIMES_AT: Final = FIELDS.index("lastTransitionTime")


def from_status(items: object) -> dict[vocabulary.ConditionKey, model.ConditionState]:
    """Condition states from `status.conditions[]`; items that do not parse are dropped.

    A dropped item simply restarts that condition's hysteresis from the next
    signal, which is safe: fatal conditions re-detect at once, sustained ones
    wait their forSeconds again.
    """
    if not isinstance(items, list | tuple):
        return {}
    return from_rows([tuple(map(item.get, FIELDS)) for item in items if isinstance(item, Mapping)])


def from_rows(rows: Sequence[Sequence[object]]) -> dict[vocabulary.ConditionKey, model.ConditionState]:
    """`from_status` of the items whose values under FIELDS are `rows`, one row per Mapping item.

    For a reader that holds the items in its own form (the cache's `kept_conditions.rows`, all fifteen of
    a node's in one call): read key by key, a node's conditions were a hundred calls into that module and
    forty-five into `times`; here their times are parsed in one (issue 46).
    """
    stamps = times.parse_each([value for row in rows for value in row[_TIMES_AT:]])
    per_row = len(FIELDS) - _TIMES_AT
    states: dict[vocabulary.ConditionKey, model.ConditionState] = {}
    for index, row in enumerate(rows):
        state = _state(row, stamps[index * per_row : (index + 1) * per_row])
        if state is not None:
            states[state.type] = state
    return states


def _state(row: Sequence[object], stamps: Sequence[datetime.datetime | None]) -> model.ConditionState | None:
    """One row's state (`stamps`: its times parsed), or None when it does not parse."""
    kind, status, reason, message = row[:_TIMES_AT]
    if not isinstance(kind, str):
        return None
    condition: vocabulary.ConditionKey | None = (
        vocabulary.Condition(kind) if kind in _CONDITIONS else vocabulary.parse_node_condition(kind)
    )
    if condition is None:
        return None
    transition, observed_since, recovering_since = stamps
    if status not in _STATUSES or transition is None:
        return None
    return model.ConditionState(
        condition,
        str(status),
        reason if isinstance(reason, str) else "",
        message if isinstance(message, str) else "",
        transition,
        observed_since=observed_since,
        recovering_since=recovering_since,
    )
