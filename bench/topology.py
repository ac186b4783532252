"""Topology budgets under a fault burst (issue 28, Measure): 64 kwok nodes, 8 racks x 2 zones, 8 cliques.

Starts a local control plane, creates 64 kwok GPU Nodes with GPUNodes reporting
healthy GPUs (8 racks `r0`..`r7` of 8 nodes; racks r0-r3 in zone `z0`, r4-r7 in
`z1`; 8 NVL72-like cliques of 8 nodes, each straddling two neighbouring racks:
the first half of rack r and the second half of rack r-1), one policy with
`maxUnavailable: 100%` and topology budgets rack 1, zone `10%` (3 of 32) and
clique 1, and runs the operator as a subprocess (default timer, 1 s).

A burst of 12 ECC faults spread unevenly (5 in r0, 3 in r1, 1 in r2, 1 in r3, 2
in r5) is written at once. Each cordoned node is repaired (reported healthy)
`--hold` seconds after its cordon; the operator uncordons it after
`healthyForSeconds` and the budget frees for the next. Measured:

- sampled every 100 ms (a list of the Nodes): the most unschedulable nodes of
  any rack, zone and clique; none may exceed its budget;
- every faulty node is eventually cordoned;
- for each cordon, how long after its budget freed: from the moment all of the
  node's domains last had a free place (a Node watch's timeline) to its
  cordon; the first wave from the fault's write. Goal: the last within 1 s.

Usage: PYTHONPATH=tests/support .venv/bin/python bench/topology.py [--hold 3] [--timeout 300]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import common
import urllib3
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local

ROOT = common.ROOT
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
RACK, ZONE, CLIQUE = "example.com/rack", "topology.kubernetes.io/zone", "nvidia.com/gpu.clique"
LIMITS = {RACK: 1, ZONE: 3, CLIQUE: 1}
"""The budgets of the policy, resolved: rack 1, zone 10% of 32 nodes (rounded down) = 3, clique 1."""
FAULTS = {"r0": [0, 1, 4, 5, 6], "r1": [0, 1, 5], "r2": [2], "r3": [7], "r5": [3, 4]}
"""Faulty nodes per rack, by index in the rack: 12, spread unevenly."""
LABEL = "topo"
WRITE = "the fault's write"


def layout() -> dict[str, dict[str, str]]:
    """Node name → its rack, zone and clique labels."""
    nodes: dict[str, dict[str, str]] = {}
    for rack in range(8):
        for i in range(8):
            nodes[f"topo-r{rack}-{i}"] = {
                RACK: f"r{rack}",
                ZONE: f"z{rack // 4}",
                CLIQUE: f"c{(rack + i // 4) % 8}",
            }
    return nodes


def domain_counts(out: set[str], labels: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for name in out:
        for key in LIMITS:
            domain = (key, labels[name][key])
            counts[domain] = counts.get(domain, 0) + 1
    return counts


class Timeline:
    """A Node watch: every change of `unschedulable` with when the bench saw it."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.events: list[tuple[float, str, bool]] = []
        self.state: dict[str, bool] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Timeline:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch()
            except (OSError, urllib3.exceptions.HTTPError, client.ApiException):
                time.sleep(0.1)  # a cut stream (or the control plane stopping at the end): watch again

    def _watch(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self.stop.is_set():
            response = core.list_node(
                label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}",
                watch=True,
                timeout_seconds=30,
                _preload_content=False,
            )
            for line in common.lines(response):
                event = json.loads(line)
                if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                    break
                node, now = event["object"], time.time()
                name = node["metadata"]["name"]
                out = bool((node.get("spec") or {}).get("unschedulable")) and event["type"] != "DELETED"
                with self.lock:
                    if self.state.get(name, False) != out:
                        self.events.append((now, name, out))
                    self.state[name] = out
                if self.stop.is_set():
                    break
            common.raw(response).release_conn()

    def cordoned_at(self, name: str) -> float | None:
        with self.lock:
            return next((t for t, n, out in self.events if n == name and out), None)

    def out(self) -> set[str]:
        with self.lock:
            return {n for n, out in self.state.items() if out}


def latencies(
    events: list[tuple[float, str, bool]],
    labels: Mapping[str, Mapping[str, str]],
    faulty: set[str],
    written: Mapping[str, float],
) -> dict[str, tuple[float, str]]:
    """Per cordon of a faulty node: seconds from its budget freeing (all its domains last had a free place;
    for a node with room at once, its fault's write) to its cordon, and what freed it."""
    out: set[str] = set()
    room_since = {name: (written[name], WRITE) for name in faulty}  # the domains are empty at the burst
    result: dict[str, tuple[float, str]] = {}
    for t, name, cordoned in events:
        if cordoned:
            out.add(name)
        else:
            out.discard(name)
        if cordoned and name in faulty and name not in result:
            since, why = room_since.get(name, (t, "?"))
            result[name] = (t - max(since, written[name]), why)
        counts = domain_counts(out, labels)
        for waiting_ in faulty - out - set(result):
            full = any(counts.get((key, labels[waiting_][key]), 0) >= LIMITS[key] for key in LIMITS)
            if full:
                room_since.pop(waiting_, None)
            elif waiting_ not in room_since:
                room_since[waiting_] = (t, f"{name} uncordoned" if not cordoned else f"{name} cordoned")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=3.0, help="seconds a node stays faulty once cordoned")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--events", type=Path, help="write the Node timeline and fault writes here (JSON)")
    args = parser.parse_args()
    labels = layout()
    faulty = {f"topo-{rack}-{i}" for rack, indexes in FAULTS.items() for i in indexes}
    results: dict[str, Any] = {"load_average_at_start": Path("/proc/loadavg").read_text().split()[0]}
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-") as tmp:
        workdir = Path(tmp)
        plane = local.ControlPlane(binaries.locate(cwd=ROOT), workdir / "cp")
        plane.start()
        try:
            common.install_crds(plane)
            api = plane.api_client()
            operator_harness.ensure_namespace(api, "gpu-health")
            fleet = operator_harness.Fleet(api, label=LABEL)
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: fleet.add_node(n, labels=labels[n]), labels))
            fleet.policy(
                "topology-bench",
                {
                    "maxUnavailable": "100%",
                    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                    "recovery": {"uncordon": True, "healthyForSeconds": 1},
                    "topology": {
                        "budgets": [
                            {"key": RACK, "maxUnavailable": 1},
                            {"key": ZONE, "maxUnavailable": "10%"},
                            {"key": CLIQUE, "maxUnavailable": 1},
                        ]
                    },
                },
            )
            operator = operator_harness.OperatorProcess(
                kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator.log", identity="bench"
            ).start()
            waiting.wait_until(operator.is_leading, timeout_seconds=60, message="operator leads")
            core = client.CoreV1Api(api)

            def judged() -> bool:
                listed = core.list_node(label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}")
                return common.health_labelled(listed.items) == 64

            waiting.wait_until(judged, timeout_seconds=120, message="every node judged", interval_seconds=0.5)
            timeline = Timeline(api).start()
            time.sleep(1)

            most: dict[tuple[str, str], int] = {}
            violations: list[str] = []
            samples = 0
            stop = threading.Event()

            def sample() -> None:
                nonlocal samples
                while not stop.is_set():
                    started = time.monotonic()
                    listed = core.list_node(
                        label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}", _preload_content=False
                    )
                    items = common.body(listed)["items"]
                    out = {n["metadata"]["name"] for n in items if (n.get("spec") or {}).get("unschedulable")}
                    for domain, count in domain_counts(out, labels).items():
                        most[domain] = max(most.get(domain, 0), count)
                        if count > LIMITS[domain[0]]:
                            violations.append(f"{time.time():.1f}: {domain[0]}={domain[1]} has {count} out")
                    samples += 1
                    time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()

            written: dict[str, float] = {}

            def fault(name: str) -> None:
                written[name] = time.time()
                fleet.report(name, gpunode_facts.agent_status(overrides=ECC))

            burst_start = time.time()
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                list(pool.map(fault, sorted(faulty)))
            repaired: dict[str, float] = {}
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                for name in faulty - set(repaired):
                    at = timeline.cordoned_at(name)
                    if at is not None and time.time() - at >= args.hold:
                        fleet.report(name, gpunode_facts.agent_status())
                        repaired[name] = time.time()
                if len(repaired) == len(faulty) and not timeline.out() & faulty:
                    break
                time.sleep(0.1)
            stop.set()
            sampler.join(timeout=5)
            timeline.stop.set()
            with timeline.lock:
                events = list(timeline.events)
            if args.events:
                args.events.write_text(
                    json.dumps(
                        {
                            "written": {n: round(t - burst_start, 3) for n, t in written.items()},
                            "events": [(round(t - burst_start, 3), n, out) for t, n, out in events],
                        },
                        indent=1,
                    )
                )
            cordons = latencies(events, labels, faulty, written)
            second_wave = {n: v for n, v in cordons.items() if v[1] != WRITE}
            results["faulty_nodes"] = len(faulty)
            results["cordoned"] = len(cordons)
            results["never_cordoned"] = sorted(faulty - set(cordons))
            results["all_done_seconds"] = round(
                max((t for t, _, _ in events), default=burst_start) - burst_start, 1
            )
            results["samples"] = samples
            results["sample_period_ms"] = round((results["all_done_seconds"] * 1000) / max(samples, 1), 1)
            for key in LIMITS:
                results[f"max_out_per_{key}"] = max((c for (k, _), c in most.items() if k == key), default=0)
            results["violations"] = violations[:10]
            results["first_wave_cordons"] = sorted(n for n, v in cordons.items() if v[1] == WRITE)
            results["first_wave_max_seconds"] = round(
                max((v[0] for v in cordons.values() if v[1] == WRITE), default=0.0), 3
            )
            results["after_freeing_seconds"] = {n: round(v[0], 3) for n, v in sorted(second_wave.items())}
            results["after_freeing_max_seconds"] = round(
                max((v[0] for v in second_wave.values()), default=0), 3
            )
            slowest = max(second_wave, key=lambda n: second_wave[n][0], default=None)
            if slowest is not None:
                seconds, why = second_wave[slowest]
                results["slowest_after_freeing"] = f"{slowest}: {seconds:.3f}s after {why}"
            operator.stop()
            results["reconcile_errors_logged"] = len(
                re.findall(r"reconcile of node .* failed", operator.log())
            )
            Path("/tmp/gpuhealth-bench-topology-operator.log").write_text(operator.log())
        finally:
            plane.stop()
    print(common.machine_line())
    for key, value in results.items():
        print(f"{key}: {value}")
    passed = (
        not violations
        and not results["never_cordoned"]
        and results["after_freeing_max_seconds"] <= 1.0
        and all(results[f"max_out_per_{key}"] <= limit for key, limit in LIMITS.items())
    )
    print("PASS" if passed else "FAIL")


if __name__ == "__main__":
    main()
