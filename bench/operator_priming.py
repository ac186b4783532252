"""Operator RSS while it primes its cache over an existing fleet, and again after a lost Lease.

Starts the local control plane, one policy, N kwok GPU Nodes and their
GPUNodes (8 GPUs each, healthy facts written under the agent's field manager
by `operator_scale.Writer`; no agents run). Then:

1. an operator on the empty cluster: its RSS once leading (the fixed cost);
2. the fleet is written, then a fresh operator starts over it (a cold start:
   our priming LIST, kopf's listing, every node judged): the peak of RSS
   sampled every 50 ms from its start until 20 s after every node is judged,
   and RSS at that moment (settled);
3. the Lease is taken from it (another holder, 3 s duration): the operator
   stops acting and campaigns again; its new term primes again (and kopf
   lists again): the peak from the theft until 20 s after it leads again
   with every node judged, and RSS at that moment.

    KUBEBUILDER_ASSETS=$(hack/testbin.sh) PYTHONPATH=tests/support \
        .venv/bin/python bench/operator_priming.py --nodes 1500
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
import operator_scale
from kubernetes import client

import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.fleet import agentpool

ROOT = common.ROOT

SETTLE_SECONDS = 20.0


class RssSampler:
    """The operator's RSS every `interval` seconds on a thread; the peak since the last `reset`."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0.0
        self.timeline: list[tuple[float, float]] = []
        """(wall-clock time, RSS MiB) of every sample."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = operator_scale.rss_mib(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, rss)
            self.timeline.append((time.time(), rss))
            time.sleep(self.interval)

    def reset(self) -> None:
        self.peak = 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


KOPF_STARTED = "Initial authentication has finished"
"""kopf logs this once it runs: the term's own priming is over."""


def primed_peaks(log: str, timeline: list[tuple[float, float]], began: list[float]) -> list[float]:
    """Per term (begun at `began`, wall clock), the peak RSS until kopf started: our priming alone."""
    started: list[float] = []
    for line in log.splitlines():
        if KOPF_STARTED in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            started.append(stamp.replace(tzinfo=datetime.UTC).timestamp())
    return [
        max((rss for t, rss in timeline if since <= t <= until), default=0.0)
        for since, until in zip(began, started, strict=False)
    ]


def steal_lease(api: client.ApiClient, name: str) -> None:
    """Another holder takes the Lease (3 s duration, never renewed): the operator's term ends."""
    coordination = client.CoordinationV1Api(api)
    lease = coordination.read_namespaced_lease(name, "gpu-health")
    assert lease.spec is not None, "the operator's Lease has a spec"
    now = datetime.datetime.now(datetime.UTC)
    lease.spec.holder_identity = "bench-thief"
    lease.spec.lease_duration_seconds = 3
    lease.spec.renew_time = now
    lease.spec.acquire_time = now
    coordination.replace_namespaced_lease(name, "gpu-health", lease)


def measure(nodes: int, workdir: Path, results: dict[str, Any]) -> None:
    plane = local.ControlPlane(binaries.locate(cwd=ROOT), workdir / "cp")
    plane.start()
    operator: operator_harness.OperatorProcess | None = None
    writer: operator_scale.Writer | None = None
    try:
        common.install_crds(plane)
        configuration = plane.api_client().configuration
        configuration.connection_pool_maxsize = 40
        api = client.ApiClient(configuration)
        operator_harness.ensure_namespace(api, "gpu-health")
        operator_harness.Fleet(api, label="unused").policy(
            operator_scale.POLICY,
            {
                "nodeSelector": {"matchLabels": operator_scale.LABEL},
                "maxUnavailable": "10%",
                "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
            },
        )

        def start(identity: str) -> operator_harness.OperatorProcess:
            process = operator_harness.OperatorProcess(
                kubeconfig=Path(plane.kubeconfig), log_path=workdir / f"{identity}.log", identity=identity
            ).start()
            waiting.wait_until(process.is_leading, timeout_seconds=120, message=f"{identity} leads")
            return process

        operator = start("empty")
        assert operator.pid is not None
        time.sleep(5)
        results["rss_empty_cluster_mib"] = round(operator_scale.rss_mib(operator.pid), 1)
        operator.stop()

        plan = operator_scale.Plan(nodes + 1, 1, 0, 0.0, 300, 10.0, 0.0, 0)
        spec = operator_scale.fleet_spec(plan)
        direct = tuple(p for p in spec.nodes if p.pool == "direct")[:nodes]
        began = time.monotonic()
        agentpool.Fleet(dataclasses.replace(spec, nodes=direct), api, workers=32).create_nodes()
        listed = common.body(
            client.CoreV1Api(api).list_node(label_selector=operator_scale._selector(), _preload_content=False)
        )["items"]
        uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in listed}
        writer = operator_scale.Writer(Path(plane.kubeconfig))
        writer.run(writer.create_all(uids, 300))
        results["fleet_written_seconds"] = round(time.monotonic() - began, 1)
        print(f"{len(uids)} Nodes and GPUNodes written in {results['fleet_written_seconds']} s", flush=True)

        operator = operator_harness.OperatorProcess(
            kubeconfig=Path(plane.kubeconfig), log_path=workdir / "primed.log", identity="primed"
        ).start()
        assert operator.pid is not None
        sampler = RssSampler(operator.pid)
        terms_began = [time.time()]
        began = time.monotonic()
        waiting.wait_until(
            lambda: operator_scale.judged(operator) >= nodes,
            timeout_seconds=900,
            interval_seconds=0.5,
            message="every node judged",
        )
        results["cold_start_all_judged_seconds"] = round(time.monotonic() - began, 1)
        time.sleep(SETTLE_SECONDS)
        results["cold_start_peak_rss_mib"] = round(sampler.peak, 1)
        results["cold_start_settled_rss_mib"] = round(operator_scale.rss_mib(operator.pid), 1)
        results["cold_start_cpu_seconds"] = round(operator_scale.cpu_seconds(operator.pid), 1)

        sampler.reset()
        terms_began.append(time.time())
        steal_lease(api, operator.lease_name)
        waiting.wait_until(
            lambda: "campaigning again" in operator.log(), timeout_seconds=60, message="term lost"
        )
        began = time.monotonic()
        waiting.wait_until(operator.is_leading, timeout_seconds=120, message="leads again")
        waiting.wait_until(
            lambda: operator_scale.judged(operator) >= nodes,
            timeout_seconds=900,
            interval_seconds=0.5,
            message="every node judged again",
        )
        results["new_term_all_judged_seconds"] = round(time.monotonic() - began, 1)
        time.sleep(SETTLE_SECONDS)
        results["new_term_peak_rss_mib"] = round(sampler.peak, 1)
        results["new_term_settled_rss_mib"] = round(operator_scale.rss_mib(operator.pid), 1)
        results["cpu_seconds_to_new_term_settled"] = round(operator_scale.cpu_seconds(operator.pid), 1)
        sampler.stop()
        results["peak_rss_mib_until_kopf_started_by_term"] = [
            round(p, 1) for p in primed_peaks(operator.log(), sampler.timeline, terms_began)
        ]
        empty = results["rss_empty_cluster_mib"]
        for key in ("cold_start_peak", "cold_start_settled", "new_term_peak", "new_term_settled"):
            results[f"{key}_kib_per_node"] = round((results[f"{key}_rss_mib"] - empty) * 1024 / nodes, 1)
    finally:
        if writer is not None:
            writer.close()
        if operator is not None:
            Path("/tmp/gpuhealth-bench-priming-operator.log").write_text(operator.log())
            operator.stop()
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1500)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(["bench/operator_priming.py", *sys.argv[1:]]),
        "load_average_at_start": common.load_average(),
        "nodes": args.nodes,
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-priming-") as tmp:
        try:
            measure(args.nodes, Path(tmp), results)
        finally:
            results["load_average_at_end"] = common.load_average()
            common.report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
