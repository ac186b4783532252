"""Fleet simulator at scale: can one process run 1,000 simulated GPU nodes on a small machine?

Starts the local control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok), applies the CRDs, creates N kwok GPU nodes and runs one
real agent per node (sim backend, 8 GPUs each) in this process. Reports:
  - time to create the Nodes and until every GPUNode has its first report;
  - this process's CPU (user+sys, all threads) and RSS in steady state;
  - the control plane's CPU (its processes are children of this one);
  - whether every GPUNode was written within its heartbeat (the oldest
    lastHeartbeatTime seen, sampled every few seconds), and the fleet's
    scheduling lateness.

    KUBEBUILDER_ASSETS=... .venv/bin/python bench/fleet_scale.py [--nodes 1000] [--seconds 180]
"""

import argparse
import datetime
import logging
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, cast

import common
from kubernetes import client

from gpuhealth_api import resources
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.fleet import agentpool, fleetfile

ROOT = common.ROOT


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, amount, _ = line.split()
            values[key] = int(amount) / 1024
    return values["VmRSS:"], values["VmHWM:"]


def fleet_spec(nodes: int, interval: float, heartbeat: float, workers: int) -> fleetfile.Fleet:
    return fleetfile.parse(
        {
            "seed": 1,
            "agent": {"intervalSeconds": interval, "heartbeatSeconds": heartbeat},
            "workers": workers,
            "labels": {"gpuhealth.io/bench": "fleet-scale"},
            "pools": [
                {
                    "name": "h100",
                    "count": nodes,
                    "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 8},
                    "scenario": str(ROOT / "examples" / "scenarios" / "demo-healthy.yaml"),
                }
            ],
            # One node in a hundred gets a fault mid-run, so change-driven writes are part of the load.
            "overrides": [
                {
                    "nodes": f"h100-{{0..{max(0, nodes // 100 - 1)}}}",
                    "scenario": str(ROOT / "examples" / "scenarios" / "demo-ecc.yaml"),
                }
            ],
        },
        source="bench",
    )


def heartbeat_ages(custom: client.CustomObjectsApi, now: float) -> list[float]:
    """Age of every GPUNode's lastHeartbeatTime, listed in pages (one 6 MB list can time out)."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        page = cast(  # the client hints a custom object list as `object`; it is the decoded JSON
            "dict[str, Any]",
            custom.list_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, limit=200, _continue=token
            ),
        )
        items += page.get("items", [])
        token = page.get("metadata", {}).get("continue")
        if not token:
            break
    ages = []
    for item in items:
        stamp = ((item.get("status") or {}).get("agent") or {}).get("lastHeartbeatTime")
        if stamp:
            ages.append(now - datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
        else:
            ages.append(float("inf"))
    return ages


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--seconds", type=float, default=180, help="steady-state window after the first reports"
    )
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--heartbeat", type=float, default=60.0)
    parser.add_argument("--workers", type=int, help="default: as gpu-health-sim (one per 16 nodes, 8..64)")
    parser.add_argument("--warmup", type=float, help="seconds between the last first report and the window")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--binaries", type=Path, help="control-plane binaries (default: as make testbin)")
    parser.add_argument(
        "--no-kwok", action="store_true", help="skip kwok (Nodes stay NotReady; agents don't mind)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the agents' per-fault warnings are not the benchmark's output

    args.workers = args.workers or agentpool.default_workers(args.nodes)
    spec = fleet_spec(args.nodes, args.interval, args.heartbeat, args.workers)
    results: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "nodes": args.nodes,
        "gpusPerNode": 8,
        "intervalSeconds": args.interval,
        "heartbeatSeconds": args.heartbeat,
        "workers": args.workers,
        "command": " ".join(["bench/fleet_scale.py", *sys.argv[1:]]),
    }
    directory = args.binaries or binaries.locate(cwd=ROOT)
    results["kwok"] = not args.no_kwok
    with local.ControlPlane(directory, with_kwok=not args.no_kwok) as plane:
        common.install_crds(plane)
        configuration = plane.api_client().configuration
        configuration.connection_pool_maxsize = args.workers + 4  # one connection per worker, no blocking
        api = client.ApiClient(configuration)
        custom = client.CustomObjectsApi(api)
        sim = agentpool.Fleet(spec, api, workers=args.workers)
        began = time.monotonic()
        sim.create_nodes()
        results["createNodesSeconds"] = round(time.monotonic() - began, 1)
        print(f"created {args.nodes} nodes in {results['createNodesSeconds']}s", flush=True)

        cpu_before_start = cpu_seconds()
        began = time.monotonic()
        sim.start()
        deadline = began + 600
        # In-process checks (the reporters' own record of successful writes): listing a thousand
        # GPUNodes every second would load the API server more than the fleet does.
        while time.monotonic() < deadline and None in sim.last_writes():
            time.sleep(0.5)
        results["allFirstReportsSeconds"] = round(time.monotonic() - began, 1)
        results["firstReportsComplete"] = None not in sim.last_writes()
        results["startupCpuSeconds"] = round(cpu_seconds() - cpu_before_start, 1)
        print(f"every GPUNode reported after {results['allFirstReportsSeconds']}s", flush=True)

        # Steady state: let a heartbeat (and a turn) pass at least, so writes owed since start-up are done.
        time.sleep(args.warmup if args.warmup is not None else args.heartbeat + args.interval)
        stats_before = (sim.stats.turns, sim.stats.writes, sim.stats.busy_seconds)
        late_before = sim.stats.late_turns
        sim.stats.max_lateness_seconds = 0.0
        cpu0, children0, wall0 = cpu_seconds(), common.children_cpu_seconds(), time.monotonic()
        oldest = 0.0
        missing = 0
        while time.monotonic() - wall0 < args.seconds:
            time.sleep(2)
            now = time.time()
            last = sim.last_writes()
            missing = max(missing, sum(1 for w in last if w is None))
            oldest = max([oldest, *(now - w for w in last if w is not None)])
            if int(time.monotonic() - wall0) % 30 < 2:
                print(
                    f"  t={time.monotonic() - wall0:5.0f}s turns={sim.stats.turns} writes={sim.stats.writes} "
                    f"oldest write {oldest:.0f}s ago",
                    flush=True,
                )
        wall = time.monotonic() - wall0
        cpu = cpu_seconds() - cpu0
        children1 = common.children_cpu_seconds()
        rss, peak = rss_mib()
        turns = sim.stats.turns - stats_before[0]
        writes = sim.stats.writes - stats_before[1]
        busy = sim.stats.busy_seconds - stats_before[2]
        # Cross-check with the cluster once: every GPUNode's lastHeartbeatTime.
        try:
            listed = heartbeat_ages(custom, time.time())
        except client.ApiException as error:
            print(f"listing GPUNodes failed: {error.status} {error.reason}", flush=True)
            listed = []
        results.update(
            {
                "steadyWindowSeconds": round(wall),
                "fleetCpuCores": round(cpu / wall, 3),
                "fleetCpuMillicoresPerNode": round(1000 * cpu / wall / args.nodes, 3),
                "rssMiB": round(rss),
                "peakRssMiB": round(peak),
                "rssKiBPerNode": round(rss * 1024 / args.nodes, 1),
                "turnsPerSecond": round(turns / wall, 1),
                "expectedTurnsPerSecond": round(args.nodes / args.interval, 1),
                "statusWritesPerSecond": round(writes / wall, 2),
                "meanTurnMilliseconds": round(1000 * busy / max(1, turns), 1),
                "lateTurns": sim.stats.late_turns - late_before,
                "maxLatenessSeconds": round(sim.stats.max_lateness_seconds, 2),
                "failedTurns": sim.stats.failed_turns,
                "writeFailures": sim.stats.write_failures,
                "oldestWriteAgeSeconds": round(oldest, 1),
                # An agent writes at its first turn after the heartbeat is due (up to one interval
                # later), and a turn counts as on time while it starts within another interval.
                "everyGpuNodeWithinHeartbeat": missing == 0 and oldest <= args.heartbeat + 2 * args.interval,
                "gpuNodesListed": len(listed),
                "oldestListedHeartbeatSeconds": round(max(listed, default=float("inf")), 1),
                "controlPlaneCpuCores": {
                    name: round((children1.get(name, 0.0) - children0.get(name, 0.0)) / wall, 3)
                    for name in sorted(children1)
                },
                "loadAverage1m": round(os.getloadavg()[0], 2),
            }
        )
        sim.stop()
        api.close()  # type: ignore[no-untyped-call]  # kubernetes ships no hints for it
    common.report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
