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
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, step_kinds, times

RepairAction = vocabulary.RepairAction
Result = vocabulary.RepairResult

HISTORY_LIMIT: Final = 20
"""GPUNode `status.repairs[]` keeps the last this many entries."""
JOB_PREFIX: Final = "gpuhealth-repair-"
NODE_PART: Final = 28
MAX_NAME: Final = 63
REBOOT_GRACE_SECONDS: Final = 30.0
"""A failed RebootNode Job fails its step once the agent reports this long after it without a new boot."""


class Phase(enum.StrEnum):
    STEP = "step"
    VALIDATE = "validate"


FAULT_CHARS: Final = 1024
"""A history entry's `fault` is at most this long (the CRD's maxLength)."""
PREVIOUS_MESSAGE: Final = 256
"""The previous phase's message is kept this long on the Node (the history keeps 4096)."""


@dataclasses.dataclass(frozen=True)
class Refused:
    """A policy's repair Job create refused by the Job API (403/404, `repair_permission`): the API
    server's words, when it was last tried, whether it was said already."""

    message: str
    at: datetime.datetime
    said: bool


@dataclasses.dataclass(frozen=True)
class Done:
    """How the phase before a state ended (its history entry, dated the state's `since`), written on the
    Node with the state: a leader that dies before its status write leaves it for the next one to record."""

    step: str
    action: str
    result: Result
    message: str


@dataclasses.dataclass(frozen=True)
class State:
    """The cycle in progress on a node (the Node annotation)."""

    policy: str
    cycle: int
    step: int
    """Index into `spec.repair.steps` of the step running, or validated (phase validate)."""
    phase: Phase
    since: datetime.datetime
    """When this phase began (its Job's creation): its timeout counts from here."""
    gpus: tuple[str, ...]
    boot_id: str | None
    """The agent's bootId when the step began: a RebootNode's effect is another one."""
    job: str
    started: datetime.datetime | None = None
    """When the cycle began (its first step), for the cycle's duration."""
    token: str | None = None
    """SHA-256 (hex) of the token its Job carries (`keys.REPAIR_TOKEN_ANNOTATION`); None: written by an
    operator before tokens, whose Job is known by its cycle stamp alone."""
    previous: Done | None = None
    """How this cycle's phase before this one ended (None: this is its first)."""
    fault: str = ""
    """The issues that began the cycle (comma-joined conditions), for its history."""


def parse(text: str | None) -> State | None:
    """The annotation's state; None when absent or unreadable (a hand-edited value is not trusted)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        since = times.parse(raw["since"])
        if since is None or not isinstance(raw["policy"], str) or not isinstance(raw["job"], str):
            return None
        cycle, step = raw["cycle"], raw["step"]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (cycle, step)):
            return None
        gpus = raw.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            return None
        boot_id = raw.get("bootId")
        token = raw.get("jobToken")
        fault = raw.get("fault")
        return State(
            fault=fault[:FAULT_CHARS] if isinstance(fault, str) else "",
            previous=_done(raw.get("previous")),
            policy=raw["policy"],
            cycle=cycle,
            step=step,
            phase=Phase(raw["phase"]),
            since=since,
            gpus=tuple(gpus),
            boot_id=boot_id if isinstance(boot_id, str) and boot_id else None,
            job=raw["job"],
            started=times.parse(raw.get("started")) or since,
            token=token if isinstance(token, str) and token else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def _done(raw: object) -> Done | None:
    if not isinstance(raw, Mapping):
        return None
    step, action, message = (raw.get(k) for k in ("step", "action", "message"))
    if not all(isinstance(v, str) for v in (step, action, message)):
        return None
    try:
        result = Result(str(raw.get("result")))
    except ValueError:
        return None
    return Done(str(step), str(action), result, str(message))


def render(state: State) -> str:
    body: dict[str, Any] = {
        "policy": state.policy,
        "cycle": state.cycle,
        "step": state.step,
        "phase": state.phase.value,
        "since": times.render(state.since),
        "gpus": list(state.gpus),
        "bootId": state.boot_id or "",
        "job": state.job,
        "started": times.render(state.started or state.since),
    }
    if state.token:
        body["jobToken"] = state.token
    if state.fault:
        body["fault"] = state.fault[:FAULT_CHARS]
    if state.previous is not None:
        done = state.previous
        body["previous"] = {
            "step": done.step,
            "action": done.action,
            "result": done.result.value,
            "message": done.message[:PREVIOUS_MESSAGE],
        }
    return json.dumps(body, separators=(",", ":"))


def job_name(node: str, cycle: int, step: int, *, validation: bool = False) -> str:
    """`gpuhealth-repair-<node[:28]>-<sha1(node)[:6]>-c<cycle>-<step|v<step>>`: deterministic, <= 63.

    The node part is lowercased with dots as dashes (a Job name is a label value of its pods); the hash
    keeps two long node names with the same first 28 characters apart.
    """
    digest = hashlib.sha1(node.encode(), usedforsecurity=False).hexdigest()[:6]
    tail = f"-{digest}-c{cycle}-{'v' if validation else ''}{step}"
    room = MAX_NAME - len(JOB_PREFIX) - len(tail)
    part = node.lower().replace(".", "-")[: max(0, min(NODE_PART, room))].strip("-")
    name = f"{JOB_PREFIX}{part}{tail}" if part else f"{JOB_PREFIX.rstrip('-')}{tail}"
    return name[:MAX_NAME]


def cycle_stamp(state: State) -> str:
    """The cycle's start as its Jobs carry it (`keys.REPAIR_CYCLE_STARTED_ANNOTATION`)."""
    return times.render(state.started or state.since)


def token_digest(token: str) -> str:
    """What the Node's repair annotation keeps of a Job's token: its SHA-256, which cannot be turned back."""
    return hashlib.sha256(token.encode()).hexdigest()


def belongs(job: Mapping[str, Any], state: State) -> bool:
    """Whether a Job of the state's name is this operator's Job of this state: it carries the cycle's start
    stamp and the token whose hash the state holds. A Job of the same name from an earlier life of the
    node (a recreated GPUNode restarts cycle numbers) is not, nor one that only copies the name and the
    stamp (both readable on the Node): anyone who can create Jobs in the namespace can make one of
    those, but not one with the token, which exists only in our Job. A state written before tokens
    (`token` None) knows its Job by the stamp alone."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stamped = annotations.get(keys.REPAIR_CYCLE_STARTED_ANNOTATION)
    if not isinstance(stamped, str) or times.parse(stamped) != (state.started or state.since):
        return False
    if state.token is None:
        return True
    token = annotations.get(keys.REPAIR_TOKEN_ANNOTATION)
    return isinstance(token, str) and hmac.compare_digest(token_digest(token), state.token)


def next_step(spec: model.RepairSpec, start: int, gpus: Sequence[str]) -> int | None:
    """The first step at or after `start` that applies: ResetGPU only with faulty GPU UUIDs known."""
    for index in range(start, len(spec.steps)):
        if step_kinds.of(spec.steps[index].action).targets is step_kinds.Targets.FAULTY_GPUS and not gpus:
            continue
        return index
    return None


def first_step(spec: model.RepairSpec, gpus: Sequence[str], recovery: Iterable[str]) -> int | None:
    """The step a cycle starts at: the policy's first RebootNode step when any GPU's driver asks for a
    reboot (`recovery`: the GPUs' `recoveryAction`s), its first applicable ResetGPU step when one asks
    for a reset, else (no request, or no such step) the first step that applies. The steps after it
    follow in the policy's order."""
    wanted = step_kinds.asked_for(set(recovery))
    if wanted is not None:
        for index in range(len(spec.steps)):
            if spec.steps[index].action is wanted and next_step(spec, index, gpus) == index:
                return index
    return next_step(spec, 0, gpus)


def reset_together(
    faulty: Sequence[tuple[int | None, str]], listed: Sequence[Mapping[str, Any]]
) -> list[tuple[int | None, str]]:
    """The (index, UUID) of the GPUs a ResetGPU step resets, by index.

    On an NVSwitch board (HGX) a GPU cannot be reset alone: the driver resets the board's GPUs, with its
    NVSwitches, together. A faulty GPU that reports fabric info (`gpus[].fabric`: the agent reports it only
    where NVML supports it, NVSwitch and NVL systems) is on such a board, and every listed GPU with fabric
    info of the same clique (`fabric.cliqueId`; where either lacks one, the node's fabric as a whole) joins
    the reset. Elsewhere (PCIe GPUs, or a faulty GPU the listing lacks) the faulty GPUs alone."""
    by_uuid = {g.get("uuid"): g for g in listed if isinstance(g.get("uuid"), str)}
    chosen = {uuid: index for index, uuid in faulty}
    for _, uuid in faulty:
        fabric = (by_uuid.get(uuid) or {}).get("fabric")
        if not isinstance(fabric, Mapping):
            continue
        clique = fabric.get("cliqueId")
        for other in listed:
            theirs = other.get("fabric")
            if not isinstance(theirs, Mapping) or not isinstance(other.get("uuid"), str):
                continue
            other_clique = theirs.get("cliqueId")
            if clique is None or other_clique is None or other_clique == clique:
                index = other.get("index")
                chosen.setdefault(other["uuid"], index if isinstance(index, int) else None)
    return sorted(((i, u) for u, i in chosen.items()), key=lambda g: (g[0] is None, g[0] or 0, g[1]))


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
