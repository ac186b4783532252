"""A trace from the series Prometheus already holds: backtest last month without having recorded it.

`gpu-health-sim trace import --prometheus URL --since 14d [--step 60s]` reads
the agent's per-GPU series (`gpuhealth_agent_gpu_*`, metrics.md) or, with
`--source dcgm`, dcgm-exporter's (`DCGM_FI_DEV_*`) through Prometheus' HTTP
API (`/api/v1/query_range`, urllib only) and writes a trace (`traces`) that
`backtest` replays like a recorded one. What it holds, and what it cannot:

- each node's GPUNode facts as Prometheus evaluates them at every `step`
  (each series' latest sample within Prometheus' lookback): a fact changed
  and back between two steps is not seen, a counter is its sampled value;
- written as the agent writes: at once when a significant fact changed (the
  agent's own `changes.fingerprint`), else after `heartbeat_seconds`
  (stated in each status, at least the step, so a replayed agent goes stale
  only where its series stop: three missed heartbeats);
- a Node per `node` label (the chart's ServiceMonitor relabels it from the
  pod's node), with the label `nvidia.com/gpu.present: "true"` (its GPUs
  are in the series) and `--node-labels`, its GPU count as capacity; no
  cordon, taint or other label (Prometheus has none of them);
- no agent pods, no DRA, no ground truth; a fact Prometheus has no series
  for (a GPU's model, serial, PCI bus, throttledSince, ...) is absent, never
  made up. XIDs are the increase of `gpuhealth_agent_gpu_xid_errors_total`
  within the window (dcgm: a change of the last XID after the first sample),
  each `lastSeen` the step it was first seen at: an XID counted before the
  window is not in the trace. They stay until the GPU looks reset (the
  agent's `looks_reset`), also while the GPU is lost (as the agent's).

Long ranges are cut into queries of at most `POINTS_PER_QUERY` steps
(Prometheus refuses more than 11,000 points per series), fewer for a large
fleet (`GPU_STEPS_PER_CHUNK`), and converted one chunk at a time, so memory
stays bounded by a chunk. A request that fails on
the network or with a 5xx is retried a few times with backoff; then, as for
any 4xx, `PrometheusError` says what Prometheus (or the network) said.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from gpuhealth_agent import changes, facts, history, metrics, nvml
from gpuhealth_api import heartbeats, keys, timestamps
from gpuhealth_sim.backtest import http_auth, traces
from gpuhealth_sim.backtest import progress as progressing
from gpuhealth_sim.backtest.defaults import AGENT, NODE_LABELS

POINTS_PER_QUERY: Final = 1_000
"""Steps per query_range: well under Prometheus' 11,000 points per series, and a chunk of a large
fleet (series by steps) fits in memory."""
MAX_POINTS: Final = 11_000
GPU_STEPS_PER_CHUNK: Final = 100_000
"""GPU statuses (GPUs by steps) converted at once: about 150 MB; a 100-node fleet of 8 GPUs is read in
chunks of 125 steps."""
FIRST_CHUNK_STEPS: Final = 100
"""The first query's steps, before the fleet's size is known."""
MIN_STEPS_PER_CHUNK: Final = 10
"""Prometheus' own limit of points per series in one query."""
RETRIES: Final = 3
"""Attempts after the first for a request that failed on the network or with a 5xx."""
DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
UNIT_SECONDS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}

Fetch = Callable[[str, Mapping[str, str]], Any]
"""GET an API path with query parameters; returns the response's `data` (raises PrometheusError)."""


class PrometheusError(Exception):
    """Prometheus could not be read (unreachable, an error answer, not Prometheus at all)."""


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration (`14d`, `1h30m`, `90s`) or a plain number of seconds."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        parts = DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"not a duration: {text!r} (e.g. 14d, 6h, 90s)") from None
        value = sum(float(n) * UNIT_SECONDS[u] for n, u in parts)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Options:
    url: str
    start: float
    """Epoch seconds of the first step (the trace's `t` = 0)."""
    end: float
    step: float
    source: str = AGENT
    selector: str = ""
    """Extra PromQL label matchers for every query (`job="gpu-health-agent"`), without braces."""
    node_label: str | None = None
    """The label naming a series' node (None: the first of NODE_LABELS a series has)."""
    node_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Labels every imported Node gets besides gpu.present (so a policy's nodeSelector matches)."""
    heartbeat_seconds: float = float(heartbeats.DEFAULT_HEARTBEAT_SECONDS)
    """The agent's heartbeat: a status is written on a significant change or after this long (0: every
    step)."""
    points_per_query: int = POINTS_PER_QUERY
    gpu_steps_per_chunk: int = GPU_STEPS_PER_CHUNK


@dataclasses.dataclass
class Counts:
    nodes: int = 0
    records: int = 0
    steps: int = 0
    queries: int = 0
    covered_seconds: float = 0.0


class HttpFetch:
    """Prometheus' HTTP API over urllib, with bounded retries (network errors and 5xx only), sending
    `auth`'s headers (bearer token or basic auth, extra ones such as a tenant) over its TLS context."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float = 30.0,
        retries: int = RETRIES,
        sleep: Callable[[float], None] | None = None,
        auth: http_auth.Auth | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.retries = retries
        self.sleep = sleep or time.sleep
        auth = auth or http_auth.Auth()
        self.headers = auth.request_headers()
        self.context = auth.ssl_context()

    def __call__(self, path: str, params: Mapping[str, str]) -> Any:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(min(8.0, 0.5 * 2**attempt))
            try:
                request = urllib.request.Request(address, headers=self.headers)
                with urllib.request.urlopen(
                    request, timeout=self.timeout_seconds, context=self.context
                ) as response:
                    return _data(json.loads(response.read()), self.url)
            except urllib.error.HTTPError as error:
                body = _error_text(error)
                failure = f"HTTP {error.code}{': ' + body if body else ''}"
                if error.code < 500:
                    break  # a bad query or a refusal: asking again gives the same answer
            except (urllib.error.URLError, OSError) as error:
                reason = getattr(error, "reason", error)
                failure = str(reason)
                if isinstance(reason, ssl.SSLError):
                    break  # a certificate refused (theirs or ours): asking again gives the same answer
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise PrometheusError(
                    f"{self.url} answered {path} with something not JSON: not Prometheus?"
                ) from None
        raise PrometheusError(f"cannot read Prometheus at {self.url} ({path}): {failure}")


def _error_text(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read())
    except (ValueError, OSError):
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _data(body: Any, url: str) -> Any:
    if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
        said = body.get("error") if isinstance(body, dict) else None
        raise PrometheusError(f"{url}: Prometheus answered with an error: {said or body!r}")
    return body["data"]


# -- what the series say ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric name to query and how its series set facts of a GPU (or of the node's agent)."""

    name: str
    apply: Callable[[dict[str, Any], Mapping[str, str], float], None]
    """Sets the fact(s) of one GPU (a dict being built) from one series' labels and value."""
    per_gpu: bool = True


def _set(gpu: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        gpu = gpu.setdefault(part, {})
    gpu[path[-1]] = value


def _typed(fact: facts.Fact, value: float) -> Any:
    if fact.type in (facts.Type.INT, facts.Type.COUNTER, facts.Type.PAGES):
        return int(value)
    if fact.type is facts.Type.FLOAT:
        return round(value, 1)
    if fact.type is facts.Type.BOOL:
        return value > 0
    if fact.type is facts.Type.RECOVERY:
        return nvml.RECOVERY_ACTIONS.get(int(value), f"Unknown{int(value)}")
    return value


def _agent_family(metric: facts.Metric) -> Family:
    rows = [f for f in facts.FACTS if f.metric == metric]

    def apply(gpu: dict[str, Any], labels: Mapping[str, str], value: float) -> None:
        own = tuple(labels.get(name, "") for name in metric.labels)
        for fact in rows:
            if fact.type is facts.Type.REASONS:
                reasons = gpu.setdefault("clockEventReasons", [])
                if value > 0 and own[-1] not in reasons:
                    reasons.append(own[-1])
            elif own == fact.labels:
                _set(gpu, fact.path, _typed(fact, value))

    return Family(f"{metrics.PREFIX}_{metric.name}", apply)


def _lost(gpu: dict[str, Any], _labels: Mapping[str, str], value: float) -> None:
    gpu["lost"] = value > 0


def _xid_counter(gpu: dict[str, Any], labels: Mapping[str, str], value: float) -> None:
    code = labels.get(metrics.CODE, "")
    if code.isdigit():
        gpu.setdefault("_xidCounters", {})[int(code)] = value


def _expected(agent: dict[str, Any], _labels: Mapping[str, str], value: float) -> None:
    agent["expectedGpuCount"] = int(value)


def _agent_error(agent: dict[str, Any], labels: Mapping[str, str], value: float) -> None:
    if value > 0 and labels.get(metrics.REASON):
        agent["error"] = {"reason": labels[metrics.REASON]}


AGENT_FAMILIES: Final = (
    *(_agent_family(m) for m in facts.METRICS),
    Family(f"{metrics.PREFIX}_gpu_lost", _lost),
    Family(f"{metrics.PREFIX}_gpu_xid_errors_total", _xid_counter),
    Family(f"{metrics.PREFIX}_expected_gpus", _expected, per_gpu=False),
    Family(f"{metrics.PREFIX}_error", _agent_error, per_gpu=False),
)


def _dcgm(path: tuple[str, ...], convert: Callable[[float], Any]) -> Callable[..., None]:
    def apply(gpu: dict[str, Any], labels: Mapping[str, str], value: float) -> None:
        _set(gpu, path, convert(value))
        if labels.get("modelName"):
            gpu["model"] = labels["modelName"]  # dcgm-exporter names the model on every series

    return apply


def _dcgm_last_xid(gpu: dict[str, Any], _labels: Mapping[str, str], value: float) -> None:
    gpu["_lastXid"] = int(value)


def _dcgm_violation(reason: str) -> Callable[..., None]:
    def apply(gpu: dict[str, Any], _labels: Mapping[str, str], value: float) -> None:
        gpu.setdefault("_violations", {})[reason] = value

    return apply


DCGM_FAMILIES: Final = (
    Family("DCGM_FI_DEV_GPU_TEMP", _dcgm(("temperatureCelsius",), int)),
    Family("DCGM_FI_DEV_SM_CLOCK", _dcgm(("smClockMHz",), int)),
    Family("DCGM_FI_DEV_GPU_UTIL", _dcgm(("utilizationPercent",), int)),
    Family("DCGM_FI_DEV_POWER_USAGE", _dcgm(("powerWatts",), lambda v: round(v, 1))),
    Family("DCGM_FI_DEV_FB_USED", _dcgm(("memoryUsedMiB",), int)),
    Family("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", _dcgm(("ecc", "correctedVolatile"), int)),
    Family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", _dcgm(("ecc", "uncorrectedVolatile"), int)),
    Family("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", _dcgm(("ecc", "correctedAggregate"), int)),
    Family("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", _dcgm(("ecc", "uncorrectedAggregate"), int)),
    Family("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", _dcgm(("remappedRows", "correctable"), int)),
    Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", _dcgm(("remappedRows", "uncorrectable"), int)),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", _dcgm(("remappedRows", "failure"), lambda v: v > 0)),
    Family("DCGM_FI_DEV_ROW_REMAP_PENDING", _dcgm(("remappedRows", "pending"), lambda v: v > 0)),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", _dcgm(("pcie", "replayCounter"), int)),
    Family("DCGM_FI_DEV_XID_ERRORS", _dcgm_last_xid),
    Family("DCGM_FI_DEV_THERMAL_VIOLATION", _dcgm_violation("SwThermalSlowdown")),
    Family("DCGM_FI_DEV_POWER_VIOLATION", _dcgm_violation("SwPowerCap")),
)
"""dcgm-exporter's fields (agent/gpuhealth_agent/dcgm.py reads five of them), each to the agent's fact.
A violation counter that grew since the last step is its clock-event reason (as the agent folds it)."""


# -- the conversion --------------------------------------------------------------------------------


@dataclasses.dataclass
class _GpuMemory:
    xids: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    counters: dict[int, float] | None = None
    """The XID counters at the last step (None before the first: the first value is the baseline)."""
    last_xid: int | None = None
    violations: dict[str, float] = dataclasses.field(default_factory=dict)
    view: dict[str, Any] | None = None
    observed: str = ""
    throttled_since: str | None = None
    last: dict[str, Any] | None = None


@dataclasses.dataclass
class _NodeMemory:
    gpus: dict[str, _GpuMemory] = dataclasses.field(default_factory=dict)
    written: tuple[str, float] | None = None
    status: dict[str, Any] | None = None
    seen_at: float | None = None
    """The step it last had series at (a gap of more than a step: the agent restarted, it writes)."""


class Converter:
    """Series of one chunk of steps → trace records; keeps each node's memory across chunks."""

    def __init__(self, options: Options, writer: traces.Writer) -> None:
        self.options = options
        self.writer = writer
        self.nodes: dict[str, _NodeMemory] = {}
        self.counts = Counts()
        self.gpus_seen = 0
        """The most GPUs at one step so far (the next chunk's size follows)."""
        self.heartbeat = max(options.heartbeat_seconds, options.step)
        """What each status states as `heartbeatSeconds`: never less than a step, or a replayed agent
        would go stale between two samples."""

    def node_of(self, labels: Mapping[str, str]) -> str | None:
        if self.options.node_label is not None:
            return labels.get(self.options.node_label) or None
        return next((labels[n] for n in NODE_LABELS if labels.get(n)), None)

    def chunk(self, families: Iterable[tuple[Family, list[dict[str, Any]]]]) -> None:
        """One chunk: (family, its query_range `result`) for each family; writes its steps' records."""
        # samples[t][node] = (gpus by (index, uuid), agent facts)
        samples: dict[float, dict[str, tuple[dict[tuple[int, str], dict[str, Any]], dict[str, Any]]]] = {}
        for family, result in families:
            for series in result:
                labels = series.get("metric") or {}
                node = self.node_of(labels)
                if node is None:
                    continue
                key = _gpu_key(labels) if family.per_gpu else None
                if family.per_gpu and key is None:
                    continue
                for t, text in series.get("values") or []:
                    value = float(text)
                    if math.isnan(value):
                        continue
                    gpus, agent = samples.setdefault(float(t), {}).setdefault(node, ({}, {}))
                    if key is None:
                        family.apply(agent, labels, value)
                    else:
                        gpu = gpus.setdefault(key, {"index": key[0], **({"uuid": key[1]} if key[1] else {})})
                        family.apply(gpu, labels, value)
        self.gpus_seen = max(
            [self.gpus_seen, *(sum(len(g) for g, _ in nodes.values()) for nodes in samples.values())]
        )
        for t in sorted(samples):
            for node in sorted(samples[t]):
                gpus, agent = samples[t][node]
                if gpus:
                    self._step(node, t, gpus, agent)
            self.counts.steps += 1
            self.counts.covered_seconds = t - self.options.start

    def _step(
        self, node: str, t: float, gpus: dict[tuple[int, str], dict[str, Any]], agent: dict[str, Any]
    ) -> None:
        memory = self.nodes.get(node)
        at = round(t - self.options.start, 3)
        if memory is None:
            memory = self.nodes[node] = _NodeMemory()
            self.counts.nodes += 1
            self._write({"kind": "node", "t": at, "object": self._node_object(node, len(gpus))})
        if memory.seen_at is not None and t - memory.seen_at > self.options.step * 1.5:
            memory.written = None  # its series stopped and came back: an agent that starts writes at once
        memory.seen_at = t
        stamp = timestamps.rfc3339(t)
        built = [self._gpu(memory, key, gpu, stamp) for key, gpu in sorted(gpus.items())]
        node_status: dict[str, Any] = {
            "agent": {"lastHeartbeatTime": stamp, "heartbeatSeconds": max(1, round(self.heartbeat)), **agent},
            "summary": changes.summarize(built),  # type: ignore[arg-type]  # the agent's status shape
            "gpus": built,
        }
        if self.options.heartbeat_seconds > 0:
            fingerprint = changes.fingerprint(node_status)  # type: ignore[arg-type]
            if memory.written is not None:
                state = changes.WriteState(*memory.written)
                if changes.write_reason(state, fingerprint, t, self.options.heartbeat_seconds) is None:
                    return
            memory.written = (fingerprint, t)
        if memory.status is None:
            self._write({"kind": "gpunode", "t": at, "name": node, "status": node_status})
        else:
            patch = traces.status_patch(memory.status, node_status)
            self._write({"kind": "gpunode", "t": at, "name": node, "patch": patch})
        memory.status = node_status

    def _gpu(
        self, node: _NodeMemory, key: tuple[int, str], gpu: dict[str, Any], stamp: str
    ) -> dict[str, Any]:
        memory = node.gpus.setdefault(key[1] or f"index-{key[0]}", _GpuMemory())
        counters = gpu.pop("_xidCounters", None)
        last_xid = gpu.pop("_lastXid", None)
        violations = gpu.pop("_violations", None)
        if gpu.get("lost"):
            gpu = {"index": gpu["index"], **({"uuid": gpu["uuid"]} if "uuid" in gpu else {}), "lost": True}
        if memory.last is not None and history.looks_reset(memory.last, gpu):  # type: ignore[arg-type]
            memory.xids.clear()  # the agent clears a GPU's XIDs at a reset too
        if counters is not None:
            for code, value in counters.items():
                before = (memory.counters or {}).get(code)
                if memory.counters is not None:
                    # A counter that went down restarted (a new agent process): all of it is new.
                    grown = value - before if before is not None and value >= before else value
                    if grown >= 1:
                        self._xid(memory, code, int(grown), stamp)
            memory.counters = {**(memory.counters or {}), **counters}
        elif memory.counters is None:
            memory.counters = {}
        if last_xid is not None:
            if memory.last_xid is not None and last_xid and last_xid != memory.last_xid:
                self._xid(memory, last_xid, 1, stamp)  # dcgm: a new last XID after the first sample
            memory.last_xid = last_xid
        if violations is not None:
            reasons = gpu.setdefault("clockEventReasons", [])
            for reason, value in violations.items():
                old = memory.violations.get(reason)
                if old is not None and value > old and reason not in reasons:
                    reasons.append(reason)
            memory.violations.update(violations)
        if "clockEventReasons" in gpu:
            gpu["clockEventReasons"] = sorted(gpu["clockEventReasons"])
        # A lost GPU keeps its XIDs, as the agent reports them (history.stamp): XID 79 is why it is lost,
        # and XidCritical must hold while it is gone, not vanish with its frozen values.
        if memory.xids:
            gpu["xids"] = [dict(x) for _, x in sorted(memory.xids.items())]
        throttling = changes.throttle_reasons(gpu)  # type: ignore[arg-type]
        if not throttling:
            memory.throttled_since = None
        elif memory.throttled_since is None:
            memory.throttled_since = stamp
        if memory.throttled_since is not None:
            gpu["throttledSince"] = memory.throttled_since
        view = changes.gpu_view(gpu)  # type: ignore[arg-type]
        if view != memory.view:
            memory.view, memory.observed = view, stamp
        gpu["observedTime"] = memory.observed
        memory.last = gpu
        return gpu

    @staticmethod
    def _xid(memory: _GpuMemory, code: int, count: int, stamp: str) -> None:
        record = memory.xids.setdefault(code, {"code": code, "count": 0, "lastSeen": stamp})
        record["count"] += count
        record["lastSeen"] = stamp

    def _node_object(self, node: str, gpus: int) -> dict[str, Any]:
        labels = {keys.GPU_PRESENT_LABEL: "true", "kubernetes.io/hostname": node, **self.options.node_labels}
        return {
            "metadata": {"name": node, "labels": labels, "annotations": {}},
            "spec": {"unschedulable": False, "taints": []},
            "status": {"capacity": {keys.GPU_RESOURCE: str(gpus)}},
        }

    def _write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        self.counts.records += 1


def _gpu_key(labels: Mapping[str, str]) -> tuple[int, str] | None:
    index = labels.get(metrics.GPU, "")
    uuid = labels.get(metrics.UUID) or labels.get("UUID") or ""
    return (int(index), uuid) if index.isdigit() else None


def families(source: str) -> tuple[Family, ...]:
    return AGENT_FAMILIES if source == AGENT else DCGM_FAMILIES


def steps_per_chunk(options: Options, gpus: int) -> int:
    """Steps of the next query: at most `points_per_query`, fewer for a large fleet (GPUS_STEPS_PER_CHUNK
    GPU statuses per chunk: a chunk is converted in memory), at least MIN_STEPS_PER_CHUNK."""
    budget = options.gpu_steps_per_chunk // max(1, gpus)
    return max(MIN_STEPS_PER_CHUNK, min(options.points_per_query, MAX_POINTS, budget))


def header(options: Options) -> dict[str, Any]:
    return {
        "start": options.start,
        "generator": {"tool": "gpu-health-sim trace import"},
        "source": {
            "kind": "prometheus",
            "url": options.url,
            "series": options.source,
            "selector": options.selector,
            "from": timestamps.rfc3339(options.start),
            "until": timestamps.rfc3339(options.end),
            "stepSeconds": options.step,
            "heartbeatSeconds": options.heartbeat_seconds,
        },
        "resolutionSeconds": options.step,
        "absent": [
            "agentpod",
            "truth",
            "resourceslice",
            "devicetaintrule",
            "node cordons, taints and labels",
        ],
    }


def run(
    options: Options,
    out: pathlib.Path,
    fetch: Fetch | None = None,
    progress: progressing.Progress | None = None,
) -> Counts:
    """Query every family chunk by chunk and write the trace to `out`; raises PrometheusError (and
    OSError for `out`). A Prometheus with none of the series says so (PrometheusError) and writes no
    file."""
    fetch = fetch or HttpFetch(options.url)
    wanted = families(options.source)
    matchers = f"{{{options.selector}}}" if options.selector else ""
    total_steps = int((options.end - options.start) // options.step) + 1

    def span(first: int, steps: int) -> tuple[float, float]:
        last = min(first + steps, total_steps) - 1
        return options.start + first * options.step, options.start + last * options.step

    steps = min(FIRST_CHUNK_STEPS, steps_per_chunk(options, 0))
    results = _query(fetch, wanted, matchers, span(0, steps), options.step)  # before creating the file
    counts = Counts(queries=len(wanted))
    if not any(result for _, result in results) and steps >= total_steps:
        raise PrometheusError(_none_found(options))
    writer = traces.Writer(out, header(options))  # an unwritable `out` raises OSError here
    try:
        with writer:
            converter = Converter(options, writer)
            converter.counts = counts
            first = 0
            while True:
                converter.chunk(results)
                writer.flush()
                if progress is not None:
                    progress.update(counts.records, counts.covered_seconds, options.end - options.start)
                first += steps
                if first >= total_steps:
                    break
                steps = steps_per_chunk(options, converter.gpus_seen)
                results = _query(fetch, wanted, matchers, span(first, steps), options.step)
                counts.queries += len(wanted)
    except BaseException:
        # A trace that stops short of its header's `until` would read as a quiet fleet: none at all.
        out.unlink(missing_ok=True)
        raise
    if counts.nodes == 0:
        out.unlink(missing_ok=True)
        raise PrometheusError(_none_found(options))
    return counts


def _none_found(options: Options) -> str:
    what = "gpuhealth_agent_gpu_*" if options.source == AGENT else "DCGM_FI_DEV_*"
    where = f" matching {{{options.selector}}}" if options.selector else ""
    return (
        f"{options.url} holds no {what} series{where} with a node label "
        f"({options.node_label or ', '.join(NODE_LABELS)}) between {timestamps.rfc3339(options.start)} and "
        f"{timestamps.rfc3339(options.end)}: nothing to import"
    )


def _query(
    fetch: Fetch, wanted: Iterable[Family], matchers: str, span: tuple[float, float], step: float
) -> list[tuple[Family, list[dict[str, Any]]]]:
    begin, last = span
    results = []
    for family in wanted:
        params = {
            "query": f"{family.name}{matchers}",
            "start": _num(begin),
            "end": _num(last),
            "step": _num(step),
        }
        data = fetch("/api/v1/query_range", params)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PrometheusError(f"query_range of {family.name} answered no matrix: {str(data)[:200]}")
        results.append((family, list(data.get("result") or [])))
    return results


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")
