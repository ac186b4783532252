"""Repair (`spec.repair`): the pure part of the cycle drained → step → effect → validation → return or retire.

No I/O: `repairing` reads the cluster (the Node's repair annotation, the step's Job, the agent's report,
GPUNode `status.repairs[]`) into the plain values here, asks what comes next, and does it.

The state of a cycle in progress lives on the Node (`keys.REPAIR_ANNOTATION`, JSON), written before a
step's Job is created; with the deterministic Job name (`job_name`) a restarted or new leader finds the
Job it would create and adopts it instead of starting a second one.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_operator.decisions import model, repair_state, step_kinds, times

# The state (`repair_state`) named again here: every caller says `repair.State`, `repair.parse`, ...
HISTORY_LIMIT = repair_state.HISTORY_LIMIT
JOB_PREFIX = repair_state.JOB_PREFIX
MAX_NAME = repair_state.MAX_NAME
NODE_PART = repair_state.NODE_PART
PREVIOUS_MESSAGE = repair_state.PREVIOUS_MESSAGE
REBOOT_GRACE_SECONDS = repair_state.REBOOT_GRACE_SECONDS
Done = repair_state.Done
Phase = repair_state.Phase
Refused = repair_state.Refused
RepairAction = repair_state.RepairAction
Result = repair_state.Result
State = repair_state.State
belongs = repair_state.belongs
cycle_stamp = repair_state.cycle_stamp
first_step = repair_state.first_step
job_name = repair_state.job_name
next_step = repair_state.next_step
parse = repair_state.parse
render = repair_state.render
reset_together = repair_state.reset_together
token_digest = repair_state.token_digest
FAULT_CHARS = repair_state.FAULT_CHARS


# --- may a cycle start -------------------------------------------------------------------------------


CYCLES_KEPT: Final = 10
"""The cycle starts a Node keeps (`keys.REPAIR_CYCLES_ANNOTATION`): the CRD's largest maxAttempts. Whether
maxAttempts cycles began within a window ending now is decided by the newest maxAttempts starts alone."""

Cycles = tuple[tuple[int, datetime.datetime], ...]
"""(cycle number, when it began), oldest first."""


def parse_cycles(text: str | None) -> Cycles:
    """The Node's recent cycle starts; unreadable items are skipped (a hand edit counts for nothing)."""
    found: list[tuple[int, datetime.datetime]] = []
    for item in (text or "").split(","):
        number, _, stamp = item.strip().partition("@")
        when = times.parse(stamp) if stamp else None
        if number.isdigit() and when is not None:
            found.append((int(number), when))
    return tuple(sorted(found, key=lambda c: (c[1], c[0])))


def with_cycle(cycles: Cycles, number: int, started: datetime.datetime) -> str:
    """The annotation's value with one more cycle start, the last CYCLES_KEPT kept: bounded however long
    the node lives."""
    kept = sorted([*(c for c in cycles if c[0] != number), (number, started)], key=lambda c: (c[1], c[0]))
    return ",".join(f"{n}@{times.render(w)}" for n, w in kept[-CYCLES_KEPT:])


def without_cycle(cycles: Cycles, number: int) -> str | None:
    """The annotation's value with the cycle's start taken back (a cycle whose first Job the Job API
    refused never began); None: no cycle left, remove the annotation."""
    kept = [c for c in cycles if c[0] != number]
    return ",".join(f"{n}@{times.render(w)}" for n, w in kept) or None


def cycles_in_window(
    history: Sequence[Mapping[str, Any]],
    now: datetime.datetime,
    window_seconds: float,
    started: Cycles = (),
) -> int:
    """Repair cycles started within the window: distinct cycle numbers of the Node's recorded starts and of
    history entries dated in it (the history alone holds 20 entries, 4-6 a cycle: never more than 5)."""
    since = now - datetime.timedelta(seconds=window_seconds)
    cycles: set[int] = {number for number, when in started if when >= since}
    for entry in history:
        when = times.parse(entry.get("time"))
        cycle = entry.get("cycle")
        if when is None or not isinstance(cycle, int) or entry.get("result") == Result.RETIRED:
            continue
        if when >= since:
            cycles.add(cycle)
    return len(cycles)


def next_cycle(history: Sequence[Mapping[str, Any]], started: Cycles = ()) -> int:
    """One more than the highest cycle in the history or the recorded starts (1 for the first)."""
    known = [e.get("cycle") for e in history] + [number for number, _ in started]
    return max((c for c in known if isinstance(c, int) and not isinstance(c, bool)), default=0) + 1


class Start(enum.StrEnum):
    GO = "go"
    WAIT = "wait"
    """maxConcurrent repairs are in progress: the node waits, drained."""
    RETIRE = "retire"
    """maxAttempts cycles within the window already: one more fault retires the node."""
    NOTHING = "nothing"
    """No step applies (only ResetGPU steps, no faulty GPU known): retire too, said differently."""


def may_start(
    spec: model.RepairSpec,
    *,
    history: Sequence[Mapping[str, Any]],
    in_progress: int,
    limit: int,
    gpus: Sequence[str],
    now: datetime.datetime,
    started: Cycles = (),
) -> Start:
    """Whether a new cycle may start on a drained faulty node (the caller checked everything else)."""
    if cycles_in_window(history, now, spec.attempt_window_seconds, started) >= spec.max_attempts:
        return Start.RETIRE
    if next_step(spec, 0, gpus) is None:
        return Start.NOTHING
    if in_progress >= limit:
        return Start.WAIT
    return Start.GO


WAIT_NAMED: Final = 10
"""A maxConcurrent wait names at most this many of the nodes holding it."""


def wait_words(limit: int, holders: Sequence[str]) -> str:
    """`repair maxConcurrent 1 reached, held by node gpu-b`: why a drained node's repair waits."""
    named = sorted(holders)
    more = f" and {len(named) - WAIT_NAMED} more" if len(named) > WAIT_NAMED else ""
    noun = "node" if len(named) == 1 else "nodes"
    return f"repair maxConcurrent {limit} reached, held by {noun} {', '.join(named[:WAIT_NAMED])}{more}"


# --- observing a Job and the agent's report ---------------------------------------------------------


class JobPhase(enum.StrEnum):
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MISSING = "missing"


@dataclasses.dataclass(frozen=True)
class JobView:
    phase: JobPhase
    finished_at: datetime.datetime | None = None
    message: str = ""


def job_view(body: Mapping[str, Any] | None) -> JobView:
    """A Job as the decision needs it: running, succeeded or failed (and when, why), or gone."""
    if body is None:
        return JobView(JobPhase.MISSING, message="the Job is gone")
    status = body.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        when = times.parse(condition.get("lastTransitionTime"))
        if kind == "Complete":
            return JobView(JobPhase.SUCCEEDED, times.parse(status.get("completionTime")) or when)
        if kind == "Failed":
            why = condition.get("message") or condition.get("reason") or "the Job failed"
            return JobView(JobPhase.FAILED, when, str(why))
    return JobView(JobPhase.ACTIVE)


@dataclasses.dataclass(frozen=True)
class Report:
    """The agent's latest report as far as repair reads it."""

    seen_at: datetime.datetime | None
    """When the operator saw it (its clock)."""
    boot_id: str | None
    fault_gone: bool
    """Its verdict no longer wants Cordon/Drain (and is not Unknown)."""
    judged: bool = True
    """False while a Node condition a rule names is not yet written since the boot: wait (bounded)."""


class Outcome(enum.StrEnum):
    WAIT = "wait"
    EFFECT = "effect"
    """The step worked: validate (or return the node)."""
    FAILED = "failed"
    """The step failed (`Transition.result` says how): the next step, or retire."""
    PASSED = "passed"
    """The validation passed: the node returns to service."""


@dataclasses.dataclass(frozen=True)
class Transition:
    outcome: Outcome
    result: Result | None = None
    message: str = ""


WAIT: Final = Transition(Outcome.WAIT)


def observe_step(
    state: State,
    step: model.RepairStep,
    job: JobView,
    report: Report,
    now: datetime.datetime,
    *,
    finished_seen: datetime.datetime | None = None,
) -> Transition:
    """What a running step's Job and the agent's report mean now.

    Every time compared is the operator's own clock: `report.seen_at`, `state.since`, and
    `finished_seen`, when this process first saw the Job finished (None: not yet). The Job's
    `completionTime` is another machine's clock (whole seconds): a report judged against it with the
    operator's clock ahead could be one made while the reset still ran, and its fault a false NoEffect.
    A report first seen before the operator saw the Job finished cannot prove NoEffect (it may predate
    the reset), but one seen after the step began that no longer shows the fault, of a Job that then
    succeeded, is the step's effect: the agent writes a cleared fault at once, usually while the Job's
    pod is still ending, and its next report may be a heartbeat (5 minutes) away.
    """
    reboot = step_kinds.of(step.action).effect is step_kinds.Effect.NEW_BOOT
    rebooted = (
        reboot
        and report.boot_id is not None
        and report.boot_id != state.boot_id
        and report.seen_at is not None
        and report.seen_at > state.since
    )
    if rebooted and not report.judged:  # back, but another tool has not written its condition again yet
        if times.seconds_between(state.since, now) >= step.timeout_seconds:
            return Transition(
                Outcome.FAILED,
                Result.TIMED_OUT,
                f"the node rebooted (bootId {report.boot_id}) but no Node condition written since the boot "
                f"within {step.timeout_seconds:g}s",
            )
        return WAIT
    if rebooted:  # the node came back: the Job's pod died with it, its outcome does not matter
        if report.fault_gone:
            return Transition(
                Outcome.EFFECT, Result.SUCCEEDED, f"the node rebooted (bootId {report.boot_id})"
            )
        return Transition(
            Outcome.FAILED,
            Result.NO_EFFECT,
            f"the node rebooted (bootId {report.boot_id}) but the fault stays",
        )
    if job.phase is JobPhase.FAILED and not reboot:
        return Transition(Outcome.FAILED, Result.FAILED, f"Job {state.job} failed: {job.message}")
    if job.phase is JobPhase.MISSING:
        return Transition(Outcome.FAILED, Result.FAILED, f"Job {state.job} is gone (deleted by someone else)")
    if (
        job.phase is JobPhase.SUCCEEDED
        and not reboot
        and report.fault_gone
        and report.seen_at is not None
        and report.seen_at > state.since
    ):
        return Transition(Outcome.EFFECT, Result.SUCCEEDED, "the agent reports the fault gone")
    if (
        job.phase is JobPhase.SUCCEEDED
        and not reboot
        and finished_seen is not None
        and report.seen_at is not None
        and report.seen_at > finished_seen
    ):
        if report.fault_gone:
            return Transition(Outcome.EFFECT, Result.SUCCEEDED, "the agent reports the fault gone")
        return Transition(
            Outcome.FAILED, Result.NO_EFFECT, "the Job succeeded but the agent still reports the fault"
        )
    if (
        job.phase is JobPhase.FAILED
        and reboot
        and report.seen_at is not None
        and finished_seen is not None
        and report.seen_at - finished_seen >= datetime.timedelta(seconds=REBOOT_GRACE_SECONDS)
    ):  # a reboot's pod may die failed with its node; a report well after that, same boot, says it did not
        return Transition(
            Outcome.FAILED,
            Result.FAILED,
            f"Job {state.job} failed and the node did not reboot: {job.message}",
        )
    if times.seconds_between(state.since, now) >= step.timeout_seconds:
        return Transition(
            Outcome.FAILED,
            Result.TIMED_OUT,
            f"no effect seen within {step.timeout_seconds:g}s"
            + (" (no new bootId)" if reboot else " (no agent report without the fault after the Job)"),
        )
    return WAIT


def observe_validation(
    state: State, timeout_seconds: float, job: JobView, now: datetime.datetime
) -> Transition:
    """What the running validation Job means now."""
    if job.phase is JobPhase.SUCCEEDED:
        return Transition(Outcome.PASSED, Result.VALIDATION_PASSED, f"validation Job {state.job} succeeded")
    if job.phase is JobPhase.FAILED:
        return Transition(
            Outcome.FAILED, Result.VALIDATION_FAILED, f"validation Job {state.job} failed: {job.message}"
        )
    if job.phase is JobPhase.MISSING:
        return Transition(
            Outcome.FAILED,
            Result.VALIDATION_FAILED,
            f"validation Job {state.job} is gone (deleted by someone else)",
        )
    if times.seconds_between(state.since, now) >= timeout_seconds:
        return Transition(
            Outcome.FAILED, Result.VALIDATION_FAILED, f"validation did not finish within {timeout_seconds:g}s"
        )
    return WAIT


# --- history -----------------------------------------------------------------------------------------


def entry(
    now: datetime.datetime,
    *,
    cycle: int,
    step: str,
    action: str,
    gpus: Sequence[str],
    result: Result,
    message: str,
    fault: str = "",
) -> dict[str, Any]:
    """One `status.repairs[]` item; `fault` (the issues that began the cycle) on a cycle's step Started
    and on Retired."""
    item: dict[str, Any] = {
        "time": times.render(now),
        "cycle": cycle,
        "step": step,
        "action": action,
        "gpus": list(gpus)[:64],
        "result": result.value,
        "message": message[:4096],
    }
    if fault:
        item["fault"] = fault[:FAULT_CHARS]
    return item


def recorded(history: Sequence[Mapping[str, Any]], state: State) -> bool:
    """Whether the history holds the entry of how the phase before `state` ended."""
    done = state.previous
    if done is None:
        return True
    stamp = times.render(state.since)
    return any(
        e.get("cycle") == state.cycle
        and e.get("result") == done.result.value
        and e.get("action") == done.action
        and e.get("time") == stamp
        for e in history
    )


def with_entry(history: Sequence[Mapping[str, Any]], item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The history with `item` appended, the last HISTORY_LIMIT kept."""
    return [dict(e) for e in [*history, item]][-HISTORY_LIMIT:]


def gpu_words(indexed: Sequence[tuple[int | None, str]]) -> str:
    """`GPU 3 (GPU-…)`, `GPUs 1 (GPU-…), 3 (GPU-…)`; `all GPUs` when none is named."""
    if not indexed:
        return "all GPUs"
    named = ", ".join(f"{i} ({u})" if i is not None else u for i, u in indexed)
    return f"GPU {named}" if len(indexed) == 1 else f"GPUs {named}"
