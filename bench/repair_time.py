"""Repair time (issue 26): fault → cordoned → drained → repair started → validated → back in service.

Starts a local control plane, installs the CRDs, runs the operator as a
subprocess (its default timer and leader election, the repair Job templates
packaged with it, Jobs in namespace gpu-health), and a simulated fleet of N
H100 nodes (real agent code, `sim/gpuhealth_sim/fleet.py`) with the
production agent defaults `intervalSeconds: 5`, `heartbeatSeconds: 300` (the
agent writes its status at once on a change, else every 300 s). The
simulator's repair executor (`sim/gpuhealth_sim/repairs.py`) plays the nodes'
side of the repair Jobs: kwok starts each pod, the executor ends it after the
step's simulated duration (`--reset-seconds`, `--reboot-seconds`,
`--validation-seconds`; the executor's defaults 1 / 2 / 2 s) as the node's
scenario says. A real reset, reboot or `dcgmi diag -r 2` takes its own
minutes; they are not in these figures.

One policy selects the fleet: rules EccUncorrectable, XidCritical, GPULost →
Drain, `spec.repair` steps ResetGPU then RebootNode, a validation,
`maxConcurrent` (`--max-concurrent`). Node i gets one fatal fault at
`--first-fault + i * --spacing` seconds after the fleet starts: even nodes an
XID 79 (the GPU falls off the bus), odd nodes a double-bit ECC error
(volatile uncorrectable ECC 1). Every `--reboot-every`-th node's reset has no
effect (`repair: {ResetGPU: noEffect}`), so its reboot fixes it; the other
nodes' resets fix them. Every validation passes.

Measured per node from watches (arrival times at this process): the GPUNode
status first showing the fault (the agent's write: "fault written", t=0),
the Node unschedulable, the NodeDrained, RepairStarted and ValidationPassed
Events, the Node schedulable again (back in service). Reported: p50 / p99 /
max of fault written → back in service for the reset path and the reboot
path apart, each stage's median, and every repair Job created (a watch: a
Job deleted and created again counts twice) against the expected count
(per node: the steps it ran + one validation).

The reboot path's figure is bounded by the agent's heartbeat: a reset that
ran and changed nothing is judged `NoEffect` only from an agent report seen
after its Job finished (decisions/repair.py `observe_step`), and an agent
whose GPUs did not change writes its next report at its heartbeat (300 s
after the fault's write), unless the reset step's `timeoutSeconds` (300 s in
examples/repair/reset-reboot-validate.yaml, the default here) ends it first.
`--heartbeat 10` (the demo fleet's) shows the path without that wait.

Usage: nice -n 5 .venv/bin/python bench/repair_time.py [--nodes 20] [--spacing 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_sim import binaries, controlplane, fleet, fleetfile, repairs, waiting, watches

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import operator_harness

ROOT = Path(__file__).resolve().parent.parent
LABEL = "repairbench"
H100 = "NVIDIA H100 80GB HBM3"
REASONS = {
    vocabulary.EventReason.NODE_DRAINED.value: "drained",
    vocabulary.EventReason.REPAIR_STARTED.value: "repair_started",
    vocabulary.EventReason.REPAIR_FAILED.value: "step_failed",
    vocabulary.EventReason.VALIDATION_PASSED.value: "validation_passed",
}
STAGES = ("cordoned", "drained", "repair_started", "step_failed", "validation_passed", "back_in_service")


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (as bench/operator_latency.py): with few samples p99 is the max."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def fleet_spec(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The fleet file (as a dict) and each node's path ("reset" or "reboot")."""
    overrides: list[dict[str, Any]] = []
    paths: dict[str, str] = {}
    for i in range(args.nodes):
        name = f"{LABEL}-{i}"
        gpu = i % 8
        after = f"{args.first_fault + i * args.spacing:g}s"
        fault = {"after": after, "gpu": gpu}
        fault.update({"xid": 79} if i % 2 == 0 else {"set": {"eccUncorrectedVolatile": 1}})
        reboot = args.reboot_every > 0 and i % args.reboot_every == args.reboot_every - 1
        paths[name] = "reboot" if reboot else "reset"
        repair = {"ResetGPU": "noEffect" if reboot else "fixes", "RebootNode": "fixes", "validation": "pass"}
        overrides.append({"nodes": name, "scenario": {"timeline": [fault], "repair": repair}})
    spec = {
        "seed": 26,
        "agent": {"intervalSeconds": args.interval, "heartbeatSeconds": args.heartbeat},
        "labels": {operator_harness.Fleet.LABEL_KEY: LABEL},
        "pools": [
            {
                "name": LABEL,
                "nodes": f"{LABEL}-{{0..{args.nodes - 1}}}",
                "gpu": {"model": H100, "count": 8},
            }
        ],
        "overrides": overrides,
    }
    return spec, paths


def faulty(status: dict[str, Any]) -> bool:
    """Whether the agent's report shows a fatal fault on some GPU (lost, an XID, volatile DBE)."""
    return any(
        g.get("lost") or g.get("xids") or (g.get("ecc") or {}).get("uncorrectedVolatile")
        for g in status.get("gpus") or []
    )


class Timeline:
    """Per node, when each stage was first seen (watch arrival times, epoch seconds)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.seen: dict[str, dict[str, float]] = {n: {} for n in names}
        self.jobs: dict[str, dict[str, Any]] = {}
        """Job uid → (name, node, action, cycle, created), every repair Job ever seen."""
        self.failures: dict[str, str] = {}
        """Node → the message of its first RepairFailed Event (why a step moved on)."""
        self.waits = 0
        """BudgetExceeded Events about a repair waiting for maxConcurrent."""
        self.lock = threading.Lock()

    def _first(self, node: str, stage: str, at: float) -> None:
        self.seen[node].setdefault(stage, at)

    def on_gpunode(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and name in self.names and faulty(obj.get("status") or {}):
            with self.lock:
                self._first(name, "fault_written", at)

    def on_node(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" or name not in self.names:
            return
        unschedulable = bool((obj.get("spec") or {}).get("unschedulable"))
        with self.lock:
            stages = self.seen[name]
            if "fault_written" not in stages:
                return
            if unschedulable:
                self._first(name, "cordoned", at)
            elif "cordoned" in stages:
                self._first(name, "back_in_service", at)

    def on_event(self, kind: str, obj: dict[str, Any], at: float) -> None:
        involved = obj.get("involvedObject") or {}
        name, reason = involved.get("name"), obj.get("reason")
        if kind == "DELETED" or name not in self.names:
            return
        with self.lock:
            if reason in REASONS and "fault_written" in self.seen[name]:
                self._first(name, REASONS[reason], at)
            if reason == vocabulary.EventReason.REPAIR_FAILED:
                self.failures.setdefault(name, obj.get("message") or "")
            if reason == vocabulary.EventReason.BUDGET_EXCEEDED and "repair" in (obj.get("message") or ""):
                self.waits += 1

    def on_job(self, kind: str, obj: dict[str, Any], at: float) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if kind == "DELETED" or keys.REPAIR_ACTION_LABEL not in labels:
            return
        with self.lock:
            self.jobs.setdefault(
                meta.get("uid", meta["name"]),
                {
                    "name": meta["name"],
                    "node": labels.get(keys.NODE_LABEL),
                    "action": labels[keys.REPAIR_ACTION_LABEL],
                    "cycle": labels.get(keys.REPAIR_CYCLE_LABEL),
                },
            )

    def done(self) -> bool:
        with self.lock:
            return all("back_in_service" in s for s in self.seen.values())


def summarise(timeline: Timeline, paths: dict[str, str]) -> dict[str, Any]:
    per_node: dict[str, dict[str, float]] = {}
    for name, stages in sorted(timeline.seen.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1])):
        start = stages.get("fault_written")
        per_node[name] = {s: round(stages[s] - start, 2) for s in STAGES if start is not None and s in stages}
    result: dict[str, Any] = {}
    for path in ("reset", "reboot"):
        nodes = [n for n, p in paths.items() if p == path]
        service = [per_node[n]["back_in_service"] for n in nodes if "back_in_service" in per_node[n]]
        result[path] = {
            "nodes": len(nodes),
            "back_in_service": len(service),
            "fault_to_service_s": {
                "p50": round(percentile(service, 50), 2),
                "p99": round(percentile(service, 99), 2),
                "max": round(max(service), 2),
            }
            if service
            else None,
            "median_s_from_fault": {
                s: round(statistics.median(v), 2)
                for s in STAGES
                if (v := [per_node[n][s] for n in nodes if s in per_node[n]])
            },
        }
    # Expected Jobs: reset path: ResetGPU + Validation; reboot path: ResetGPU (no effect) + RebootNode +
    # Validation.
    expected = sum(2 if p == "reset" else 3 for p in paths.values())
    jobs = list(timeline.jobs.values())
    keys_seen = [(j["node"], j["action"], j["cycle"]) for j in jobs]
    by_action: dict[str, int] = {}
    for job in jobs:
        by_action[job["action"]] = by_action.get(job["action"], 0) + 1
    result["jobs"] = {
        "created": len(jobs),
        "expected_steps_plus_validations": expected,
        "by_action": dict(sorted(by_action.items())),
        "duplicates": len(keys_seen) - len(set(keys_seen)),
        "distinct_names": len({j["name"] for j in jobs}),
    }
    result["repair_waits_for_max_concurrent"] = timeline.waits
    result["step_failed_messages"] = timeline.failures
    result["per_node_s_from_fault"] = per_node
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--spacing", type=float, default=3.0, help="seconds between two nodes' faults")
    parser.add_argument("--first-fault", type=float, default=20.0, help="seconds after the fleet starts")
    parser.add_argument("--reboot-every", type=int, default=5, help="every k-th node needs the reboot")
    parser.add_argument("--interval", type=float, default=5.0, help="agent --interval (production 5)")
    parser.add_argument("--heartbeat", type=float, default=300.0, help="agent --heartbeat (production 300)")
    parser.add_argument("--reset-seconds", type=float, default=repairs.DEFAULT_SECONDS["ResetGPU"])
    parser.add_argument("--reboot-seconds", type=float, default=repairs.DEFAULT_SECONDS["RebootNode"])
    parser.add_argument("--validation-seconds", type=float, default=repairs.DEFAULT_SECONDS["Validation"])
    parser.add_argument("--max-concurrent", type=int, default=5)
    # The steps' timeouts of examples/repair/reset-reboot-validate.yaml.
    parser.add_argument("--reset-timeout", type=int, default=300, help="the reset step's timeoutSeconds")
    parser.add_argument("--reboot-timeout", type=int, default=1800, help="the reboot step's timeoutSeconds")
    parser.add_argument("--validation-timeout", type=int, default=900, help="validation.timeoutSeconds")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds after the last fault")
    parser.add_argument("--logs", type=Path, help="keep the operator's and the cluster's logs here")
    args = parser.parse_args()
    spec, paths = fleet_spec(args)
    results: dict[str, Any] = {
        "load_average_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        plane = controlplane.ControlPlane(binaries.locate(cwd=ROOT), workdir / "cp")
        plane.start()
        try:
            crd_args = [a for p in sorted((ROOT / "crds").glob("*.yaml")) for a in ("-f", str(p))]
            plane.kubectl("apply", "--server-side", *crd_args)
            plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crd_args)
            api = plane.api_client()
            operator_harness.ensure_namespace(api, repairs.DEFAULT_NAMESPACE)
            policies = operator_harness.Fleet(api, label=LABEL)
            policies.policy(
                "repair-time-bench",
                {
                    "maxUnavailable": "100%",
                    "rules": [
                        {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
                        {"name": "xid", "condition": "XidCritical", "action": "Drain"},
                        {"name": "lost", "condition": "GPULost", "action": "Drain"},
                    ],
                    "recovery": {"uncordon": True},
                    "repair": {
                        "steps": [
                            {"name": "reset", "action": "ResetGPU", "timeoutSeconds": args.reset_timeout},
                            {"name": "reboot", "action": "RebootNode", "timeoutSeconds": args.reboot_timeout},
                        ],
                        "validation": {"timeoutSeconds": args.validation_timeout},
                        "maxConcurrent": args.max_concurrent,
                    },
                },
            )
            sim = fleet.Fleet(fleetfile.parse(spec, source="bench/repair_time.py"), api)
            seconds = {
                "ResetGPU": args.reset_seconds,
                "RebootNode": args.reboot_seconds,
                "Validation": args.validation_seconds,
            }
            executor = repairs.Executor(api, sim, namespace=repairs.DEFAULT_NAMESPACE, seconds=seconds)
            timeline = Timeline(set(paths))
            core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
            custom = client.CustomObjectsApi(api)

            def gpunodes(**kwargs: Any) -> Any:
                return custom.list_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, **kwargs
                )

            def jobs(**kwargs: Any) -> Any:
                return batch.list_namespaced_job(repairs.DEFAULT_NAMESPACE, **kwargs)

            selector = f"{operator_harness.Fleet.LABEL_KEY}={LABEL}"
            followers = [
                watches.Follower("gpunodes", gpunodes, timeline.on_gpunode),
                watches.Follower("nodes", core.list_node, timeline.on_node, label_selector=selector),
                watches.Follower(
                    "events",
                    core.list_event_for_all_namespaces,
                    timeline.on_event,
                    field_selector="involvedObject.kind=Node",
                ),
                watches.Follower("jobs", jobs, timeline.on_job),
            ]
            operator = operator_harness.OperatorProcess(
                kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator.log", identity="bench"
            )
            sim.create_nodes()
            operator.start()
            try:
                waiting.wait_until(operator.is_leading, timeout_seconds=60, message="operator leads")
                for follower in followers:
                    follower.start()
                for follower in followers:
                    follower.wait_synced(30)
                sim.start()
                executor.start()
                last_fault = args.first_fault + (args.nodes - 1) * args.spacing
                print(f"fleet started; faults from {args.first_fault:g}s to {last_fault:g}s", flush=True)
                try:
                    waiting.wait_until(
                        timeline.done,
                        timeout_seconds=last_fault + args.timeout,
                        interval_seconds=1.0,
                        message="every node back in service",
                    )
                except TimeoutError as error:
                    results["error"] = str(error)
                time.sleep(3.0)  # a Job created late (a duplicate) would show up here
                results["load_average_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
            finally:
                executor.stop()
                sim.stop()
                for follower in followers:
                    follower.request_stop()
                for follower in followers:
                    follower.stop()
                operator.stop()
            results["executor"] = {"pods_played": len(executor.played), "errors": executor.errors}
            results["operator_alive_until_stop"] = "Traceback" not in operator.log()
            results.update(summarise(timeline, paths))
        finally:
            plane.stop()
    results.update({"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()})
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
