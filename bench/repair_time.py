"""Repair time (issue 26): fault → cordoned → drained → repair started → validated → back in service.

Starts a local control plane, installs the CRDs, runs the operator as a
subprocess (its default timer and leader election, the repair Job templates
packaged with it, Jobs in namespace gpu-health), and a simulated fleet of N
H100 nodes (real agent code, `sim/gpuhealth_sim/fleet/agentpool.py`) with the
production agent defaults `intervalSeconds: 5`, `heartbeatSeconds: 300` (the
agent writes its status at once on a change, else every 300 s). The
simulator's repair executor (`sim/gpuhealth_sim/fleet/repairs.py`) plays the
nodes' side of the repair Jobs: kwok starts each pod, the executor ends it after the
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

`--issue-scenario` is issue 26's "Measure": 200 nodes, 20 single faults
10 s apart (every 10th node), sim Jobs of 5 s (reset), 5 s (reboot), 10 s
(validation); 15 faulty nodes' resets fix them; 3 nodes' resets fail
(`ResetGPU: fails`: the Job fails, the reboot follows at once) and their
reboots fix them; 2 nodes fail every validation (`validation: fail`) and must
be retired (`gpuhealth.io/needs-repair=manual`, NodeRetired, still cordoned,
never back in service). Plain evictable pods run on every faulty node and on
every 10th other node; a pod watch records when each workload pod and each
repair pod ran, and the bench checks no repair pod ran on a node while a
workload pod ran there. A sampler counts every 100 ms the Nodes carrying the
repair annotation (`keys.REPAIR_ANNOTATION`, from the Node watch) and the
repair Jobs not finished, against `maxConcurrent`. Two operator replicas run
from the start with the same Lease (default lease timings); when the 5th
RepairStarted Event arrives the leader is killed with SIGKILL and the other
takes over; every repair Job name must be ADDED once (one uid per name, none
deleted) and the count must equal the steps and validations the nodes ran.

`--operands` (on in `--issue-scenario`; issue 48's Measure): the demo's GPU
Operator operand DaemonSets (device plugin, dcgm-exporter,
`sim/gpuhealth_sim/demo/operands.py`) on every node, their labels set as the
GPU Operator would; the operator turns them off for each reset and restores
them. Reported: the resets the simulated node refused because a holder (an
operand pod, the agent) still had the GPU open, validations that would have
started a second host engine, and from a 100 ms sampler of the Nodes every
node whose operand label was off without the operator's record of it, and
every node not restored at the end.

Usage: PYTHONPATH=tests/support nice -n 5 .venv/bin/python bench/repair_time.py [--nodes 20] [--spacing 3]
       PYTHONPATH=tests/support nice -n 5 .venv/bin/python bench/repair_time.py --issue-scenario
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

import operator_harness
from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_sim import waiting, watches
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.demo import operands
from gpuhealth_sim.fleet import agentpool, fleetfile, repairs

ROOT = Path(__file__).resolve().parent.parent
LABEL = "repairbench"
H100 = "NVIDIA H100 80GB HBM3"
REASONS = {
    vocabulary.EventReason.NODE_DRAINED.value: "drained",
    vocabulary.EventReason.REPAIR_STARTED.value: "repair_started",
    vocabulary.EventReason.REPAIR_FAILED.value: "step_failed",
    vocabulary.EventReason.VALIDATION_PASSED.value: "validation_passed",
    vocabulary.EventReason.VALIDATION_FAILED.value: "validation_failed",
    vocabulary.EventReason.NODE_RETIRED.value: "retired",
}
STAGES = (
    "cordoned",
    "drained",
    "repair_started",
    "step_failed",
    "validation_passed",
    "validation_failed",
    "retired",
    "back_in_service",
)
WORKLOAD_NAMESPACE = "bench-workload"
PATHS = ("reset", "reboot", "retire")


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (as bench/operator_latency.py): with few samples p99 is the max."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def spread(total: int, count: int, offset: int) -> set[int]:
    """`count` indices out of range(total), evenly apart, starting near `offset`."""
    if count <= 0 or total <= 0:
        return set()
    return {(offset + (k * total) // count) % total for k in range(count)}


def any_leads(operators: list[operator_harness.OperatorProcess]) -> bool:
    return any(o.is_leading() for o in operators)


def fleet_spec(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The fleet file (as a dict) and each faulty node's path ("reset", "reboot" or "retire")."""
    overrides: list[dict[str, Any]] = []
    paths: dict[str, str] = {}
    faulted = args.faulted or args.nodes
    step = max(1, args.nodes // faulted)
    reset_fails = spread(faulted, args.reset_fails, 3)
    retire = spread(faulted, args.validation_fails, 7) - reset_fails
    for k in range(faulted):
        i = k * step
        name = f"{LABEL}-{i}"
        gpu = i % 8
        after = f"{args.first_fault + k * args.spacing:g}s"
        fault = {"after": after, "gpu": gpu}
        fault.update({"xid": 79} if k % 2 == 0 else {"set": {"eccUncorrectedVolatile": 1}})
        reboot = args.reboot_every > 0 and k % args.reboot_every == args.reboot_every - 1
        repair: dict[str, Any] = {
            "ResetGPU": "noEffect" if reboot else "fixes",
            "RebootNode": "fixes",
            "validation": "pass",
        }
        paths[name] = "reboot" if reboot else "reset"
        if k in reset_fails:
            repair["ResetGPU"], paths[name] = "fails", "reboot"
        elif k in retire:
            repair["validation"], paths[name] = "fail", "retire"
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
        self.repair_started: set[str] = set()
        """Uids of RepairStarted Events (any node of the fleet)."""
        self.annotated: set[str] = set()
        """Nodes (all of the fleet) carrying the repair annotation now."""
        self.job_uids: dict[str, set[str]] = {}
        """Job name → every uid seen under it (more than one: deleted and created again)."""
        self.job_deleted: set[str] = set()
        self.job_active: set[str] = set()
        """Repair Jobs (uid) seen and not finished (no Complete/Failed condition, not deleted)."""
        self.pods: dict[str, dict[str, Any]] = {}
        """Pod uid → node, kind ("workload" or "repair"), name, running (first seen Running), ended."""
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
        annotations = obj["metadata"].get("annotations") or {}
        with self.lock:
            if kind != "DELETED" and keys.REPAIR_ANNOTATION in annotations:
                self.annotated.add(name)
            else:
                self.annotated.discard(name)
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
        if kind != "DELETED" and reason == vocabulary.EventReason.REPAIR_STARTED:
            with self.lock:
                self.repair_started.add(obj["metadata"].get("uid", obj["metadata"]["name"]))
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
        uid = meta.get("uid", meta["name"])
        if kind == "DELETED":
            with self.lock:
                if uid in self.jobs or meta["name"] in self.job_uids:
                    self.job_deleted.add(meta["name"])
                self.job_active.discard(uid)
            return
        if keys.REPAIR_ACTION_LABEL not in labels:
            return
        conditions = (obj.get("status") or {}).get("conditions") or []
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        with self.lock:
            self.job_uids.setdefault(meta["name"], set()).add(uid)
            if finished:
                self.job_active.discard(uid)
            elif uid not in self.jobs:
                self.job_active.add(uid)
            self.jobs.setdefault(
                meta.get("uid", meta["name"]),
                {
                    "name": meta["name"],
                    "node": labels.get(keys.NODE_LABEL),
                    "action": labels[keys.REPAIR_ACTION_LABEL],
                    "cycle": labels.get(keys.REPAIR_CYCLE_LABEL),
                },
            )

    def on_pod(self, kind: str, obj: dict[str, Any], at: float) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid")
        with self.lock:
            if kind == "DELETED":
                record = next(
                    (r for r in self.pods.values() if r["name"] == (meta.get("namespace"), meta["name"])),
                    None,
                )
                if record is not None and record.get("ended") is None:
                    record["ended"] = at
                return
            labels = meta.get("labels") or {}
            if meta.get("namespace") == WORKLOAD_NAMESPACE:
                what = "workload"
            elif keys.REPAIR_ACTION_LABEL in labels:
                what = "repair"
            else:
                return
            record = self.pods.setdefault(
                uid,
                {
                    "name": (meta.get("namespace"), meta["name"]),
                    "kind": what,
                    "node": (obj.get("spec") or {}).get("nodeName"),
                    "running": None,
                    "ended": None,
                },
            )
            record["node"] = record["node"] or (obj.get("spec") or {}).get("nodeName")
            phase = (obj.get("status") or {}).get("phase")
            if phase == "Running" and record["running"] is None:
                record["running"] = at
            if phase in ("Succeeded", "Failed") and record["ended"] is None:
                record["ended"] = at
                if record["running"] is None:
                    record["running"] = at

    def workload_nodes_running(self) -> int:
        with self.lock:
            return len({p["node"] for p in self.pods.values() if p["kind"] == "workload" and p["running"]})

    def done(self, paths: dict[str, str]) -> bool:
        with self.lock:
            return all(
                "retired" in self.seen[n] if p == "retire" else "back_in_service" in self.seen[n]
                for n, p in paths.items()
            )

    def overlaps(self) -> list[dict[str, Any]]:
        """Repair pods that ran on a node while a workload pod ran there (watch arrival times)."""
        with self.lock:
            pods = list(self.pods.values())
        found = []
        for repair in (p for p in pods if p["kind"] == "repair" and p["running"] is not None):
            r_end = repair["ended"] if repair["ended"] is not None else math.inf
            for work in (p for p in pods if p["kind"] == "workload" and p["node"] == repair["node"]):
                if work["running"] is None:
                    continue
                w_end = work["ended"] if work["ended"] is not None else math.inf
                if work["running"] < r_end and repair["running"] < w_end:
                    found.append(
                        {"node": repair["node"], "repair_pod": repair["name"][1], "workload": work["name"][1]}
                    )
        return found


class Sampler:
    """Every `period` seconds: repairs in progress (Nodes with the repair annotation; repair Jobs running)."""

    def __init__(self, timeline: Timeline, period: float = 0.1) -> None:
        self.timeline, self.period = timeline, period
        self.samples = 0
        self.max_annotated = 0
        self.max_active_jobs = 0
        self.over: list[tuple[float, int]] = []
        self.limit = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self, limit: int) -> None:
        self.limit = limit
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self.timeline.lock:
                annotated = len(self.timeline.annotated)
                active = len(self.timeline.job_active)
            self.samples += 1
            self.max_annotated = max(self.max_annotated, annotated)
            self.max_active_jobs = max(self.max_active_jobs, active)
            if annotated > self.limit and len(self.over) < 20:
                self.over.append((round(time.time(), 1), annotated))


def summarise(timeline: Timeline, paths: dict[str, str]) -> dict[str, Any]:
    per_node: dict[str, dict[str, float]] = {}
    for name, stages in sorted(timeline.seen.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1])):
        start = stages.get("fault_written")
        per_node[name] = {s: round(stages[s] - start, 2) for s in STAGES if start is not None and s in stages}
    result: dict[str, Any] = {}
    for path in PATHS:
        nodes = [n for n, p in paths.items() if p == path]
        if not nodes:
            continue
        service = [per_node[n]["back_in_service"] for n in nodes if "back_in_service" in per_node[n]]
        result[path] = {
            "nodes": len(nodes),
            "back_in_service": len(service),
            "retired": len([n for n in nodes if "retired" in per_node[n]]),
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
    # Expected Jobs: reset path: ResetGPU + Validation; reboot path: ResetGPU (no effect or failed) +
    # RebootNode + Validation; retire path: what the nodes ran, per node (see jobs_per_retired_node).
    expected = sum({"reset": 2, "reboot": 3}.get(p, 0) for p in paths.values())
    jobs = list(timeline.jobs.values())
    # A cycle may run two validations (after the reset, after the reboot): a Job is one name, one uid.
    keys_seen = [j["name"] for j in jobs]
    by_action: dict[str, int] = {}
    for job in jobs:
        by_action[job["action"]] = by_action.get(job["action"], 0) + 1
    retired_jobs = {
        n: sorted(f"{j['action']}#{j['cycle']}" for j in jobs if j["node"] == n)
        for n, p in paths.items()
        if p == "retire"
    }
    result["jobs"] = {
        "created": len(jobs),
        "expected_steps_plus_validations_reset_and_reboot_paths": expected,
        "created_reset_and_reboot_paths": len(
            [j for j in jobs if paths.get(j["node"] or "") in ("reset", "reboot")]
        ),
        "jobs_per_retired_node": retired_jobs,
        "by_action": dict(sorted(by_action.items())),
        "steps_started_events": len(timeline.repair_started),
        "steps_created": len([j for j in jobs if j["action"] != vocabulary.VALIDATION_JOB]),
        "duplicates": len(keys_seen) - len(set(keys_seen)),
        "distinct_names": len({j["name"] for j in jobs}),
        "names_with_more_than_one_uid": sorted(n for n, u in timeline.job_uids.items() if len(u) > 1),
        "names_deleted": sorted(
            f"{n} ({next((j['action'] for j in jobs if j['name'] == n), '?')})" for n in timeline.job_deleted
        ),
    }
    result["repair_waits_for_max_concurrent"] = timeline.waits
    result["step_failed_messages"] = timeline.failures
    result["per_node_s_from_fault"] = per_node
    return result


class OperandLabels:
    """Every 100 ms (issue 48's Measure): the nodes whose GPU Operator operand label is off without the
    operator's record of it (`keys.OPERANDS_PAUSED_ANNOTATION` naming it): a change nobody would restore.
    At the end: every operand label back to "true", no record left."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.samples = 0
        self.paused_seen = 0
        self.unrecorded: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="operand-labels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _nodes(self) -> list[dict[str, Any]]:
        response: Any = self.core.list_node(
            label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(response.data)["items"]
        return items

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                nodes = self._nodes()
            except Exception:  # the API server busy a moment: the next sample
                continue
            self.samples += 1
            for node in nodes:
                meta = node["metadata"]
                labels = meta.get("labels") or {}
                recorded = set(
                    ((meta.get("annotations") or {}).get(keys.OPERANDS_PAUSED_ANNOTATION) or "").split(",")
                )
                off = {k for k in operands.OPERANDS.values() if labels.get(k) == "false"}
                if off:
                    self.paused_seen += 1
                if off - recorded:
                    self.unrecorded.add(meta["name"])

    def summary(self, core: client.CoreV1Api) -> dict[str, Any]:
        left = []
        for node in self._nodes():
            meta = node["metadata"]
            labels = meta.get("labels") or {}
            if any(
                labels.get(k) != "true" for k in operands.OPERANDS.values()
            ) or keys.OPERANDS_PAUSED_ANNOTATION in (meta.get("annotations") or {}):
                left.append(meta["name"])
        return {
            "samples_100ms": self.samples,
            "node_samples_with_a_label_paused": self.paused_seen,
            "nodes_with_a_label_off_unrecorded": sorted(self.unrecorded),
            "nodes_not_restored_at_end": left,
        }


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
    parser.add_argument("--faulted", type=int, default=0, help="faulty nodes, evenly apart (0: all)")
    parser.add_argument("--reset-fails", type=int, default=0, help="faulty nodes whose reset Job fails")
    parser.add_argument("--validation-fails", type=int, default=0, help="faulty nodes failing validation")
    parser.add_argument("--workload-every", type=int, default=0, help="an evictable pod on every k-th node")
    parser.add_argument("--replicas", type=int, default=1, help="operator processes sharing one Lease")
    parser.add_argument(
        "--kill-after", type=int, default=0, help="SIGKILL the leader at the n-th RepairStarted (0: never)"
    )
    parser.add_argument(
        "--issue-scenario", action="store_true", help="issue 26's Measure (see the docstring)"
    )
    parser.add_argument(
        "--operands",
        action="store_true",
        help="GPU Operator operand DaemonSets (device plugin, dcgm-exporter) on every node (issue 48)",
    )
    args = parser.parse_args()
    if args.issue_scenario:
        args.nodes, args.faulted, args.spacing = 200, 20, 10.0
        args.reboot_every, args.reset_fails, args.validation_fails = 0, 3, 2
        args.reset_seconds, args.reboot_seconds, args.validation_seconds = 5.0, 5.0, 10.0
        args.workload_every, args.replicas, args.kill_after = 10, 2, 5
        args.operands = True
    spec, paths = fleet_spec(args)
    results: dict[str, Any] = {
        "load_average_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        plane = local.ControlPlane(binaries.locate(cwd=ROOT), workdir / "cp")
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
            parsed = fleetfile.parse(spec, source="bench/repair_time.py")
            sim = agentpool.Fleet(parsed, api)
            seconds = {
                "ResetGPU": args.reset_seconds,
                "RebootNode": args.reboot_seconds,
                "Validation": args.validation_seconds,
            }
            executor = repairs.Executor(api, sim, namespace=repairs.DEFAULT_NAMESPACE, seconds=seconds)
            timeline = Timeline(set(paths))
            sampler = Sampler(timeline)
            labels_sampler = OperandLabels(client.CoreV1Api(api))
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
                watches.Follower("pods", core.list_pod_for_all_namespaces, timeline.on_pod),
            ]
            operators = [
                operator_harness.OperatorProcess(
                    kubeconfig=Path(plane.kubeconfig),
                    log_path=workdir / f"operator-{r}.log",
                    identity="bench" if r == 0 else f"bench-{r}",
                )
                for r in range(args.replicas)
            ]
            sim.create_nodes()
            workload_nodes = (
                sorted(
                    set(paths)
                    | {
                        f"{LABEL}-{i}"
                        for i in range(args.workload_every // 2, args.nodes, args.workload_every)
                    }
                )
                if args.workload_every
                else []
            )
            if workload_nodes:
                # One Deployment per node (affinity to that node only): its pod has a controller (evictable);
                # the replacement the ReplicaSet makes stays Pending while the node is cordoned.
                operator_harness.ensure_namespace(api, WORKLOAD_NAMESPACE)
                apps = client.AppsV1Api(api)
                for node in workload_nodes:
                    match = {"app": "bench-work", "node": node}
                    affinity = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    apps.create_namespaced_deployment(
                        WORKLOAD_NAMESPACE,
                        {  # type: ignore[arg-type]
                            "metadata": {"name": f"work-{node}"},
                            "spec": {
                                "replicas": 1,
                                "selector": {"matchLabels": match},
                                "template": {
                                    "metadata": {"labels": match},
                                    "spec": {
                                        "affinity": {
                                            "nodeAffinity": {
                                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                                    "nodeSelectorTerms": [affinity]
                                                }
                                            }
                                        },
                                        "containers": [
                                            {"name": "main", "image": "registry.k8s.io/pause:3.10"}
                                        ],
                                        "terminationGracePeriodSeconds": 0,
                                    },
                                },
                            },
                        },
                    )
            for operator in operators:
                operator.start()
            killed: dict[str, Any] = {}
            try:
                waiting.wait_until(
                    lambda: any(o.is_leading() for o in operators),
                    timeout_seconds=60,
                    message="operator leads",
                )
                for follower in followers:
                    follower.start()
                for follower in followers:
                    follower.wait_synced(30)
                if workload_nodes:
                    waiting.wait_until(
                        lambda: timeline.workload_nodes_running() == len(workload_nodes),
                        timeout_seconds=120,
                        message="the workload pods run",
                    )
                results["workload_pods"] = len(workload_nodes)
                if args.operands:
                    results["operand_pods"] = operands.start(api, parsed)
                    labels_sampler.start()
                sampler.start(args.max_concurrent)
                sim.start()
                executor.start()
                last_fault = args.first_fault + (len(paths) - 1) * args.spacing
                print(f"fleet started; faults from {args.first_fault:g}s to {last_fault:g}s", flush=True)
                deadline = time.monotonic() + last_fault + args.timeout
                while not timeline.done(paths):
                    if time.monotonic() > deadline:
                        results["error"] = "timed out: not every faulty node back in service or retired"
                        break
                    if args.kill_after and not killed and len(timeline.repair_started) >= args.kill_after:
                        leader = next((o for o in operators if o.is_leading()), None)
                        if leader is not None:
                            at = time.time()
                            leader.kill()
                            killed = {
                                "identity": leader.identity,
                                "at_repair_started": len(timeline.repair_started),
                            }
                            print(f"killed {leader.identity} (SIGKILL)", flush=True)
                            others = [o for o in operators if o is not leader]
                            if others:
                                waiting.wait_until(
                                    functools.partial(any_leads, others),
                                    timeout_seconds=120,
                                    interval_seconds=0.2,
                                    message="another replica leads",
                                )
                                killed["takeover_s"] = round(time.time() - at, 2)
                    time.sleep(0.1)
                time.sleep(3.0)  # a Job created late (a duplicate) would show up here
                results["load_average_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
            finally:
                sampler.stop()
                labels_sampler.stop()
                executor.stop()
                sim.stop()
                for follower in followers:
                    follower.request_stop()
                for follower in followers:
                    follower.stop()
                for operator in operators:
                    operator.stop()
            results["executor"] = {
                "pods_played": len(executor.played),
                "errors": executor.errors,
                "reset_jobs_refused_while_a_holder_ran": executor.refused_resets,
                "validations_with_a_second_hostengine": executor.second_hostengines,
            }
            if args.operands:
                results["operand_labels"] = labels_sampler.summary(core)
            results["operators_without_traceback"] = {
                o.identity: "Traceback" not in o.log() for o in operators
            }
            results["kill"] = killed or None
            retired_state = {}
            for name, path in paths.items():
                if path != "retire":
                    continue
                response: Any = core.read_node(name, _preload_content=False)
                read = json.loads(response.data)
                retired_state[name] = {
                    "needs_repair": (read["metadata"].get("labels") or {}).get(keys.NEEDS_REPAIR_LABEL),
                    "unschedulable": bool((read.get("spec") or {}).get("unschedulable")),
                    "ever_back_in_service": "back_in_service" in timeline.seen[name],
                }
            results["retired_nodes"] = retired_state
            results["max_concurrent"] = {
                "limit": args.max_concurrent,
                "samples": sampler.samples,
                "max_nodes_with_repair_annotation": sampler.max_annotated,
                "max_repair_jobs_unfinished": sampler.max_active_jobs,
                "samples_over_limit": sampler.over,
            }
            overlaps = timeline.overlaps()
            results["evictable_check"] = {
                "workload_pods_seen": len([p for p in timeline.pods.values() if p["kind"] == "workload"]),
                "repair_pods_seen": len([p for p in timeline.pods.values() if p["kind"] == "repair"]),
                "repair_pod_ran_with_workload_running": overlaps,
            }
            results.update(summarise(timeline, paths))
        finally:
            plane.stop()
    results.update({"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()})
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
