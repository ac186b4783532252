"""Operator latency and footprint on 200 simulated GPU nodes.

Starts a local control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok), creates N kwok GPU Nodes with GPUNodes reporting healthy
GPUs, runs the operator as a subprocess, and measures:

- single fault: an uncorrectable ECC error on one node at a time (20 trials);
  latency = the Node seen unschedulable by a watch minus the fact's
  `observedTime` in GPUNode status (what the agent would stamp);
- burst: the same fault on all N nodes at once; per-node latency as above,
  and the time from the first fault written to the last node cordoned;
- operator RSS before and after the fleet exists (per node = delta / N);
- API requests per second sent by the operator's reconciler (its metric),
  at rest and during the burst.

Usage: PYTHONPATH=tests/support .venv/bin/python bench/operator_latency.py [--nodes 200] [--trials 20]
Goals: single-fault p99 <= 1 s; burst all cordoned <= 5 s; <= 40 KB RSS per node.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime
import functools
import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import resources
from gpuhealth_operator.client import kube
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local

ROOT = common.ROOT
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks (USER_HZ = 100)


def api_requests(process: operator_harness.OperatorProcess) -> float:
    total = 0.0
    for line in process.metrics().splitlines():
        if line.startswith("gpuhealth_operator_api_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def burst_requests(plane: local.ControlPlane, start: float, cordoned: float, nodes: int) -> dict[str, Any]:
    """The operator's requests from the first fault on, by the API server's audit log: how many per
    cordon (writes by kind), and the API server's time per request (received → response complete),
    overall and up to the last cordon (the urgent part)."""
    kinds: dict[str, int] = {}
    latencies: list[float] = []
    urgent: list[float] = []
    for line in plane.audit_log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("stage") != "ResponseComplete" or not entry.get("userAgent", "").startswith(
            "gpu-health-operator"
        ):
            continue
        received = datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp()
        ref = entry.get("objectRef") or {}
        if received < start or ref.get("resource") == "leases" or entry["verb"] in ("watch", "list"):
            continue
        if f"fieldManager={resources.AGENT_FIELD_MANAGER}" in entry.get("requestURI", ""):
            continue  # the bench's own fault writes (its client is the operator's, with its user agent)
        done = datetime.datetime.fromisoformat(entry["stageTimestamp"]).timestamp()
        latencies.append(done - received)
        if received <= cordoned:
            urgent.append(done - received)
        what = "/".join(str(ref[k]) for k in ("resource", "subresource") if ref.get(k))
        kinds[f"{entry['verb']} {what}"] = kinds.get(f"{entry['verb']} {what}", 0) + 1
    writes = sum(n for k, n in kinds.items() if not k.startswith("get "))
    return {
        "burst_requests_by_kind": dict(sorted(kinds.items())),
        "burst_writes_per_cordon": round(writes / nodes, 2),
        "burst_requests_per_cordon": round(len(latencies) / nodes, 2),
        "burst_api_seconds_total": round(sum(latencies), 2),
        "burst_api_ms_per_request_p50": round(percentile(latencies, 50) * 1000, 1),
        "burst_api_ms_per_request_p99": round(percentile(latencies, 99) * 1000, 1),
        "burst_api_seconds_until_last_cordon": round(sum(urgent), 2),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def inject_faults(kubeconfig: Path, names: list[str], concurrency: int = 16) -> dict[str, float]:
    """Write the ECC fault to every node's GPUNode at once, as its agent would; return when each was stamped.

    An asyncio client, so that the bench's own CPU (threads of the synchronous
    client cost ~3x more per request) does not stretch the burst it measures.
    """
    credentials = await kube.load_credentials(kubeconfig)
    api = kube.Kube(credentials, pool_size=concurrency)
    observed_at: dict[str, float] = {}
    gate = asyncio.Semaphore(concurrency)

    async def fault(name: str) -> None:
        async with gate:
            observed = datetime.datetime.now(datetime.UTC)
            observed_at[name] = observed.timestamp()
            status = gpunode_facts.agent_status(overrides=ECC, observed=gpunode_facts.rfc3339(observed))
            await api.request(
                "PATCH",
                f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}/{name}/status",
                query={"fieldManager": resources.AGENT_FIELD_MANAGER, "force": "true"},
                body={"apiVersion": resources.API_VERSION, "kind": resources.GPUNODE_KIND, "status": status},
                content_type="application/apply-patch+yaml",
            )

    try:
        # Agents keep their connections open: have them before the first fault, as a fleet would.
        await asyncio.gather(*(api.get("/version") for _ in range(concurrency)))
        await asyncio.gather(*(fault(name) for name in names))
    finally:
        await api.close()
    return observed_at


class CordonWatch:
    """Records when each node of the fleet is first seen unschedulable (and schedulable again)."""

    def __init__(self, api: client.ApiClient, label: str) -> None:
        self.api = api
        self.selector = f"{operator_harness.Fleet.LABEL_KEY}={label}"
        self.cordoned: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CordonWatch:
        self.thread.start()
        return self

    def _run(self) -> None:
        # Raw JSON lines, not client models: building a V1Node per event costs milliseconds of the
        # CPU this 2-core machine shares with the API server and the operator.
        core = client.CoreV1Api(self.api)
        while not self.stop.is_set():
            response = core.list_node(
                label_selector=self.selector, watch=True, timeout_seconds=30, _preload_content=False
            )
            for line in common.lines(response):
                event = json.loads(line)
                if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                    break  # ERROR (resource version too old) or BOOKMARK: list and watch again
                node = event["object"]
                now = time.time()
                name = node["metadata"]["name"]
                with self.lock:
                    if (node.get("spec") or {}).get("unschedulable"):
                        self.cordoned.setdefault(name, now)
                    else:
                        self.cordoned.pop(name, None)
                if self.stop.is_set():
                    break
            common.raw(response).release_conn()

    def seen(self, name: str) -> float | None:
        with self.lock:
            return self.cordoned.get(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    results: dict[str, Any] = {
        "nodes": args.nodes,
        "load_average_at_start": Path("/proc/loadavg").read_text().split()[0],
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-") as tmp:
        workdir = Path(tmp)
        plane = local.ControlPlane(binaries.locate(cwd=ROOT), workdir / "cp")
        plane.start()
        try:
            common.install_crds(plane)
            api = plane.api_client()
            operator_harness.ensure_namespace(api, "gpu-health")
            fleet = operator_harness.Fleet(api, label="bench")
            fleet.policy(
                "bench",
                {
                    "maxUnavailable": "100%",
                    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                    "recovery": {"uncordon": True, "healthyForSeconds": 0},
                },
            )
            operator = operator_harness.OperatorProcess(
                kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator.log", identity="bench"
            ).start()
            waiting.wait_until(operator.is_leading, timeout_seconds=60, message="operator leads")
            pid = operator.pid
            assert pid is not None
            time.sleep(2)
            rss_empty = rss_kib(pid)

            names = [f"bench-gpu-{i:03d}" for i in range(args.nodes)]
            half = args.nodes // 2

            def judged(count: int) -> bool:
                listed = client.CoreV1Api(api).list_node(
                    label_selector=f"{operator_harness.Fleet.LABEL_KEY}=bench"
                )
                labelled = common.health_labelled(listed.items)
                return labelled == count

            def settled_rss() -> int:
                # Idle API connections close after 15 s and the timer's full pass returns freed heap.
                time.sleep(25)
                return rss_kib(pid)

            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(fleet.add_node, names[:half]))
            waiting.wait_until(
                lambda: judged(half), timeout_seconds=120, message="first half judged", interval_seconds=0.5
            )
            rss_half = settled_rss()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(fleet.add_node, names[half:]))
            results["fleet_create_seconds"] = round(time.monotonic() - started - 25, 1)
            waiting.wait_until(
                lambda: judged(len(names)),
                timeout_seconds=120,
                message="every node judged",
                interval_seconds=0.5,
            )
            rss_full = settled_rss()
            results["rss_empty_mib"] = round(rss_empty / 1024, 1)
            results["rss_half_mib"] = round(rss_half / 1024, 1)
            results["rss_full_mib"] = round(rss_full / 1024, 1)
            results["rss_per_node_kib_total"] = round((rss_full - rss_empty) / args.nodes, 1)
            results["rss_per_node_kib_marginal"] = round((rss_full - rss_half) / (args.nodes - half), 1)
            before, t_before = api_requests(operator), time.monotonic()
            time.sleep(10)
            results["idle_requests_per_second"] = round(
                (api_requests(operator) - before) / (time.monotonic() - t_before), 2
            )

            watcher = CordonWatch(api, "bench").start()
            time.sleep(1)

            # Single faults, one node at a time.
            single: list[float] = []
            for name in names[: args.trials]:
                observed = datetime.datetime.now(datetime.UTC)
                fleet.report(
                    name, gpunode_facts.agent_status(overrides=ECC, observed=gpunode_facts.rfc3339(observed))
                )
                seen = waiting.wait_until(
                    functools.partial(watcher.seen, name), timeout_seconds=30, message=f"{name} cordoned"
                )
                single.append(seen - observed.timestamp())
                fleet.report(name, gpunode_facts.agent_status())
                waiting.wait_until(
                    functools.partial(common.uncordoned, watcher, name),
                    timeout_seconds=30,
                    message=f"{name} uncordoned",
                )
            results["single_p50_seconds"] = round(percentile(single, 50), 3)
            results["single_p99_seconds"] = round(percentile(single, 99), 3)
            results["single_max_seconds"] = round(max(single), 3)

            # Burst: every node at once.
            time.sleep(2)
            before, t_before = api_requests(operator), time.monotonic()
            cpu_before = cpu_seconds(pid)
            observed_at = asyncio.run(inject_faults(Path(plane.kubeconfig), names))
            last_write = time.time()
            burst_start = min(observed_at.values())
            results["burst_write_seconds"] = round(last_write - burst_start, 2)
            waiting.wait_until(
                lambda: all(watcher.seen(n) for n in names), timeout_seconds=120, message="all cordoned"
            )
            seen_at = {n: watcher.seen(n) or 0.0 for n in names}
            burst = [seen_at[n] - observed_at[n] for n in names]
            results["burst_all_cordoned_seconds"] = round(max(seen_at.values()) - burst_start, 3)
            results["burst_last_cordon_after_last_write_seconds"] = round(
                max(seen_at.values()) - last_write, 3
            )
            results["burst_p50_seconds"] = round(percentile(burst, 50), 3)
            results["burst_p99_seconds"] = round(percentile(burst, 99), 3)
            results["burst_requests_per_second"] = round(
                (api_requests(operator) - before) / (time.monotonic() - t_before), 1
            )
            results["burst_operator_cpu_seconds"] = round(cpu_seconds(pid) - cpu_before, 1)
            time.sleep(10)  # the deferred writes (status, Events) of the burst land
            results.update(burst_requests(plane, burst_start, max(seen_at.values()), len(names)))
            api_seconds = results["burst_api_seconds_total"]
            results["burst_operator_cpu_over_api_seconds"] = (
                round(results["burst_operator_cpu_seconds"] / api_seconds, 4) if api_seconds else None
            )
            results["rss_after_burst_mib"] = round(rss_kib(pid) / 1024, 1)
            watcher.stop.set()
            operator.stop()
            errors = re.findall(r"reconcile of node .* failed", operator.log())
            results["reconcile_errors_logged"] = len(errors)
            results["conflicts_logged"] = operator.log().count("409")
            Path("/tmp/gpuhealth-bench-operator.log").write_text(operator.log())
        finally:
            plane.stop()

    print(common.machine_line())
    for key, value in results.items():
        print(f"{key}: {value}")
    print(f"single fault p50 {statistics.median(single):.3f}s" if single else "")


if __name__ == "__main__":
    main()
