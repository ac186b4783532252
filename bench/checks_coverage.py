"""Active checks on a moving fleet (issue 51's Measure): coverage, preemption, concurrency, cost.

Starts a local control plane, installs the CRDs, runs the operator as a
subprocess, and a simulated fleet of N H100 nodes (real agent code,
`sim/gpuhealth_sim/fleet/agentpool.py`) whose kwok Nodes advertise 8
`nvidia.com/gpu` each. One policy selects the fleet with one active check
(`DcgmDiagQuick`, `everySeconds` `--every`, `idleForSeconds` `--idle-for`,
`maxConcurrent` `--max-concurrent`) and the rule
`{condition: ActiveCheckFailed, action: Drain}`. The simulator's check
executor (`sim/gpuhealth_sim/fleet/checks.py`) plays the node's side: a
check pod ends `--check-seconds` after it runs, as the node scenario's
`checks:` says; `--failing` nodes (evenly apart) fail every check.

Workloads: `--busy` of the nodes run one pod each (in the default priority,
0, above the checks' PriorityClass `gpu-health-check`) that requests all 8
GPUs, pinned to its node by affinity. Every `--move-every` seconds
`--move` of them move: the pod is deleted and a new one is created on a
node that is idle now, preferring a node under check, so that kube-scheduler
must preempt the check to start it.

Watched (arrival times at this process): pods, check Jobs, Nodes, Events.
Reported:
- coverage per interval of `--every` seconds (after a first `--idle-for`
  warm-up): of the nodes idle for the whole interval (no workload pod on
  them) and not failing, the share with a check pod that ran in it;
- check pods that started running on a node while a workload pod ran
  there (must be 0);
- for each workload created on a node under check: seconds from its
  creation to its pod Running (target ≤ 10 s), and whether the check ended
  `Preempted` (the GPUNode's `status.checks[]`);
- the most check Jobs in flight, sampled every 100 ms, against
  `maxConcurrent`;
- the failing nodes: seconds from their first `CheckFailed` Event to the
  Node unschedulable;
- GPU-hours on checks (8 x each check pod's running time) as a share of
  the idle GPU-hours (8 x each node's time without a workload).

Usage: PYTHONPATH=tests/support nice -n 5 .venv/bin/python bench/checks_coverage.py --issue-scenario
       (200 nodes, 40 % busy, everySeconds 600, maxConcurrent 5 %, checks of 20 s, 3 intervals: ~35 min)
       PYTHONPATH=tests/support .venv/bin/python bench/checks_coverage.py --nodes 40 --every 120
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
from kubernetes import client

import operator_harness
from gpuhealth_api import keys, vocabulary
from gpuhealth_sim import waiting, watches
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.fleet import agentpool, checks, fleetfile, repairs

LABEL = "checkbench"
H100 = "NVIDIA H100 80GB HBM3"
GPUS = 8
WORKLOAD_NAMESPACE = "bench-workload"
TEMPLATE = "DcgmDiagQuick"
CHECK = "quick"


def node_name(i: int) -> str:
    return f"{LABEL}-{i}"


def spread(total: int, count: int, offset: int) -> list[int]:
    """`count` indices out of range(total), evenly apart, starting near `offset`."""
    if count <= 0 or total <= 0:
        return []
    return sorted({(offset + (k * total) // count) % total for k in range(count)})


def fleet_spec(args: argparse.Namespace, failing: list[str]) -> dict[str, Any]:
    return {
        "seed": 51,
        "agent": {"intervalSeconds": 5, "heartbeatSeconds": 60},
        "labels": {operator_harness.Fleet.LABEL_KEY: LABEL},
        "pools": [
            {
                "name": LABEL,
                "nodes": f"{LABEL}-{{0..{args.nodes - 1}}}",
                "gpu": {"model": H100, "count": GPUS},
            }
        ],
        "overrides": [{"nodes": n, "scenario": {"checks": {TEMPLATE: "fail"}}} for n in failing],
    }


def limit_value(text: str) -> int | str:
    """maxConcurrent as the CRD takes it: an integer, or a percentage string."""
    return text if text.endswith("%") else int(text)


def policy_spec(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "maxUnavailable": "10%",
        "rules": [{"name": "check", "condition": "ActiveCheckFailed", "action": "Drain"}],
        "activeChecks": [
            {
                "name": CHECK,
                "template": TEMPLATE,
                "everySeconds": args.every,
                "idleForSeconds": args.idle_for,
                "timeoutSeconds": max(60, int(args.check_seconds * 6)),
                "maxConcurrent": limit_value(args.max_concurrent),
            }
        ],
    }


class Timeline:
    """What the watches saw: pods (workload and check), check Jobs, Nodes, Events; arrival times."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        """Pod uid → kind ("workload"/"check"), node, created, running, ended."""
        self.active_jobs: set[str] = set()
        self.unschedulable: dict[str, float] = {}
        """Node → when first seen unschedulable."""
        self.check_failed: dict[str, float] = {}
        """Node → its first CheckFailed Event."""
        self.reasons: dict[str, int] = {}

    def on_pod(self, kind: str, obj: dict[str, Any], at: float) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if meta.get("namespace") == WORKLOAD_NAMESPACE:
            what = "workload"
        elif keys.CHECK_LABEL in labels:
            what = "check"
        else:
            return
        with self.lock:
            if kind == "DELETED":
                for record in self.pods.values():
                    if record["name"] == (meta.get("namespace"), meta["name"]) and record["ended"] is None:
                        record["ended"] = at
                return
            record = self.pods.setdefault(
                meta.get("uid") or meta["name"],
                {
                    "name": (meta.get("namespace"), meta["name"]),
                    "kind": what,
                    "node": None,
                    "created": at,
                    "running": None,
                    "ended": None,
                    "target": labels.get("node") or labels.get(keys.NODE_LABEL),
                },
            )
            record["node"] = record["node"] or (obj.get("spec") or {}).get("nodeName")
            phase = (obj.get("status") or {}).get("phase")
            if phase == "Running" and record["running"] is None:
                record["running"] = at
            if (phase in ("Succeeded", "Failed") or meta.get("deletionTimestamp")) and record[
                "ended"
            ] is None:
                record["ended"] = at
                record["running"] = record["running"] or at

    def on_job(self, kind: str, obj: dict[str, Any], at: float) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid") or meta["name"]
        conditions = (obj.get("status") or {}).get("conditions") or []
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        with self.lock:
            if kind == "DELETED" or finished:
                self.active_jobs.discard(uid)
            elif keys.CHECK_LABEL in (meta.get("labels") or {}):
                self.active_jobs.add(uid)

    def on_node(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and (obj.get("spec") or {}).get("unschedulable"):
            with self.lock:
                self.unschedulable.setdefault(name, at)

    def on_event(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind == "DELETED":
            return
        name = (obj.get("involvedObject") or {}).get("name")
        reason = obj.get("reason") or ""
        with self.lock:
            if reason.startswith("Check"):
                self.reasons[reason] = self.reasons.get(reason, 0) + 1
            if reason == vocabulary.EventReason.CHECK_FAILED and name in self.names:
                self.check_failed.setdefault(name, at)

    def workloads_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["kind"] == "workload" and p["node"] == node]

    def checking_now(self) -> set[str]:
        with self.lock:
            return {
                p["node"]
                for p in self.pods.values()
                if p["kind"] == "check" and p["running"] is not None and p["ended"] is None and p["node"]
            }


class Sampler:
    """Every 100 ms: check Jobs in flight."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.samples = 0
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self.timeline.lock:
                active = len(self.timeline.active_jobs)
            self.samples += 1
            self.most = max(self.most, active)


class Workloads:
    """The GPU workload pods: one per busy node, all 8 GPUs, moved from node to node over time."""

    def __init__(self, api: client.ApiClient, timeline: Timeline, names: list[str], seed: int) -> None:
        self.core = client.CoreV1Api(api)
        self.timeline = timeline
        self.names = names
        self.random = random.Random(seed)
        self.busy: dict[str, str] = {}
        """Node → the name of its workload pod."""
        self.onto_checks: list[str] = []
        """Names of workload pods created on a node whose check pod was running then."""
        self.serial = 0

    def place(self, node: str) -> str:
        self.serial += 1
        name = f"work-{self.serial}"
        affinity = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        self.core.create_namespaced_pod(
            WORKLOAD_NAMESPACE,
            {  # type: ignore[arg-type]
                "metadata": {"name": name, "labels": {"app": "bench-work", "node": node}},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [affinity]
                            }
                        }
                    },
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        )
        self.busy[node] = name
        return name

    def move(self, count: int, avoid: set[str]) -> None:
        """Move `count` workloads to idle nodes, onto nodes under check first."""
        checking = self.timeline.checking_now()
        idle = [n for n in self.names if n not in self.busy and n not in avoid]
        targets = [n for n in idle if n in checking]
        self.random.shuffle(targets)
        rest = [n for n in idle if n not in checking]
        self.random.shuffle(rest)
        for _ in range(count):
            if not self.busy or not (targets or rest):
                return
            source = self.random.choice(sorted(self.busy))
            self.core.delete_namespaced_pod(self.busy.pop(source), WORKLOAD_NAMESPACE, grace_period_seconds=0)
            target = targets.pop() if targets else rest.pop()
            name = self.place(target)
            if target in checking:
                self.onto_checks.append(name)


def intervals_of(start: float, every: float, count: int) -> list[tuple[float, float]]:
    return [(start + k * every, start + (k + 1) * every) for k in range(count)]


def coverage(
    timeline: Timeline, names: list[str], failing: set[str], spans: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    """Per interval: the nodes idle throughout it, and of them those a check pod ran on in it."""
    out = []
    with timeline.lock:
        pods = list(timeline.pods.values())
    for begin, end in spans:
        idle_nodes = []
        for node in names:
            if node in failing:
                continue
            busy = any(
                p["kind"] == "workload"
                and p["node"] == node
                and (p["running"] or p["created"]) < end
                and (p["ended"] if p["ended"] is not None else math.inf) > begin
                for p in pods
            )
            if not busy:
                idle_nodes.append(node)
        checked = {
            p["node"]
            for p in pods
            if p["kind"] == "check" and p["running"] is not None and begin <= p["running"] < end
        }
        missed = sorted(n for n in idle_nodes if n not in checked)
        out.append(
            {
                "idle_nodes": len(idle_nodes),
                "checked": len(idle_nodes) - len(missed),
                "coverage": round((len(idle_nodes) - len(missed)) / len(idle_nodes), 3)
                if idle_nodes
                else None,
                "missed": missed[:20],
            }
        )
    return out


def check_started_beside_workload(timeline: Timeline) -> list[dict[str, Any]]:
    """Check pods that started running while a workload pod ran on their node."""
    with timeline.lock:
        pods = list(timeline.pods.values())
    found = []
    for check in (p for p in pods if p["kind"] == "check" and p["running"] is not None):
        for work in (p for p in pods if p["kind"] == "workload" and p["node"] == check["node"]):
            if work["running"] is None:
                continue
            w_end = work["ended"] if work["ended"] is not None else math.inf
            if work["running"] <= check["running"] < w_end:
                found.append(
                    {"node": check["node"], "check_pod": check["name"][1], "workload": work["name"][1]}
                )
    return found


def gpu_hours(timeline: Timeline, names: list[str], begin: float, end: float) -> dict[str, float]:
    with timeline.lock:
        pods = list(timeline.pods.values())

    def within(p: dict[str, Any]) -> float:
        start = max(begin, float(p["running"]))
        stop = min(end, float(p["ended"]) if p["ended"] is not None else end)
        return max(0.0, stop - start)

    check_s = sum(within(p) for p in pods if p["kind"] == "check" and p["running"] is not None)
    busy_s = sum(within(p) for p in pods if p["kind"] == "workload" and p["running"] is not None)
    idle_s = len(names) * (end - begin) - busy_s
    return {
        "check_gpu_hours": round(check_s * GPUS / 3600, 2),
        "idle_gpu_hours": round(idle_s * GPUS / 3600, 2),
        "share_of_idle": round(check_s / idle_s, 4) if idle_s > 0 else 0.0,
    }


def create_priority_class(api: client.ApiClient) -> None:
    """The chart's PriorityClass of check pods (charts/gpu-health/templates/checks.yaml), as it ships."""
    client.SchedulingV1Api(api).create_priority_class(
        {  # type: ignore[arg-type]
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "gpu-health-check"},
            "value": -100,
            "preemptionPolicy": "Never",
            "globalDefault": False,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--busy", type=float, default=0.4, help="share of nodes running a GPU workload")
    parser.add_argument("--every", type=int, default=120, help="the check's everySeconds")
    parser.add_argument("--idle-for", type=int, default=30, help="the check's idleForSeconds")
    parser.add_argument("--check-seconds", type=float, default=20.0, help="a check pod's run time")
    parser.add_argument("--max-concurrent", default="5%")
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--failing", type=int, default=3, help="nodes whose every check fails")
    parser.add_argument("--move-every", type=float, default=30.0, help="seconds between workload moves")
    parser.add_argument("--move", type=float, default=0.05, help="share of the workloads moved each time")
    parser.add_argument("--logs", type=Path, help="keep the operator's and the cluster's logs here")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--issue-scenario", action="store_true", help="issue 51's Measure (docstring)")
    args = parser.parse_args()
    if args.issue_scenario:
        args.nodes, args.busy, args.every, args.idle_for = 200, 0.4, 600, 120
        args.check_seconds, args.max_concurrent, args.intervals, args.failing = 20.0, "5%", 3, 3
        args.move_every, args.move = 60.0, 0.05
    names = [node_name(i) for i in range(args.nodes)]
    failing = [names[i] for i in spread(args.nodes, args.failing, 5)]
    results: dict[str, Any] = {
        "machine": common.machine_line(),
        "load_average_at_start": common.load_average(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="gpuhealth-bench-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        plane = local.ControlPlane(binaries.locate(cwd=common.ROOT), workdir / "cp")
        plane.start()
        try:
            common.install_crds(plane)
            api = plane.api_client()
            operator_harness.ensure_namespace(api, repairs.DEFAULT_NAMESPACE)
            operator_harness.ensure_namespace(api, WORKLOAD_NAMESPACE)
            create_priority_class(api)
            fleet = operator_harness.Fleet(api, label=LABEL)
            fleet.policy("checks-bench", policy_spec(args))
            parsed = fleetfile.parse(fleet_spec(args, failing), source="bench/checks_coverage.py")
            sim = agentpool.Fleet(parsed, api)
            executor = checks.Executor(api, sim, seconds=args.check_seconds)
            timeline = Timeline(set(names))
            sampler = Sampler(timeline)
            core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
            followers = [
                watches.Follower("pods", core.list_pod_for_all_namespaces, timeline.on_pod),
                watches.Follower("jobs", batch.list_job_for_all_namespaces, timeline.on_job),
                watches.Follower(
                    "nodes",
                    core.list_node,
                    timeline.on_node,
                    label_selector=f"{operator_harness.Fleet.LABEL_KEY}={LABEL}",
                ),
                watches.Follower(
                    "events",
                    core.list_event_for_all_namespaces,
                    timeline.on_event,
                    field_selector="involvedObject.kind=Node",
                ),
            ]
            operator = operator_harness.OperatorProcess(
                kubeconfig=Path(plane.kubeconfig), log_path=workdir / "operator.log", identity="bench"
            )
            sim.create_nodes()
            workloads = Workloads(api, timeline, names, seed=51)
            busy = [n for n in names if n not in failing]
            random.Random(51).shuffle(busy)
            for node in busy[: round(args.nodes * args.busy)]:
                workloads.place(node)
            operator.start()
            try:
                waiting.wait_until(operator.is_leading, timeout_seconds=60, message="operator leads")
                for follower in followers:
                    follower.start()
                for follower in followers:
                    follower.wait_synced(30)
                sampler.start()
                sim.start()
                executor.start()
                started = time.time()
                first = started + args.idle_for
                spans = intervals_of(first, args.every, args.intervals)
                end = spans[-1][1]
                print(
                    f"fleet started; {args.intervals} intervals of {args.every} s after {args.idle_for} s",
                    flush=True,
                )
                next_move = started + args.move_every
                while time.time() < end:
                    if time.time() >= next_move:
                        workloads.move(max(1, round(len(workloads.busy) * args.move)), avoid=set(failing))
                        next_move += args.move_every
                    time.sleep(0.2)
                results["load_average_at_end"] = common.load_average()
            finally:
                sampler.stop()
                executor.stop()
                sim.stop()
                for follower in followers:
                    follower.request_stop()
                for follower in followers:
                    follower.stop()
                operator.stop()
            limit = (
                int(args.max_concurrent)
                if not str(args.max_concurrent).endswith("%")
                else math.ceil(args.nodes * float(str(args.max_concurrent)[:-1]) / 100)
            )
            starts = []
            with timeline.lock:
                by_name = {p["name"][1]: p for p in timeline.pods.values() if p["kind"] == "workload"}
            for name in workloads.onto_checks:
                pod = by_name.get(name)
                if pod is not None and pod["running"] is not None:
                    starts.append(round(pod["running"] - pod["created"], 2))
            results["coverage"] = coverage(timeline, names, set(failing), spans)
            results["check_pods_started_beside_a_workload"] = check_started_beside_workload(timeline)
            results["preemptions"] = {
                "workloads_onto_a_check": len(workloads.onto_checks),
                "started": len(starts),
                "seconds_to_running_max": max(starts) if starts else None,
                "seconds_to_running": sorted(starts),
            }
            results["in_flight"] = {"samples": sampler.samples, "most": sampler.most, "max_concurrent": limit}
            results["failing_nodes"] = {
                n: {
                    "check_failed_to_cordoned_s": round(
                        timeline.unschedulable[n] - timeline.check_failed[n], 2
                    )
                    if n in timeline.unschedulable and n in timeline.check_failed
                    else None
                }
                for n in failing
            }
            results["events"] = dict(sorted(timeline.reasons.items()))
            results["gpu_hours"] = gpu_hours(timeline, names, first, end)
            results["executor"] = {"pods_played": len(executor.played)}
        finally:
            plane.stop()
    common.report(results, args.json)


if __name__ == "__main__":
    main()
