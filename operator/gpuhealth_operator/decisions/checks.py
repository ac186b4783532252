"""Active checks (`spec.activeChecks`), the pure part: what to start where, how a run ended, what it said.

No I/O. The step that runs checks reads the cluster (policies, Nodes, GPUNode `status.checks[]`, the
check Jobs and their pods, the GPU pods on each node) into the plain values here and asks:

- `plan`: which (node, check) pairs start now. Only on a node that is schedulable, not in repair, not
  excluded, not in maintenance, not overridden by a human, and without a pod using GPUs for the check's
  `idleForSeconds`; never two checks on one node (a check in flight from any policy keeps the node); the
  most overdue first; never more checks in flight than a check's `maxConcurrent`, counted over the checks
  of all policies together and, for a percentage, of all those policies' selected GPU nodes together. A
  dry-run policy's check is only said (`would_start`) and takes no budget. A restarted or new leader
  lists the check Jobs that run (`InFlight`) before it plans, so it adopts them and never starts a second.
- `overdue`: the (node, check) pairs with no pass within `everySeconds`.
- `result_of`, `figures_of`, `judge_run`: a run's result from its Job and pod, the figures of its
  termination message, and the threshold's verdict on them against same-model nodes.
- `check_failed`: whether the condition ActiveCheckFailed holds, from a node's run history.

Runs are keyed by the check's name (GPUNode `status.checks[].name`): two policies that name a check
alike share its history on a node.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import check_runs, model, policies, straggler_stats, times

Result = vocabulary.CheckResult
# The history and its condition live in `check_runs` (`signals` judges the condition from it).
Run = check_runs.Run
Failing = check_runs.Failing
HISTORY_LIMIT: Final = check_runs.HISTORY_LIMIT
check_failed = check_runs.check_failed
with_run = check_runs.with_run

MESSAGE_CHARS: Final = 1024
"""A run's message is cut to this length: a termination message can be 4096 bytes of anything."""
MAX_FIGURES: Final = 16
"""Figures kept of one run (the first, in name order): each is a status field and a metric series."""
FIGURE_NAME_CHARS: Final = 63
TIMEOUT_GRACE_SECONDS: Final = 30.0
"""A run still unfinished this long after its timeout is TimedOut even without the Job's own verdict
(activeDeadlineSeconds): a Job controller that is down must not keep a check in flight forever."""
PREEMPTION_REASON: Final = "PreemptionByScheduler"
"""The reason kube-scheduler gives the pod condition DisruptionTarget of a pod it preempts
(k8s.io/api core/v1 PodReasonPreemptionByScheduler)."""
DISRUPTION_TARGET: Final = "DisruptionTarget"
POD_FAILURE_POLICY: Final = "PodFailurePolicy"
"""The Job controller's reason for condition Failed when a podFailurePolicy rule failed the Job."""
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
"""The Job controller's reason for condition Failed once activeDeadlineSeconds ran out."""


@dataclasses.dataclass(frozen=True)
class NodeState:
    """What the plan needs of one selected GPU node."""

    name: str
    idle_since: datetime.datetime | None
    """Since when no pod using GPUs has run on the node; None while one runs."""
    known_since: datetime.datetime | None = None
    """When the node joined (its GPUNode's creation): a node never checked is due from then."""
    runs: tuple[Run, ...] = ()
    schedulable: bool = True
    in_repair: bool = False
    excluded: bool = False
    maintenance: bool = False
    overridden: bool = False
    """A human made the node schedulable against our cordon, or otherwise overrode us (safety rule 1)."""

    @property
    def guarded(self) -> bool:
        """Whether no check may start here, whatever is due."""
        return not self.schedulable or self.in_repair or self.excluded or self.maintenance or self.overridden


@dataclasses.dataclass(frozen=True)
class PolicyChecks:
    """One policy's checks and the GPU nodes it selects (opted-out nodes left out or marked excluded)."""

    policy: str
    dry_run: bool
    checks: tuple[model.ActiveCheck, ...]
    nodes: frozenset[str]


@dataclasses.dataclass(frozen=True)
class InFlight:
    """A check Job that runs now (from any policy), found in the cluster."""

    node: str
    policy: str
    check: str


@dataclasses.dataclass(frozen=True, order=True)
class Start:
    """A check to start on a node (or, in `would_start`, that a dry-run policy would start)."""

    node: str
    policy: str
    check: str
    template: str
    timeout_seconds: float


@dataclasses.dataclass(frozen=True)
class Plan:
    start: tuple[Start, ...]
    """To start now, most overdue first."""
    would_start: tuple[Start, ...]
    """Due on a dry-run policy: a DryRun Event "would check", no Job."""
    waiting: tuple[Start, ...]
    """Due and allowed, but over maxConcurrent: started by a later plan, most overdue first."""


@dataclasses.dataclass(frozen=True)
class Overdue:
    node: str
    policy: str
    check: str
    since: datetime.datetime | None
    """When it became overdue (its last pass, else its node's joining, plus everySeconds); None: unknown."""


def plan(
    policy_checks: Sequence[PolicyChecks],
    nodes: Iterable[NodeState],
    in_flight: Iterable[InFlight],
    now: datetime.datetime,
) -> Plan:
    """Which checks to start now (module docstring)."""
    by_name = {n.name: n for n in nodes}
    running = list(in_flight)
    busy_nodes = {f.node for f in running}
    selected = len(set().union(*(p.nodes for p in policy_checks if not p.dry_run)) & by_name.keys())
    candidates: list[tuple[float, Start, model.ActiveCheck]] = []
    would: list[tuple[float, Start]] = []
    for entry in policy_checks:
        for check in entry.checks:
            for name in sorted(entry.nodes & by_name.keys()):
                state = by_name[name]
                due_at = _due_at(state, check)
                if state.guarded or name in busy_nodes or not _idle(state, check, now) or due_at > now:
                    continue
                start = Start(name, entry.policy, check.name, check.template, check.timeout_seconds)
                late = (now - due_at).total_seconds()
                if entry.dry_run:
                    would.append((late, start))
                else:
                    candidates.append((late, start, check))
    candidates.sort(key=lambda item: (-item[0], item[1]))
    would.sort(key=lambda item: (-item[0], item[1]))
    started: list[Start] = []
    waiting: list[Start] = []
    taken: set[str] = set()
    for _, start, check in candidates:
        if start.node in taken:
            continue  # never two checks on one node; the other check is due again on the next plan
        limit = policies.resolve_check_max_concurrent(check, selected)
        if len(running) + len(started) >= limit:
            waiting.append(start)
            continue
        started.append(start)
        taken.add(start.node)
    acting = {s.node for s in started} | busy_nodes
    said: list[Start] = []
    for _, start in would:
        if start.node not in acting and start.node not in {s.node for s in said}:
            said.append(start)
    return Plan(start=tuple(started), would_start=tuple(said), waiting=tuple(waiting))


def overdue(
    policy_checks: Sequence[PolicyChecks], nodes: Iterable[NodeState], now: datetime.datetime
) -> list[Overdue]:
    """The selected (node, check) pairs without a pass within `everySeconds`, by node, policy and check."""
    by_name = {n.name: n for n in nodes}
    found: list[Overdue] = []
    for entry in policy_checks:
        for check in entry.checks:
            for name in sorted(entry.nodes & by_name.keys()):
                state = by_name[name]
                if state.excluded:
                    continue
                passed = _last(state.runs, check.name, {Result.PASSED})
                since = passed.time if passed is not None else state.known_since
                if since is None:
                    found.append(Overdue(name, entry.policy, check.name, None))
                elif times.seconds_between(since, now) > check.every_seconds:
                    late = since + datetime.timedelta(seconds=check.every_seconds)
                    found.append(Overdue(name, entry.policy, check.name, late))
    return sorted(found, key=lambda o: (o.node, o.policy, o.check))


def overdue_nodes(found: Iterable[Overdue]) -> list[str]:
    """The nodes of `overdue`'s pairs, each once, sorted."""
    return sorted({o.node for o in found})


def _due_at(state: NodeState, check: model.ActiveCheck) -> datetime.datetime:
    """When the check is due on the node: everySeconds after its last run that ran to an end (a preempted
    run does not count: it is tried again once the node is idle), else from the node's joining."""
    last = _last(state.runs, check.name, {Result.PASSED, Result.FAILED, Result.TIMED_OUT})
    if last is not None:
        return last.time + datetime.timedelta(seconds=check.every_seconds)
    return state.known_since or datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _idle(state: NodeState, check: model.ActiveCheck, now: datetime.datetime) -> bool:
    return (
        state.idle_since is not None
        and times.seconds_between(state.idle_since, now) >= check.idle_for_seconds
    )


def _last(runs: Sequence[Run], check: str, results: set[vocabulary.CheckResult]) -> Run | None:
    matching = [r for r in runs if r.check == check and r.result in results]
    return max(matching, key=lambda r: r.time) if matching else None


# --- a run's end -------------------------------------------------------------------------------------


def result_of(
    job: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    *,
    started: datetime.datetime | None = None,
    timeout_seconds: float | None = None,
    now: datetime.datetime | None = None,
) -> vocabulary.CheckResult | None:
    """How a check's run ended, from its Job and its pod; None while it runs (or the objects say nothing).

    Preemption first: a preempted pod's container is killed, so its Job fails like a failed check, and only
    the pod's DisruptionTarget condition (reason PreemptionByScheduler) tells the two apart."""
    if _condition(pod, DISRUPTION_TARGET, reason=PREEMPTION_REASON) or _disrupted(job):
        return Result.PREEMPTED
    if _condition(job, "Failed", reason=DEADLINE_EXCEEDED):
        return Result.TIMED_OUT
    if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
        return Result.PASSED
    if _condition(job, "Failed"):
        return Result.FAILED
    phase = _status(pod).get("phase")
    if phase == "Succeeded":
        return Result.PASSED
    if phase == "Failed":
        return Result.FAILED
    deadline = None if timeout_seconds is None else timeout_seconds + TIMEOUT_GRACE_SECONDS
    if started is not None and now is not None and deadline is not None:
        return Result.TIMED_OUT if times.seconds_between(started, now) >= deadline else None
    return None


def _disrupted(job: object) -> bool:
    """The Job's podFailurePolicy failed it for its pod's DisruptionTarget condition (the check Jobs' rule,
    `ladder.check.check_jobs`): what is left of a preemption once the pod is deleted. The Job does not
    keep the condition's reason: a check evicted (a drain's) also reads as preempted, interrupted, never a
    failure of the GPUs."""
    conditions = _status(job).get("conditions")
    if not isinstance(conditions, Sequence) or isinstance(conditions, str):
        return False
    return any(
        isinstance(c, Mapping)
        and c.get("type") == "Failed"
        and c.get("status") == "True"
        and c.get("reason") == POD_FAILURE_POLICY
        and DISRUPTION_TARGET in str(c.get("message") or "")
        for c in conditions
    )


def _status(body: object) -> Mapping[str, Any]:
    status = body.get("status") if isinstance(body, Mapping) else None
    return status if isinstance(status, Mapping) else {}


def _condition(body: object, kind: str, *, reason: str | None = None) -> bool:
    conditions = _status(body).get("conditions")
    if not isinstance(conditions, Sequence) or isinstance(conditions, str):
        return False
    return any(
        isinstance(c, Mapping)
        and c.get("type") == kind
        and c.get("status") == "True"
        and (reason is None or c.get("reason") == reason)
        for c in conditions
    )


def figures_of(pod: Mapping[str, Any] | None) -> tuple[dict[str, float], str]:
    """The figures a check reported (its container's termination message, a JSON object of numbers) and
    a message: "" when the text was such an object, else the text itself (cut), or what was dropped.
    Input from a user's image: anything else is kept as words, never raised."""
    text = _termination_message(pod)
    if not text.strip():
        return {}, ""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return {}, _cut(text)
    if not isinstance(raw, Mapping):
        return {}, _cut(text)
    figures: dict[str, float] = {}
    dropped: list[str] = []
    for name in sorted(raw, key=str):
        value = raw[name]
        plain = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not (plain and isinstance(name, str) and 0 < len(name) <= FIGURE_NAME_CHARS):
            dropped.append(str(name)[:FIGURE_NAME_CHARS])
        elif len(figures) < MAX_FIGURES:
            figures[name] = float(value)
        else:
            dropped.append(name)
    if not dropped:
        return figures, ""
    if len(figures) == MAX_FIGURES:
        words = f"kept the first {MAX_FIGURES} figures; dropped {', '.join(dropped)}"
    else:
        words = f"dropped what is not a finite number: {', '.join(dropped)}"
    return figures, _cut(words) if figures else _cut(text)


def _termination_message(pod: Mapping[str, Any] | None) -> str:
    statuses = _status(pod).get("containerStatuses")
    if not isinstance(statuses, Sequence) or isinstance(statuses, str):
        return ""
    for item in statuses:
        state = item.get("state") if isinstance(item, Mapping) else None
        terminated = state.get("terminated") if isinstance(state, Mapping) else None
        message = terminated.get("message") if isinstance(terminated, Mapping) else None
        if isinstance(message, str) and message:
            return message
    return ""


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


# --- figures against peers ----------------------------------------------------------------------------


def figure_z(node: str, values: Mapping[str, float]) -> float | None:
    """The node's robust z-score of one figure among `values` (its own and its same-GPU-model peers'
    latest, by node): the stragglers' median and floored MAD; None with fewer than MIN_PEERS peers."""
    if node not in values or len(values) - 1 < straggler_stats.MIN_PEERS:
        return None
    median, scale = straggler_stats.cohort_scale(list(values.values()))
    return straggler_stats.MAD_TO_SIGMA * (values[node] - median) / scale


def below_threshold(
    figures: Mapping[str, float],
    cohort: Mapping[str, Mapping[str, float]],
    node: str,
    threshold: float,
) -> list[str]:
    """The figures of this run that lie `threshold` robust z-scores below same-model nodes, sorted.

    `cohort` maps each figure to its value by node (same GPU model; the node's own run included)."""
    low = []
    for name, value in figures.items():
        values = {**cohort.get(name, {}), node: value}
        z = figure_z(node, values)
        if z is not None and z < -threshold:
            low.append(name)
    return sorted(low)


def judge_run(
    result: vocabulary.CheckResult,
    figures: Mapping[str, float],
    cohort: Mapping[str, Mapping[str, float]],
    node: str,
    threshold: float | None,
) -> tuple[vocabulary.CheckResult, str]:
    """A passed run whose figures lie the check's `threshold` below same-model nodes fails; any other
    result stands. Returns the result and why it failed ("" otherwise)."""
    if result is not Result.PASSED or threshold is None:
        return result, ""
    low = below_threshold(figures, cohort, node, threshold)
    if not low:
        return result, ""
    words = ", ".join(f"{name}={figures[name]:g}" for name in low)
    return Result.FAILED, f"{words}: more than {threshold:g} robust z-scores below same-model nodes"
