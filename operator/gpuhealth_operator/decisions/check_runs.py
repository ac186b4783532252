"""Active checks' run history (GPUNode `status.checks[]`) and the condition it holds: no I/O.

Apart from `checks` (the plan and the judging of one run) so that `signals` can judge the condition
ActiveCheckFailed from a node's stored history without the plan's imports: the history is in the cluster,
so the condition survives an operator restart.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import times

Result = vocabulary.CheckResult

STATUS_FIELD: Final = "checks"
"""GPUNode `status.checks[]`: the operator's, kept in every status write (server-side apply)."""
HISTORY_LIMIT: Final = 20
"""GPUNode `status.checks[]` keeps the last this many runs (as `status.repairs[]` does)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished run of a check on a node (an entry of GPUNode `status.checks[]`)."""

    check: str
    time: datetime.datetime
    result: vocabulary.CheckResult
    figures: Mapping[str, float] = dataclasses.field(default_factory=dict)
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Failing:
    """ActiveCheckFailed holds: `check` failed at `since` and has not passed since."""

    check: str
    since: datetime.datetime


def runs_of(entries: object) -> tuple[Run, ...]:
    """The runs of a stored `status.checks[]`; an entry without a name, time or known result is left out
    (missing data is not a fault)."""
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return ()
    runs: list[Run] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        name, stamp, result = entry.get("name"), times.parse(entry.get("time")), entry.get("result")
        if not isinstance(name, str) or not name or stamp is None or result not in set(Result):
            continue
        raw = entry.get("figures")
        figures = (
            {
                str(k): float(v)
                for k, v in raw.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            if isinstance(raw, Mapping)
            else {}
        )
        message = entry.get("message")
        runs.append(Run(name, stamp, Result(result), figures, message if isinstance(message, str) else ""))
    return tuple(sorted(runs, key=lambda r: r.time))


VALIDATED: Final = vocabulary.RepairResult.VALIDATION_PASSED.value
"""A GPUNode `status.repairs[]` result that clears every check failed before it (`check_failed`)."""


def validations_of(entries: object) -> tuple[datetime.datetime, ...]:
    """When the node's repair validations passed (GPUNode `status.repairs[]`, result ValidationPassed);
    an entry without a time is left out (missing data clears nothing)."""
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return ()
    found = (
        times.parse(e.get("time")) for e in entries if isinstance(e, Mapping) and e.get("result") == VALIDATED
    )
    return tuple(sorted(t for t in found if t is not None))


def check_failed(runs: Sequence[Run], validated: Sequence[datetime.datetime] = ()) -> Failing | None:
    """ActiveCheckFailed: true from a failed run of a check until a later run of that check passes, or a
    later repair validation passes (`validated`, `validations_of`).

    A validation clears it because it is the node's check too (DCGM diag -r 2 on every GPU, at least as
    thorough as a quick check), and the only one that can: a failure drains the node, and no check runs
    on a cordoned node. A failed run after the validation sets it again.
    Preempted and TimedOut runs change nothing: a preemption is the job's right, and a timeout says the
    check did not finish (an image pull, a slow start), not that a GPU failed; missing data is not a fault.
    The earliest failing check is named."""
    failing: list[Failing] = []
    for name in sorted({r.check for r in runs}):
        since: datetime.datetime | None = None
        for item in sorted((r for r in runs if r.check == name), key=lambda r: r.time):
            if since is not None and any(since < v <= item.time for v in validated):
                since = None  # a validation passed between the failure and this run
            if item.result is Result.PASSED:
                since = None
            elif item.result is Result.FAILED and since is None:
                since = item.time
        if since is not None and any(v > since for v in validated):
            since = None  # a validation passed after the last failure
        if since is not None:
            failing.append(Failing(check=name, since=since))
    return min(failing, key=lambda f: (f.since, f.check)) if failing else None


def active_check(checks: object, repairs: object) -> tuple[Failing | None, bool]:
    """ActiveCheckFailed from a node's stored `status.checks[]` and `status.repairs[]`, in one call (it is
    judged from every report, issue 46): `check_failed` of their runs and validations; and, when that
    is None, whether a validation is what cleared it (a check failed and did not pass since)."""
    runs = runs_of(checks)
    failing = check_failed(runs, validations_of(repairs))
    return failing, failing is None and check_failed(runs) is not None


def with_run(history: Sequence[Run], item: Run) -> tuple[Run, ...]:
    """The history with one more run, oldest dropped past HISTORY_LIMIT, in time order."""
    return tuple(sorted((*history, item), key=lambda r: r.time)[-HISTORY_LIMIT:])
