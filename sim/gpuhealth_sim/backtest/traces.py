"""Fleet traces: versioned JSON Lines of what a cluster's Nodes and GPUNodes looked like, and when.

A trace is what `backtest` replays and what `trace generate` writes (the
format is documented in docs/backtest.md). One JSON object per line; a path
ending in `.gz` is gzip-compressed. The first line is the header; every other
line is one record, in time order:

    {"kind": "header", "format": "gpu-health-trace", "version": 3, "start": EPOCH, ...}
    {"kind": "node", "t": SECONDS, "object": {Node: metadata.name/labels/annotations,
                                               spec.unschedulable/taints, status.capacity}}
    {"kind": "node", "t": SECONDS, "name": NAME, "deleted": true}
    {"kind": "gpunode", "t": SECONDS, "name": NAME, "status": {agent, summary, gpus},
                        "operator": {conditions, isolatedGPUs: the operator's, in a node's first record}}
    {"kind": "gpunode", "t": SECONDS, "name": NAME, "patch": {merge patch of the previous status}}
    {"kind": "gpunode", "t": SECONDS, "name": NAME, "deleted": true}
    {"kind": "resourceslice", "t": SECONDS, "object": {ResourceSlice: metadata.name, spec.driver,
                                                        spec.nodeName, spec.pool.name,
                                                        spec.devices[].name/attributes.uuid}}
    {"kind": "resourceslice", "t": SECONDS, "name": NAME, "deleted": true}
    {"kind": "devicetaintrule", "t": SECONDS, "object": {a DeviceTaintRule of gpu-health's},
                                "existing": true (in place when the recording began; else absent)}
    {"kind": "devicetaintrule", "t": SECONDS, "name": NAME, "deleted": true}
    {"kind": "cluster", "t": SECONDS, "deviceTaintRules": {"version": V | null, "actedOn": B | null}}
    {"kind": "agentpod", "t": SECONDS, "name": "NAMESPACE/POD", "node": NODE, "ready": B,
                         "since": RFC3339 | null}
    {"kind": "agentpod", "t": SECONDS, "name": "NAMESPACE/POD", "deleted": true}
    {"kind": "job", "t": SECONDS, "name": "NAMESPACE/JOB", "node": NODE, "action": ACTION,
                    "ended": "Succeeded" | "Failed", "at": RFC3339}
    {"kind": "check", "t": SECONDS, "node": NODE, "run": {an entry of GPUNode status.checks[]:
                      name, template, policy, time, result, started, figures, message, requestId}}
    {"kind": "truth", ...}   (ground truth of a synthetic trace; see docs/backtest.md)

Version 2 added the last four kinds before `truth` (DRA: what IsolateGPU
reads); a version 1 trace is read as one without them. Version 3 added the
deletions of Nodes and GPUNodes (a node replaced rather than repaired leaves
the fleet, and its budget); an older trace is read as one without them.
Version 4 added the agents' DaemonSet pods (`agentpod`: the node, whether the
pod is Ready and since when, as the operator's liveness reads them); an older
trace is read as one without pods, whose agents are judged by their heartbeat.
It also keeps, in a GPUNode's first record, what a restarted operator reads back
of its own status (`operator`: conditions, isolatedGPUs), and marks the
DeviceTaintRules in place when the recording began (`existing`): a replay goes
on from there. Version 5 added the end of each repair Job (`job`: gpu-health's
Jobs labelled with a repair action, once each, when it succeeded or failed and
at what time the Job says), so a replay's own Job of that name ends so; an
older trace is read as one without them, where a replay's repair Jobs never end.
Version 6 added the active checks' runs (`check`: each entry the recorded
operator added to a GPUNode's `status.checks[]`, once, after the GPUNode's own
record; a run already there when the recording found the node too), which a
replay hands its operator at their time; an older trace is read as one without
them, where no check ran.

`t` is seconds since the header's `start` (epoch seconds, UTC). A GPUNode
`patch` is an RFC 7386 merge patch of the node's previous agent status, except
that `gpus` is patched per GPU: an object keyed by the GPU's position in the
list ("0", "1", ...), each value a merge patch of that GPU. That keeps a
sample that moved only clocks to a few bytes per GPU.

Bad input gets a `TraceError` naming the file and the line: a line that is
not JSON, a record of an unknown kind or without its fields, a patch of a
node never seen in full, and a truncated gzip stream.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import pathlib
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, Final, cast

FORMAT: Final = "gpu-health-trace"
VERSION: Final = 6
READS: Final = frozenset({1, 2, 3, 4, 5, 6})
"""Format versions this module reads (each only adds records to the one before)."""
RESUMED_STATUS_FIELDS: Final = ("conditions", "isolatedGPUs")
"""Of the operator's part of a GPUNode status, what a restarted operator reads back (its conditions'
times, the GPUs it isolated: `isolating.STATUS_FIELD`): a GPUNode's first record keeps them (`operator`),
so a replay goes on from where the recording began."""
OBJECT_KINDS: Final = frozenset({"resourceslice", "devicetaintrule"})
"""Record kinds carrying an `object` (a version) or a `name` with `deleted: true` (its deletion)."""
KINDS: Final = frozenset({"node", "gpunode", "cluster", "agentpod", "job", "check", "truth"}) | OBJECT_KINDS
JOB_ENDINGS: Final = ("Succeeded", "Failed")


class TraceError(Exception):
    """A trace that cannot be read, naming where."""


def _open_text(path: pathlib.Path, mode: str) -> IO[str]:
    if path.name.endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", compresslevel=6, encoding="utf-8"))
    return path.open(mode, encoding="utf-8")


class Writer:
    """Appends records to a trace; `with Writer(path, header) as w: w.write({...})`."""

    def __init__(self, path: pathlib.Path, header: Mapping[str, Any]) -> None:
        self.path = path
        self._file = _open_text(path, "w")
        self.write({"kind": "header", "format": FORMAT, "version": VERSION, **header})

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Make what was written readable now (for gzip, a sync flush: the file so far decompresses)."""
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def merge_patch(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 on a copy of `base` (nested objects merge, null removes, anything else replaces)."""
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif _mapping(value):
            held = result.get(key)
            result[key] = merge_patch(held if isinstance(held, Mapping) else {}, value)
        else:
            result[key] = value
    return result


def _mapping(value: object) -> bool:
    """`isinstance(value, Mapping)`, a decoded dict's answered without the ABC's check (every field of
    every GPU of every patch asks)."""
    return type(value) is dict or isinstance(value, Mapping)


def apply_status_patch(
    status: Mapping[str, Any],
    patch: Mapping[str, Any],
    *,
    patch_gpu: Callable[[Any, Mapping[str, Any]], Any] = merge_patch,
    new_gpu: Callable[[Mapping[str, Any]], Any] = dict,
) -> dict[str, Any]:
    """A GPUNode agent status after a trace `patch` (module docstring); `status` is not changed.

    `patch_gpu(gpu, change)` and `new_gpu(change)`: a GPU patched in place and one appended; by default
    the merge patch and the change as it is. A replay keeps its GPUs compacted and patches them so
    (`replayer`), without a raw copy of each GPU's thirty fields per report."""
    gpus_patch = patch.get("gpus")
    rest = {k: v for k, v in patch.items() if k != "gpus"}
    result = merge_patch(status, rest)
    if isinstance(gpus_patch, Mapping):
        gpus = list(status.get("gpus") or [])
        for key, change in gpus_patch.items():
            position = int(key)
            if change is None:
                gpus[position] = None
            elif position >= len(gpus):
                gpus.append(new_gpu(change))
            else:
                gpus[position] = patch_gpu(gpus[position], change)
        result["gpus"] = [g for g in gpus if g is not None]
    elif "gpus" in patch:
        result["gpus"] = gpus_patch
    return result


def status_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The trace `patch` that turns `before` into `after` (the inverse of `apply_status_patch`)."""
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        old = before.get(key)
        if key == "gpus" and isinstance(old, list) and isinstance(value, list) and len(value) >= len(old):
            per_gpu = {str(i): _diff(old[i], g) for i, g in enumerate(value[: len(old)]) if old[i] != g}
            per_gpu.update({str(i): g for i, g in enumerate(value) if i >= len(old)})
            if per_gpu:
                patch[key] = per_gpu
        elif old != value:
            patch[key] = _diff(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return patch


def _diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {k: None for k in before.keys() - after.keys()}
    for key, value in after.items():
        old = before.get(key)
        if old != value:
            patch[key] = _diff(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return patch


def _check(record: object, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a record must be a JSON object")
    kind = record.get("kind")
    if kind not in KINDS:
        raise TraceError(
            f"{where}: unknown record kind {kind!r} (expected one of {', '.join(sorted(KINDS))})"
        )
    if kind == "truth":
        return record
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise TraceError(f"{where}: {kind} record needs a number `t` (seconds since the header's start)")
    if kind != "cluster" and deletion(record):
        return record  # a node, gpunode, resourceslice or devicetaintrule deleted
    if kind == "node" or kind in OBJECT_KINDS:
        _check_object(record, kind, where)
    elif kind == "cluster":
        if not isinstance(record.get("deviceTaintRules"), dict):
            raise TraceError(f"{where}: cluster record needs a `deviceTaintRules` object")
    elif kind == "agentpod":
        _check_agent_pod(record, where)
    elif kind == "job":
        _check_job(record, where)
    elif kind == "check":
        _check_run(record, where)
    elif not isinstance(record.get("name"), str) or not record["name"]:
        raise TraceError(f"{where}: gpunode record needs a `name`")
    elif not isinstance(record.get("status"), dict) and not isinstance(record.get("patch"), dict):
        raise TraceError(f"{where}: gpunode record needs a `status` or a `patch` object, or `deleted: true`")
    elif not isinstance(record.get("operator", {}), dict):
        raise TraceError(f"{where}: gpunode record's `operator` must be an object")
    return record


def _check_agent_pod(record: dict[str, Any], where: str) -> None:
    name, node, since = record.get("name"), record.get("node"), record.get("since")
    if (
        not isinstance(name, str)
        or not name
        or not isinstance(node, str)
        or not node
        or not isinstance(record.get("ready"), bool)
        or not (since is None or isinstance(since, str))
    ):
        raise TraceError(
            f"{where}: agentpod record needs a `name`, a `node`, `ready` (true or false) and `since` "
            "(a time or null), or a `name` and `deleted: true`"
        )


def _check_job(record: dict[str, Any], where: str) -> None:
    fields = [record.get(k) for k in ("name", "node", "action", "at")]
    if not all(isinstance(v, str) and v for v in fields) or record.get("ended") not in JOB_ENDINGS:
        raise TraceError(
            f"{where}: job record needs a `name` (NAMESPACE/JOB), a `node`, an `action`, `ended` "
            f"({' or '.join(JOB_ENDINGS)}) and `at` (a time)"
        )


def _check_run(record: dict[str, Any], where: str) -> None:
    node, run = record.get("node"), record.get("run")
    if (
        not isinstance(node, str)
        or not node
        or not isinstance(run, dict)
        or not all(isinstance(run.get(k), str) and run[k] for k in ("name", "time", "result"))
    ):
        raise TraceError(
            f"{where}: check record needs a `node` and a `run` (an entry of GPUNode status.checks[]: "
            "its `name`, `time` and `result` at least)"
        )


def deletion(record: Mapping[str, Any]) -> bool:
    """Whether a record is an object's deletion: a `name` and `deleted: true`."""
    return record.get("deleted") is True and isinstance(record.get("name"), str) and bool(record["name"])


def _check_object(record: dict[str, Any], kind: str, where: str) -> None:
    obj = record.get("object")
    if isinstance(obj, dict):
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
        if isinstance(name, str) and name:
            return
    raise TraceError(
        f"{where}: {kind} record needs an `object` with metadata.name, or a `name` and `deleted: true`"
    )


@contextlib.contextmanager
def open_trace(path: pathlib.Path) -> Iterator[tuple[dict[str, Any], Iterator[dict[str, Any]]]]:
    """(header, records) of a trace; records are checked as they are read and raise TraceError."""
    try:
        handle = _open_text(path, "r")
    except OSError as error:
        raise TraceError(f"{path}: cannot open: {error.strerror or error}") from error
    with handle:
        lines = _lines(path, handle)
        try:
            number, first = next(lines)
        except StopIteration:
            raise TraceError(f"{path}: empty trace (no header line)") from None
        header = _parse(first, f"{path}:{number}")
        if not isinstance(header, dict) or header.get("kind") != "header" or header.get("format") != FORMAT:
            raise TraceError(f"{path}:{number}: not a gpu-health trace (the first line must be its header)")
        if header.get("version") not in READS:
            raise TraceError(
                f"{path}:{number}: trace format version {header.get('version')!r} is not supported "
                f"(this gpu-health-sim reads versions {', '.join(map(str, sorted(READS)))})"
            )
        if isinstance(header.get("start"), bool) or not isinstance(header.get("start"), int | float):
            raise TraceError(f"{path}:{number}: the header needs `start` (epoch seconds)")
        yield header, (_check(_parse(text, f"{path}:{n}"), f"{path}:{n}") for n, text in lines)


def _lines(path: pathlib.Path, handle: IO[str]) -> Iterator[tuple[int, str]]:
    number = 0
    try:
        for number, text in enumerate(handle, start=1):
            if not text.endswith("\n"):
                raise TraceError(f"{path}:{number}: truncated trace (the last line is incomplete)")
            if text.strip():
                yield number, text
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise TraceError(f"{path}:{number + 1}: truncated or corrupt gzip stream ({error})") from error
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}:{number + 1}: not UTF-8 text ({error.reason})") from error


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from error


def has_truth(path: pathlib.Path) -> bool:
    """Whether the trace holds ground truth (a `truth` record); reads up to the first one, parsing only
    the lines that may be one (a recorded trace has none, and is read to its end)."""
    with open_trace(path):
        pass  # the header, checked
    with _open_text(path, "r") as handle:
        for number, text in _lines(path, handle):
            if '"truth"' in text:
                record = _parse(text, f"{path}:{number}")
                if isinstance(record, dict) and record.get("kind") == "truth":
                    return True
    return False


CHECK_FAULT: Final = "ActiveCheckFailed"
"""The `fault` of a truth fault a recorded failed check stands for (`check_truth`)."""
RESOLUTION_SECONDS: Final = 0.001
"""A recording's times are milliseconds (`tracerecord`). A replay's clock is the header's epoch plus `t`,
and its actions' times that clock less the epoch: an action at a record's instant can read a float's
hair before the record's `t` (start 1764666540.370123, t 13.143: 13.14299988...). A fault that starts
at a record starts this much earlier, so the action at its instant is on it."""


def read_truth(path: pathlib.Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the truth of a trace (the whole trace is checked on the way): its truth records,
    then the faults its failed active checks found (`check_truth`)."""
    with open_trace(path) as (header, records):
        truth: list[dict[str, Any]] = []
        checks: list[dict[str, Any]] = []
        for record in records:
            if record["kind"] == "truth":
                truth.append(record)
            elif record["kind"] == "check":
                checks.append(record)
        return header, truth + check_truth(checks)


def check_truth(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A failed run of an active check is a fault the trace itself holds evidence of (a DCGM diagnostic
    that failed on the node), whatever the counters said: a `fatal` truth fault (`fault`
    ActiveCheckFailed) from the record's time (less RESOLUTION_SECONDS) until a later run of the same
    check on the node passes (then the condition no longer holds), else to the end of the trace.
    Failures before that pass are one fault; preempted and timed-out runs change nothing
    (`check_runs.check_failed`'s rule)."""
    faults: list[dict[str, Any]] = []
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: float(r["t"])):
        run = record["run"]
        key = (str(record["node"]), str(run["name"]))
        if run["result"] == "Failed" and key not in open_:
            open_[key] = fault = {
                "kind": "truth",
                "type": "fatal",
                "node": key[0],
                "start": float(record["t"]) - RESOLUTION_SECONDS,
                "end": float("inf"),
                "fault": CHECK_FAULT,
                "check": key[1],
            }
            faults.append(fault)
        elif run["result"] == "Passed" and key in open_:
            open_.pop(key)["end"] = float(record["t"])
    return faults
