"""A check run's end: judged (`checks.result_of`, `figures_of`, `judge_run` against same-model nodes),
appended to GPUNode `status.checks[]`, said (Events CheckPassed, CheckFailed, CheckPreempted on the Node)
and counted (`checks_total`, `check_gpu_seconds_total`).

The history is the operator's status field under server-side apply: what this process made is held in
`CheckMemory.history` and carried in every status write (`status_fields`), as the repair history is.
"""

from __future__ import annotations

import datetime
import types
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events
from gpuhealth_operator.decisions import check_runs, checks, times
from gpuhealth_operator.ladder.check import check_jobs
from gpuhealth_operator.shared import context

Result = vocabulary.CheckResult
STATUS_FIELD: Final = check_runs.STATUS_FIELD

REASONS: Final = types.MappingProxyType(
    {
        Result.PASSED: vocabulary.EventReason.CHECK_PASSED,
        Result.FAILED: vocabulary.EventReason.CHECK_FAILED,
        Result.TIMED_OUT: vocabulary.EventReason.CHECK_FAILED,
        Result.PREEMPTED: vocabulary.EventReason.CHECK_PREEMPTED,
    }
)


def history(ctx: context.Context, name: str) -> list[dict[str, Any]]:
    """The node's `status.checks[]`: as this process last made it, else as stored."""
    made = ctx.steps.check.history.get(name)
    if made is not None:
        return made
    gpunode = ctx.cache.gpunodes.get(name)
    stored = gpunode.status.get(STATUS_FIELD) if gpunode is not None else None
    return [_plain(e) for e in stored if isinstance(e, Mapping)] if isinstance(stored, Sequence) else []


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def status_fields(ctx: context.Context, name: str) -> dict[str, Any]:
    """The GPUNode status field of the checks (kept in every status write: ours under server-side apply)."""
    listed = history(ctx, name)
    return {STATUS_FIELD: listed} if listed else {}


def runs(ctx: context.Context, name: str) -> tuple[check_runs.Run, ...]:
    return check_runs.runs_of(history(ctx, name))


def _model(ctx: context.Context, name: str) -> str | None:
    gpunode = ctx.cache.gpunodes.get(name)
    gpus = gpunode.status.get("gpus") if gpunode is not None else None
    if not isinstance(gpus, Sequence) or not gpus or not isinstance(gpus[0], Mapping):
        return None
    found = gpus[0].get("name") or gpus[0].get("model")
    return found if isinstance(found, str) else None


def cohort(ctx: context.Context, node: str, check: str) -> dict[str, dict[str, float]]:
    """Each figure of `check` by node: the latest passed run's on every other node with the node's GPU
    model (what its `threshold` judges a run against)."""
    model = _model(ctx, node)
    if model is None:
        return {}
    found: dict[str, dict[str, float]] = {}
    for other in ctx.cache.gpunodes:
        if other == node or _model(ctx, other) != model:
            continue
        done = [r for r in runs(ctx, other) if r.check == check and r.result is Result.PASSED]
        for figure, value in (done[-1].figures if done else {}).items():
            found.setdefault(figure, {})[other] = value
    return found


def _gpu_seconds(pod: Mapping[str, Any] | None, now: datetime.datetime) -> tuple[int, float]:
    """(GPUs, seconds) the check's pod held its GPUs: from its start to its containers' end (or now)."""
    if not pod:
        return 0, 0.0
    status = pod.get("status") or {}
    started = times.parse(status.get("startTime"))
    if started is None:
        return 0, 0.0
    ends = [
        times.parse(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for c in status.get("containerStatuses") or []
    ]
    ended = max((e for e in ends if e is not None), default=now)
    gpus = 0
    claimed = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.CHECK_GPUS_ANNOTATION)
    if isinstance(claimed, str) and claimed.isdigit():
        return int(claimed), max(0.0, times.seconds_between(started, ended))  # a DRA claim's GPUs
    for container in (pod.get("spec") or {}).get("containers") or []:
        limit = ((container.get("resources") or {}).get("limits") or {}).get(keys.GPU_RESOURCE)
        try:
            gpus += int(str(limit)) if limit is not None else 0
        except ValueError:
            continue
    return gpus, max(0.0, times.seconds_between(started, ended))


def end(
    ctx: context.Context,
    job: Mapping[str, Any],
    pod: Mapping[str, Any] | None,
    result: vocabulary.CheckResult,
    now: datetime.datetime,
) -> tuple[str, str, dict[str, Any]]:
    """Judge the ended run and add it to the node's history; (node, Event message, entry)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    node, check = str(labels.get(keys.NODE_LABEL) or ""), str(labels.get(keys.CHECK_LABEL) or "")
    policy_name = str(labels.get(keys.POLICY_LABEL) or "")
    template = str(labels.get(keys.CHECK_TEMPLATE_LABEL) or "")
    figures, message = checks.figures_of(pod)
    policy = ctx.cache.policies.get(policy_name)
    spec = next((c for c in policy.active_checks if c.name == check), None) if policy is not None else None
    threshold = spec.threshold if spec is not None else None
    judged, why = checks.judge_run(result, figures, cohort(ctx, node, check), node, threshold)
    words = why or message
    if judged is Result.TIMED_OUT:
        words = words or f"no end within its timeout of {check_jobs.timeout_of(job) or 0:g}s"
    entry: dict[str, Any] = {
        "name": check,
        "template": template,
        "policy": policy_name,
        "time": times.render(now),
        "result": judged.value,
    }
    started = check_jobs.started_at(job)
    if times.parse(started) is not None:
        entry["started"] = started
    if figures:
        entry["figures"] = figures
    if words:
        entry["message"] = words
    request = ((job.get("metadata") or {}).get("annotations") or {}).get(keys.CHECK_REQUEST_ANNOTATION)
    if isinstance(request, str) and request:
        entry["requestId"] = request
    add(ctx, node, entry)
    ctx.meters.checks.labels(policy_name, check, judged.value).inc()
    gpus, seconds = _gpu_seconds(pod, now)
    ctx.meters.check_gpu_seconds.labels(policy_name, check).inc(
        gpus * seconds
    )  # the series from the first run
    return node, _words(check, template, policy_name, judged, figures, words, request), entry


def add(ctx: context.Context, node: str, entry: Mapping[str, Any]) -> None:
    """Add a run's entry to the node's history (in time order, the last HISTORY_LIMIT kept)."""
    listed = [*history(ctx, node), _plain(entry)]
    by_time = sorted(listed, key=lambda e: str(e.get("time")))
    ctx.steps.check.history[node] = by_time[-check_runs.HISTORY_LIMIT :]


def replayed(ctx: context.Context, node: str, entry: Mapping[str, Any]) -> tuple[Result, str] | None:
    """A run recorded elsewhere (a backtest's trace: its live operator judged it) added to the node's
    history as `end` adds one: (its result, the Event message `end` said); None for an entry that is
    no run (`check_runs.runs_of` would leave it out) or one the history holds already."""
    runs = check_runs.runs_of([entry])
    if not runs or _plain(entry) in history(ctx, node):
        return None
    add(ctx, node, entry)
    result = Result(entry["result"])
    figures = runs[0].figures
    message = entry.get("message")
    words = _words(
        str(entry["name"]),
        str(entry.get("template") or ""),
        str(entry.get("policy") or ""),
        result,
        figures,
        message if isinstance(message, str) else "",
        entry.get("requestId"),
    )
    return result, words


def _words(  # noqa: PLR0917 - the run's parts, in the order an Event says them
    check: str,
    template: str,
    policy: str,
    result: vocabulary.CheckResult,
    figures: Mapping[str, float],
    message: str,
    request: object,
) -> str:
    said = f"Active check {check} ({template}, policy {policy}) "
    said += {
        Result.PASSED: "passed",
        Result.FAILED: "failed: condition ActiveCheckFailed holds until a later run passes",
        Result.TIMED_OUT: "timed out (not judged a GPU fault: it is tried again when due)",
        Result.PREEMPTED: "was preempted by a workload that wanted the GPUs: tried again once idle",
    }[result]
    if figures:
        said += "; figures " + ", ".join(f"{k}={v:g}" for k, v in figures.items())
    if message:
        said += f"; {message}"
    if isinstance(request, str) and request:
        said += f" (request {request})"
    return said[:1024]


async def say(ctx: context.Context, node: str, result: vocabulary.CheckResult, message: str) -> None:
    kind = events.NORMAL if result in (Result.PASSED, Result.PREEMPTED) else events.WARNING
    await ctx.recorder.emit_on(ctx.cache, node, REASONS[result], message, kind)  # never raises
