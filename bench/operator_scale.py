"""One operator over 5,000 GPU nodes: footprint, steady-state writes, single-fault latency, a 1 % burst.

Starts the local control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok), the operator as a subprocess with leader election on, one
policy (`EccUncorrectable → Cordon`, maxUnavailable 10 %), then N kwok GPU
Nodes (8 GPUs each). The GPUNodes of the first `--agents` nodes are written
by the fleet simulator (one real agent per node: the agent's collector,
change detection and reporter); 5,000 agents and the control plane do not
fit a 2-core machine, so the remaining GPUNodes are written by this bench
under the agent's field manager (`gpu-health-agent`, server-side apply, the
fields the agent owns), heartbeats spread evenly over the heartbeat period.
Measures:

- start-up: from the first Node created (operator already leading, empty
  cluster) to every node judged (`gpuhealth_operator_nodes` sums to N), and
  a cold operator restart over the existing fleet (leading, all judged);
- operator RSS and CPU at rest, API writes per second at rest (the API
  server's own `apiserver_request_total`, by resource, and the operator's
  `gpuhealth_operator_api_requests_total`);
- single faults: an uncorrectable ECC error on one node at a time; latency =
  the Node seen unschedulable by a watch minus the fact's `observedTime`;
- a burst on 1 % of the nodes at once: operator CPU, per-node latency, last
  cordon after the last fault write.

    KUBEBUILDER_ASSETS=$(hack/testbin.sh) PYTHONPATH=tests/support \
        .venv/bin/python bench/operator_scale.py [--quick]
Goals: RSS ≤ 200 MB (aim 100 MB); single-fault p99 ≤ 1 s (aim 100 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import os
import platform
import re
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

import common
import urllib3
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import resources
from gpuhealth_operator.client import kube
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.fleet import agentpool, fleetfile

ROOT = common.ROOT

LABEL = {"gpuhealth.io/bench": "scale"}
POLICY = "scale"
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
CLOCK_TICKS = common.CLOCK_TICKS
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
GPUNODES = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}"


# -- process figures --------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` in a Prometheus text exposition whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def own_latency_quantile(before: str, after: str, q: float) -> float | None:
    """The q-quantile (0..1) of `gpuhealth_operator_event_to_write_seconds` observed between two /metrics
    pages, as the upper bound of its bucket (Prometheus' histogram_quantile without interpolation)."""
    name = "gpuhealth_operator_event_to_write_seconds_bucket"
    grown: dict[float, float] = {}
    for page, sign in ((after, 1.0), (before, -1.0)):
        for le, count in by_label(page, name, "le").items():
            grown[float(le)] = grown.get(float(le), 0.0) + sign * count
    total = grown.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return next(le for le in sorted(grown) if grown[le] >= q * total)


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Samples of `name` summed by one label's value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            match = re.search(rf'{label}="([^"]*)"', head)
            if match:
                out[match[1]] = out.get(match[1], 0.0) + float(value)
    return out


def apiserver_writes(api: client.ApiClient) -> dict[str, float]:
    """The API server's count of write requests so far, by resource[/subresource]."""
    headers = {"Accept": "text/plain"}
    token = api.configuration.api_key.get("authorization")
    if token:
        headers["Authorization"] = token
    response = api.call_api("GET", f"{api.configuration.host}/metrics", header_params=headers)
    text = response.read().decode()  # type: ignore[no-untyped-call]  # kubernetes ships no hints for it
    counts: dict[str, float] = {}
    pattern = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
    for line in text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
        if labels.get("verb") not in WRITE_VERBS:
            continue
        key = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
        counts[key] = counts.get(key, 0.0) + float(match[2])
    return counts


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    keys = set(before) | set(after)
    out = {k: round((after.get(k, 0.0) - before.get(k, 0.0)) / seconds, 2) for k in sorted(keys)}
    return {k: v for k, v in out.items() if v > 0}


# -- the bench's own writer (the agent's field manager) ---------------------------------------------


class Writer:
    """An asyncio client on its own thread: GPUNodes written as the agent would, cheaply."""

    def __init__(self, kubeconfig: Path, concurrency: int = 16) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="bench-writer")
        self.thread.start()
        self.gate: asyncio.Semaphore | None = None
        self.api: kube.Kube | None = None
        self.run(self._open(kubeconfig, concurrency))
        self.held: set[str] = set()
        """Nodes under a fault trial: the heartbeat trickle leaves them alone."""
        self.heartbeats = 0
        self.observed: dict[str, str] = {}
        """Per node, when its (healthy) facts were observed: an agent's heartbeat does not restamp them."""

    async def _open(self, kubeconfig: Path, concurrency: int) -> None:
        credentials = await kube.load_credentials(kubeconfig)
        self.api = kube.Kube(credentials, pool_size=concurrency, user_agent="gpu-health-bench")
        self.gate = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(self.api.get("/version") for _ in range(concurrency)))

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def report(self, name: str, status: dict[str, Any]) -> None:
        assert self.api is not None and self.gate is not None
        async with self.gate:
            await self.api.apply(
                f"{GPUNODES}/{name}/status",
                {"apiVersion": resources.API_VERSION, "kind": resources.GPUNODE_KIND, "status": status},
                resources.AGENT_FIELD_MANAGER,
            )

    async def create(self, name: str, uid: str, heartbeat: int) -> None:
        assert self.api is not None and self.gate is not None
        body = {
            "apiVersion": resources.API_VERSION,
            "kind": resources.GPUNODE_KIND,
            "metadata": {
                "name": name,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}],
            },
        }
        async with self.gate:
            await self.api.create(GPUNODES, body)
        await self.report(name, self.healthy(name, heartbeat))

    def healthy(self, name: str, heartbeat: int) -> dict[str, Any]:
        """The node's healthy facts with a fresh heartbeat, as an agent's heartbeat write carries them."""
        observed = self.observed.setdefault(name, gpunode_facts.rfc3339())
        return gpunode_facts.agent_status(heartbeat_seconds=heartbeat, observed=observed)

    async def create_all(self, nodes: dict[str, str], heartbeat: int) -> None:
        await asyncio.gather(*(self.create(name, uid, heartbeat) for name, uid in nodes.items()))

    async def trickle(self, names: list[str], heartbeat: int, stop: threading.Event) -> None:
        """Each node's heartbeat once per period, spread evenly, as the agents' own would be."""
        step = heartbeat / max(1, len(names))
        index = 0
        started = time.monotonic()
        while not stop.is_set():
            name = names[index % len(names)]
            if name not in self.held:
                with contextlib.suppress(kube.ApiError, OSError, asyncio.TimeoutError):
                    await self.report(name, self.healthy(name, heartbeat))
                    self.heartbeats += 1
            index += 1
            await asyncio.sleep(max(0.0, started + index * step - time.monotonic()))

    async def faults(self, names: Iterable[str], heartbeat: int) -> dict[str, float]:
        stamped: dict[str, float] = {}

        async def one(name: str) -> None:
            observed = datetime.datetime.now(datetime.UTC)
            stamped[name] = observed.timestamp()
            status = gpunode_facts.agent_status(
                overrides=ECC, observed=gpunode_facts.rfc3339(observed), heartbeat_seconds=heartbeat
            )
            await self.report(name, status)

        await asyncio.gather(*(one(n) for n in names))
        return stamped

    async def heal(self, names: Iterable[str], heartbeat: int) -> None:
        for name in names:
            self.observed[name] = gpunode_facts.rfc3339()  # the healthy facts are new facts
        await asyncio.gather(*(self.report(n, self.healthy(n, heartbeat)) for n in names))

    def close(self) -> None:
        if self.api is not None:
            self.run(self.api.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


# -- watching Nodes ---------------------------------------------------------------------------------


class CordonWatch:
    """When each Node is first seen unschedulable (and schedulable again), from one list's version on.

    Resumes from the last resourceVersion, so 5,000 Nodes are never listed again.
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.cordoned: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        page = self.core.list_node(label_selector=_selector(), limit=1, _preload_content=False)
        self.version = common.body(page)["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch()
            except (client.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
                # A broken stream (the API server under load ends it) is watched again from the last version.
                logging.warning("node watch ended (%s); watching again", error)
                time.sleep(0.5)

    def _watch(self) -> None:
        response = self.core.list_node(
            label_selector=_selector(),
            watch=True,
            resource_version=self.version,
            allow_watch_bookmarks=True,
            timeout_seconds=120,
            _preload_content=False,
        )
        try:
            for line in common.lines(response):
                event = json.loads(line)
                node = event.get("object") or {}
                if event.get("type") == "ERROR":  # 410: the version is gone; list it anew
                    page = self.core.list_node(label_selector=_selector(), limit=1, _preload_content=False)
                    self.version = common.body(page)["metadata"]["resourceVersion"]
                    return
                self.version = (node.get("metadata") or {}).get("resourceVersion", self.version)
                if event.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                now = time.time()
                name = node["metadata"]["name"]
                with self.lock:
                    if (node.get("spec") or {}).get("unschedulable"):
                        self.cordoned.setdefault(name, now)
                    else:
                        self.cordoned.pop(name, None)
                if self.stop.is_set():
                    return
        finally:
            common.raw(response).release_conn()

    def seen(self, name: str) -> float | None:
        with self.lock:
            return self.cordoned.get(name)


def _selector() -> str:
    return ",".join(f"{k}={v}" for k, v in LABEL.items())


# -- the run ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    nodes: int
    agents: int
    trials: int
    burst_percent: float
    heartbeat: int
    interval: float
    idle_seconds: float
    kwok_lease_seconds: int


def fleet_spec(plan: Plan) -> fleetfile.Fleet:
    return fleetfile.parse(
        {
            "seed": 1,
            "agent": {"intervalSeconds": plan.interval, "heartbeatSeconds": plan.heartbeat},
            "labels": LABEL,
            "pools": [
                {
                    "name": "agent",
                    "count": max(1, plan.agents),
                    "gpu": {"model": gpunode_facts.MODEL, "count": 8},
                    "scenario": str(ROOT / "examples" / "scenarios" / "demo-healthy.yaml"),
                },
                {
                    "name": "direct",
                    "count": max(1, plan.nodes - plan.agents),
                    "gpu": {"model": gpunode_facts.MODEL, "count": 8},
                    "scenario": str(ROOT / "examples" / "scenarios" / "demo-healthy.yaml"),
                },
            ],
        },
        source="bench",
    )


def judged(operator: operator_harness.OperatorProcess, health: str | None = None) -> float:
    """Nodes with a verdict (of that health): a GPUNode without its first report is judged Unknown."""
    labels = {"policy": POLICY, **({"health": health} if health else {})}
    try:
        return metric_sum(operator.metrics(), "gpuhealth_operator_nodes", **labels)
    except OSError:
        return 0.0


def measure(plan: Plan, workdir: Path, results: dict[str, Any]) -> None:
    plane = local.ControlPlane(
        binaries.locate(cwd=ROOT), workdir / "cp", kwok_lease_seconds=plan.kwok_lease_seconds
    )
    plane.start()
    operator: operator_harness.OperatorProcess | None = None
    writer: Writer | None = None
    sim: agentpool.Fleet | None = None
    stop_trickle = threading.Event()
    try:
        common.install_crds(plane)
        configuration = plane.api_client().configuration
        configuration.connection_pool_maxsize = 80
        api = client.ApiClient(configuration)
        operator_harness.ensure_namespace(api, "gpu-health")
        assert apiserver_writes(api), "the API server's /metrics has no write counts"
        harness = operator_harness.Fleet(api, label="unused")
        harness.policy(
            POLICY,
            {
                "nodeSelector": {"matchLabels": LABEL},
                "maxUnavailable": "10%",
                "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                "recovery": {"uncordon": True, "healthyForSeconds": 0},
            },
        )
        operator = operator_harness.OperatorProcess(
            kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator.log", identity="bench"
        ).start()
        first = operator  # not None, for the lambdas below (`operator` is the restarted one later)
        waiting.wait_until(operator.is_leading, timeout_seconds=60, message="operator leads")
        assert operator.pid is not None
        time.sleep(2)
        results["rss_empty_mib"] = round(rss_mib(operator.pid), 1)

        # -- from zero to every node judged ------------------------------------------------------
        spec = fleet_spec(plan)
        agent_plans = tuple(p for p in spec.nodes if p.pool == "agent")[: plan.agents]
        direct_plans = tuple(p for p in spec.nodes if p.pool == "direct")[: plan.nodes - plan.agents]
        everything = dataclasses.replace(spec, nodes=agent_plans + direct_plans)
        began = time.monotonic()
        agentpool.Fleet(everything, api, workers=32).create_nodes()
        results["create_nodes_seconds"] = round(time.monotonic() - began, 1)
        print(f"{plan.nodes} Nodes created in {results['create_nodes_seconds']} s", flush=True)
        sim = agentpool.Fleet(dataclasses.replace(spec, nodes=agent_plans), api)
        if agent_plans:
            sim.start()
        writer = Writer(Path(plane.kubeconfig))
        direct = {p.name for p in direct_plans}
        listed = common.body(
            client.CoreV1Api(api).list_node(label_selector=_selector(), _preload_content=False)
        )["items"]
        uids = {
            n["metadata"]["name"]: n["metadata"]["uid"] for n in listed if n["metadata"]["name"] in direct
        }
        writer.run(writer.create_all(uids, plan.heartbeat))
        results["direct_gpunodes_written_seconds"] = round(time.monotonic() - began, 1)
        print(
            f"{len(uids)} GPUNodes written by the bench after {results['direct_gpunodes_written_seconds']} s"
        )
        names = sorted(direct)
        trickle = writer.submit(writer.trickle(names, plan.heartbeat, stop_trickle))
        waiting.wait_until(
            lambda: judged(first, "Healthy") >= plan.nodes,
            timeout_seconds=1800,
            interval_seconds=1,
            message="every node judged",
        )
        results["startup_from_zero_seconds"] = round(time.monotonic() - began, 1)
        print(f"every node judged {results['startup_from_zero_seconds']} s after the first Node", flush=True)

        # -- at rest -----------------------------------------------------------------------------
        time.sleep(30)  # idle connections close, the timer's full pass trims the heap
        results["rss_settled_mib"] = round(rss_mib(operator.pid), 1)
        results["rss_per_node_kib"] = round(
            (results["rss_settled_mib"] - results["rss_empty_mib"]) * 1024 / plan.nodes, 1
        )
        writes0, cpu0 = apiserver_writes(api), cpu_seconds(operator.pid)
        children0 = common.children_cpu_seconds()
        t0 = time.monotonic()
        ops0 = metric_sum(operator.metrics(), "gpuhealth_operator_api_requests_total")
        verbs0 = by_label(operator.metrics(), "gpuhealth_operator_api_requests_total", "verb")
        events0, idle_cpu0 = (
            metric_sum(operator.metrics(), "gpuhealth_operator_events_total"),
            cpu_seconds(operator.pid),
        )
        time.sleep(plan.idle_seconds)
        wall = time.monotonic() - t0
        # CPU per watch event at rest (issue 52: ≤ 1 ms at 5,000 nodes): the operator's CPU over the window
        # (timer and resync included) divided by the Node and GPUNode events it handled.
        events = metric_sum(operator.metrics(), "gpuhealth_operator_events_total") - events0
        results["idle_events_per_second"] = round(events / wall, 2)
        results["idle_operator_cpu_ms_per_event"] = (
            round(1000 * (cpu_seconds(operator.pid) - idle_cpu0) / events, 3) if events else None
        )
        children1 = common.children_cpu_seconds()
        writes = rates(writes0, apiserver_writes(api), wall)
        results["idle_window_seconds"] = round(wall)
        results["idle_operator_cpu_millicores"] = round(1000 * (cpu_seconds(operator.pid) - cpu0) / wall, 1)
        results["idle_operator_requests_per_second"] = round(
            (metric_sum(operator.metrics(), "gpuhealth_operator_api_requests_total") - ops0) / wall, 2
        )
        results["idle_operator_requests_by_verb"] = rates(
            verbs0, by_label(operator.metrics(), "gpuhealth_operator_api_requests_total", "verb"), wall
        )
        results["idle_api_writes_per_second"] = round(sum(writes.values()), 1)
        results["idle_api_writes_by_resource"] = writes
        results["idle_cpu_cores_by_process"] = {
            k: round((children1.get(k, 0.0) - children0.get(k, 0.0)) / wall, 3) for k in sorted(children1)
        }
        results["rss_idle_mib"] = round(rss_mib(operator.pid), 1)
        print(f"at rest: {json.dumps({k: results[k] for k in results if k.startswith('idle')})}", flush=True)

        # -- single faults -----------------------------------------------------------------------
        watch = CordonWatch(api)
        time.sleep(1)
        single: list[float] = []
        own_before = operator.metrics()
        step = max(1, len(names) // max(1, plan.trials))
        for name in names[::step][: plan.trials]:
            writer.held.add(name)
            stamped = writer.run(writer.faults([name], plan.heartbeat))
            seen = waiting.wait_until(
                functools.partial(watch.seen, name),
                timeout_seconds=60,
                message=f"{name} cordoned",
                interval_seconds=0.02,
            )
            single.append(seen - stamped[name])
            writer.run(writer.heal([name], plan.heartbeat))
            waiting.wait_until(
                functools.partial(common.uncordoned, watch, name),
                timeout_seconds=60,
                message=f"{name} uncordoned",
            )
            writer.held.discard(name)
        results["single_trials"] = len(single)
        results["single_p50_seconds"] = round(percentile(single, 50), 3)
        results["single_p99_seconds"] = round(percentile(single, 99), 3)
        results["single_max_seconds"] = round(max(single), 3)
        # The operator's own share (event received → first write sent), every pass that wrote in the trials
        # (the heal's too): bucket upper bounds (issue 52's target: p99 ≤ 20 ms at 5,000 nodes).
        own_after = operator.metrics()
        results["single_own_p50_seconds_at_most"] = own_latency_quantile(own_before, own_after, 0.5)
        results["single_own_p99_seconds_at_most"] = own_latency_quantile(own_before, own_after, 0.99)
        print(f"single faults: p50 {results['single_p50_seconds']} s, p99 {results['single_p99_seconds']} s")

        # -- a burst on 1 % of the nodes -----------------------------------------------------------
        count = max(1, round(plan.nodes * plan.burst_percent / 100))
        burst = names[1::step][:count] if len(names[1::step]) >= count else names[-count:]
        writer.held.update(burst)
        time.sleep(2)
        cpu0, t0 = cpu_seconds(operator.pid), time.monotonic()
        ops0 = metric_sum(operator.metrics(), "gpuhealth_operator_api_requests_total")
        own_before = operator.metrics()
        stamped = writer.run(writer.faults(burst, plan.heartbeat))
        last_write = time.time()
        waiting.wait_until(
            lambda: all(watch.seen(n) for n in burst), timeout_seconds=300, message="burst cordoned"
        )
        seen_at = {n: watch.seen(n) or 0.0 for n in burst}
        latencies = [seen_at[n] - stamped[n] for n in burst]
        wall = time.monotonic() - t0
        results["burst_nodes"] = count
        results["burst_fault_writes_span_seconds"] = round(last_write - min(stamped.values()), 2)
        results["burst_last_cordon_after_last_write_seconds"] = round(max(seen_at.values()) - last_write, 3)
        results["burst_p50_seconds"] = round(percentile(latencies, 50), 3)
        results["burst_p99_seconds"] = round(percentile(latencies, 99), 3)
        results["burst_operator_cpu_seconds"] = round(cpu_seconds(operator.pid) - cpu0, 2)
        results["burst_operator_cpu_cores"] = round((cpu_seconds(operator.pid) - cpu0) / wall, 2)
        results["burst_operator_requests"] = int(
            metric_sum(operator.metrics(), "gpuhealth_operator_api_requests_total") - ops0
        )
        results["rss_after_burst_mib"] = round(rss_mib(operator.pid), 1)
        own_after = operator.metrics()
        results["burst_own_p50_seconds_at_most"] = own_latency_quantile(own_before, own_after, 0.5)
        results["burst_own_p99_seconds_at_most"] = own_latency_quantile(own_before, own_after, 0.99)
        print(f"burst of {count}: p99 {results['burst_p99_seconds']} s", flush=True)
        writer.run(writer.heal(burst, plan.heartbeat))
        waiting.wait_until(
            lambda: not any(watch.seen(n) for n in burst), timeout_seconds=300, message="burst uncordoned"
        )
        writer.held.difference_update(burst)
        watch.stop.set()

        # -- a cold operator restart over the fleet ----------------------------------------------
        operator.stop()
        first_log = operator.log()
        Path("/tmp/gpuhealth-bench-scale-operator-1.log").write_text(first_log)
        errors = len(re.findall(r"reconcile of node .* failed", first_log))
        # What failed, by the error's kind (the text after "failed (will retry): ", first 60 characters).
        results["reconcile_errors_by_kind"] = dict(
            collections.Counter(
                m[:60] for m in re.findall(r"reconcile of node \S+ failed \(will retry\): (.*)", first_log)
            ).most_common(5)
        )
        began = time.monotonic()
        operator = operator_harness.OperatorProcess(
            kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator-2.log", identity="bench-2"
        ).start()
        waiting.wait_until(operator.is_leading, timeout_seconds=120, message="second operator leads")
        results["restart_leading_seconds"] = round(time.monotonic() - began, 1)
        waiting.wait_until(
            lambda: judged(operator) >= plan.nodes,
            timeout_seconds=900,
            interval_seconds=0.5,
            message="every node judged again",
        )
        results["restart_all_judged_seconds"] = round(time.monotonic() - began, 1)
        assert operator.pid is not None
        results["restart_rss_mib"] = round(rss_mib(operator.pid), 1)
        results["reconcile_errors_logged"] = errors
        if sim is not None:
            results["agent_writes"] = sim.stats.writes
            results["agent_write_failures"] = sim.stats.write_failures
            results["agent_late_turns"] = sim.stats.late_turns
        results["bench_heartbeats_written"] = writer.heartbeats
        stop_trickle.set()
        with contextlib.suppress(Exception):
            trickle.result(timeout=10)
    finally:
        stop_trickle.set()
        if sim is not None:
            sim.stop()
        if writer is not None:
            writer.close()
        if operator is not None:
            Path("/tmp/gpuhealth-bench-scale-operator.log").write_text(operator.log())
            operator.stop()
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="300 nodes, 100 agents, 10 trials, 30 s at rest")
    parser.add_argument("--nodes", type=int, help="default 5000 (--quick: 300)")
    parser.add_argument("--agents", type=int, help="nodes run by real agents (default 1000; --quick: 100)")
    parser.add_argument("--trials", type=int, help="single faults (default 30; --quick: 10)")
    parser.add_argument("--burst-percent", type=float, default=1.0)
    parser.add_argument("--heartbeat", type=int, default=300, help="agents' heartbeat (default 300 s)")
    parser.add_argument("--interval", type=float, default=10.0, help="agents' collection interval")
    parser.add_argument("--idle-seconds", type=float, help="window at rest (default 120; --quick: 30)")
    parser.add_argument(
        "--kwok-lease-seconds",
        type=int,
        default=0,
        help="kwok's node Lease duration (default 0: no Leases; a kubelet's 40 s renews every 10 s, "
        "500 writes/s at 5,000 nodes, which every cluster pays and this 2-core API server cannot take)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    nodes = args.nodes or (300 if args.quick else 5000)
    plan = Plan(
        nodes=nodes,
        agents=min(nodes, args.agents if args.agents is not None else (100 if args.quick else 1000)),
        trials=args.trials or (10 if args.quick else 30),
        burst_percent=args.burst_percent,
        heartbeat=args.heartbeat,
        interval=args.interval,
        idle_seconds=args.idle_seconds or (30 if args.quick else 120),
        kwok_lease_seconds=args.kwok_lease_seconds,
    )
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(["bench/operator_scale.py", *sys.argv[1:]]),
        "load_average_at_start": common.load_average(),
        **dataclasses.asdict(plan),
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-scale-") as tmp:
        try:
            measure(plan, Path(tmp), results)
        finally:
            results["load_average_at_end"] = common.load_average()
            common.report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
