"""Topology domains under faults (issue 28, Measure): a clique with 5 of 8 nodes faulty is degraded within
2 s and restored within healthyForSeconds of recovery.

Starts a local control plane, creates 64 kwok GPU Nodes with GPUNodes reporting
healthy GPUs (8 racks `r0`..`r7` of 8 nodes, racks r0-r3 in zone `z0` and r4-r7
in `z1`, 8 NVL72-like cliques `c0`..`c7` of 8 nodes: the layout of
bench/topology.py), one policy with an ECC Cordon rule (`maxUnavailable:
100%`), `recovery.healthyForSeconds: --hold` and `spec.topology.domains:
[{key: nvidia.com/gpu.clique, unhealthy: 5, action: Taint}]`, and runs the
operator as a subprocess (default timer, 1 s).

Each round takes one clique: 4 of its nodes turn faulty at once (nothing may be
marked for 3 s), then a 5th; then all 5 are repaired. Sampled every 100 ms (a
list of the Nodes):

- degraded: from the 5th fault's write to the first sample where all 8 nodes
  of the clique carry the label and the taint `gpuhealth.io/domain-degraded`
  (goal: within 2 s);
- restored: from the first repair's write (the clique is below its threshold
  from then on) to the first sample with no mark left on the clique (goal:
  `hold` and no more than a timer tick and a sample later; never earlier);
- never: a mark on a node of another clique, a healthy node of the clique
  unschedulable, a mark while 4 nodes are faulty.

Usage: PYTHONPATH=tests/support .venv/bin/python bench/topology_domains.py [--rounds 3] [--hold 10]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local

ROOT = common.ROOT
ECC = {0: {"ecc": {"uncorrectedVolatile": 1}}}
RACK, ZONE, CLIQUE = "example.com/rack", "topology.kubernetes.io/zone", "nvidia.com/gpu.clique"
MARK = "gpuhealth.io/domain-degraded"
LABEL = "topodom"


def layout() -> dict[str, dict[str, str]]:
    """Node name → its rack, zone and clique labels (as bench/topology.py)."""
    nodes: dict[str, dict[str, str]] = {}
    for rack in range(8):
        for i in range(8):
            nodes[f"topodom-r{rack}-{i}"] = {
                RACK: f"r{rack}",
                ZONE: f"z{rack // 4}",
                CLIQUE: f"c{(rack + i // 4) % 8}",
            }
    return nodes


class Sampler:
    """Lists the fleet's Nodes every 100 ms and keeps, per sample, (time, marked, tainted, unschedulable)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.samples: list[tuple[float, set[str], set[str], set[str]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            listed = self.core.list_node(
                label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}", _preload_content=False
            )
            at = time.monotonic()
            items = common.body(listed)["items"]
            marked = {n["metadata"]["name"] for n in items if (n["metadata"].get("labels") or {}).get(MARK)}
            tainted = {
                n["metadata"]["name"]
                for n in items
                if any(t.get("key") == MARK for t in (n.get("spec") or {}).get("taints") or [])
            }
            out = {n["metadata"]["name"] for n in items if (n.get("spec") or {}).get("unschedulable")}
            self.samples.append((at, marked, tainted, out))
            time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))

    def first(self, after: float, predicate: Any, timeout: float) -> float:
        """The time of the first sample after `after` for which predicate(marked, tainted, out) holds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for at, marked, tainted, out in self.samples[seen:]:
                seen += 1
                if at >= after and predicate(marked, tainted, out):
                    return at
            time.sleep(0.02)
        raise TimeoutError("the sampled condition did not hold in time")


def cleared(sampler: Sampler, members: frozenset[str]) -> bool:
    """Whether none of `members` was unschedulable in the sampler's last three samples."""
    return not any(members & s[3] for s in sampler.samples[-3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hold", type=float, default=10.0, help="recovery.healthyForSeconds")
    args = parser.parse_args()
    labels = layout()
    cliques: dict[str, list[str]] = {}
    for name, node_labels in labels.items():
        cliques.setdefault(node_labels[CLIQUE], []).append(name)
    results: dict[str, Any] = {"load_average_at_start": Path("/proc/loadavg").read_text().split()[0]}
    rounds: list[dict[str, Any]] = []
    violations: list[str] = []
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
                "topology-domains-bench",
                {
                    "maxUnavailable": "100%",
                    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
                    "recovery": {"uncordon": True, "healthyForSeconds": args.hold},
                    "topology": {"domains": [{"key": CLIQUE, "unhealthy": 5, "action": "Taint"}]},
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
            sampler = Sampler(core).start()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for index in range(args.rounds):
                    clique = f"c{(index * 3) % 8}"
                    members = sorted(cliques[clique])
                    faulty, healthy = members[:5], members[5:]
                    others = set(labels) - set(members)

                    def report(names: list[str], overrides: Any) -> float:
                        list(
                            pool.map(
                                lambda n: fleet.report(n, gpunode_facts.agent_status(overrides=overrides)),
                                names,
                            )
                        )
                        return time.monotonic()

                    four = report(faulty[:4], ECC)
                    time.sleep(3.0)
                    early = [s for s in sampler.samples if s[0] >= four and set(members) & s[1]]
                    if early:
                        violations.append(f"{clique}: marked with 4 faulty")
                    fifth = report(faulty[4:], ECC)
                    marked_at = sampler.first(
                        fifth, lambda m, t, o, ms=set(members): ms <= m and ms <= t, timeout=60
                    )
                    time.sleep(1.0)
                    heal_started = time.monotonic()
                    heal_wall = time.time()
                    report(faulty, None)
                    restored_at = sampler.first(
                        heal_started,
                        lambda m, t, o, ms=set(members): not (ms & m) and not (ms & t),
                        timeout=120,
                    )
                    window = [s for s in sampler.samples if four <= s[0] <= restored_at]
                    if any(others & (s[1] | s[2]) for s in window):
                        violations.append(f"{clique}: a node of another clique was marked")
                    if any(set(healthy) & s[3] for s in window):
                        violations.append(f"{clique}: a healthy node of the clique was unschedulable")
                    # Wait for the faulty nodes' own uncordon before the next round.
                    waiting.wait_until(
                        functools.partial(cleared, sampler, frozenset(members)),
                        timeout_seconds=120,
                        message="the clique uncordoned",
                    )
                    rounds.append(
                        {
                            "clique": clique,
                            "degraded_after_5th_fault_s": round(marked_at - fifth, 2),
                            "restored_after_repair_s": round(restored_at - heal_started, 2),
                            "repair_written_at": time.strftime("%H:%M:%S", time.gmtime(heal_wall))
                            + f".{int(heal_wall % 1 * 1000):03d}",
                        }
                    )
                    print(json.dumps(rounds[-1]), flush=True)
            sampler.stop.set()
            operator.stop()
            # The operator's own account of each transition (its log's times are UTC, as above).
            results["operator_domain_lines"] = [
                line[:160] for line in operator.log().splitlines() if "Domain" in line and "events" in line
            ]
        finally:
            plane.stop()
    results.update(
        {
            "rounds": rounds,
            "hold_s": args.hold,
            "samples": len(sampler.samples),
            "violations": violations,
            "max_degraded_s": max(r["degraded_after_5th_fault_s"] for r in rounds),
            "restored_range_s": [
                min(r["restored_after_repair_s"] for r in rounds),
                max(r["restored_after_repair_s"] for r in rounds),
            ],
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
        }
    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
