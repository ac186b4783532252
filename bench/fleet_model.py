"""The operator's own code over a generated fleet of 5,000 to 100,000 nodes: a scale model (issue 29 item 5).

No control plane: the operator runs through its replay entry point
(`gpuhealth_operator.replay.Operator`) over the in-memory cluster
(`gpuhealth_sim.backtest.memcluster.MemoryKube`), under a simulated clock, as the
backtest runs it. Its handlers, cache, due index, timer, budget and action
ladder are the live operator's; kopf, the HTTP client and JSON decoding of
the watch streams are not in the model (see "Not modelled" below).

The fleet: `tracegen.plan_fleet`'s boards and names (H100, H200, A100, L40S;
some time-sliced, some MIG), its Node objects (`tracegen.node_object`) and
the agent's status as the trace generator builds it (`tracegen._Sampler`:
8 or 4 GPUs, GPU-Boost clock jitter, load swings), with no episodes but the
faults below. Policy: examples/default-policy.yaml (the default rules, the
straggler cohorts included).

Per N nodes, in a subprocess of its own (a clean RSS):

1. priming: the policy, then every node's Node and GPUNode as the watches'
   first events (the agents' last writes spread over the heartbeat before
   start; the GPUNodes handed over across `--priming-seconds` before start,
   as a live operator's first look at a fleet takes ~30 s at 5,000 nodes, so
   each node's conditions carry a time of their own, as live), then the
   first full timer pass: CPU seconds; RSS per node = RSS
   after minus RSS before the operator was created (the in-memory cluster,
   the fleet's API server, is built before), divided by N;
2. the window (`--minutes` of simulated time): each node reports every
   `--heartbeat` seconds, the reports spread evenly; the timer runs every
   `settings.Settings().tick_seconds` (1 s), with a full pass every
   `full_pass_seconds` and the refresh every `ticker.REFRESH_SECONDS`, as
   `ticker.run` does; `--faults` nodes get an uncorrectable ECC error
   spread over the window (the agent writes at once) and must be cordoned.

Time is simulated; CPU is real (`time.process_time`, this process). CPU per
report = CPU inside the GPUNode handler / reports; tick CPU is counted
apart. Each event the operator receives is a fresh JSON-decoded copy of the
cluster's object, as a watch delivers it, and each answer to its status
writes too (as its HTTP client decodes one); the decoding is outside the
measured handler CPU for the events, inside it for the answers.

Not modelled: kopf's event machinery and the JSON decoding of watch events
(~15 % of the live operator's CPU at 2,000 nodes, bench/RESULTS.md), the
kubelet's Node status updates (a Node event per node every 5 minutes,
judged cheaply when nothing the operator reads changed), HTTP writes, agent
pods (the heartbeat alone judges liveness), `heap.trim` (live, after a burst
only: `heap.Trimmer`; measured here once, after priming).

    .venv/bin/python bench/fleet_model.py [--nodes 5000 20000 100000] [--minutes 60] [--heartbeat 300]
        [--largest-minutes M] [--faults 10] [--priming-seconds 30] [--json PATH] [--profile N]

Targets (issue 29): RSS per node ≤ 20 KiB at 100,000 nodes; CPU per report at
100,000 nodes within 2x of the 5,000-node figure (same invocation).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import io
import json
import logging
import os
import pathlib
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from gpuhealth_operator import replay
from gpuhealth_operator.runtime import heap, ticker
from gpuhealth_operator.shared import settings
from gpuhealth_sim.backtest import memcluster, replayer, tracegen

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "default-policy.yaml"
TARGET_RSS_KIB = 20.0
TARGET_REPORT_RATIO = 2.0
START = tracegen.START.timestamp()


class DecodingKube(memcluster.MemoryKube):
    """The in-memory cluster whose answers to status writes are fresh decoded copies, as the live HTTP
    client's are: the operator caches the answer, and must not share the cluster's objects."""

    async def apply(self, path: str, body: object, field_manager: str) -> dict[str, Any]:
        answer = await super().apply(path, body, field_manager)
        return json.loads(json.dumps(answer))  # type: ignore[no-any-return]


def rss_bytes() -> int:
    resident = heap.resident_bytes()
    if resident is None:
        raise SystemExit("fleet_model measures RSS from /proc/self/statm: Linux only")
    return resident


def deep_size(root: object) -> int:
    """Bytes of the objects reachable from `root` through containers (each object counted once)."""
    seen: set[int] = set()
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
    return total


def cluster_size(client: memcluster.MemoryKube) -> int:
    """What the in-memory cluster holds of the fleet (its Nodes, GPUNodes, Events, applied field sets)."""
    return deep_size([client.nodes, client.gpunodes, client.events, client.event_log, client._applied])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Model:
    """One fleet of `nodes` under the operator, in this process."""

    def __init__(
        self, nodes: int, heartbeat: float, faults: int, seed: int, priming_seconds: float = 0.0
    ) -> None:
        self.n = nodes
        self.priming_seconds = priming_seconds
        self.heartbeat = heartbeat
        self.now = START
        self.client = DecodingKube(clock=lambda: self.now)
        options = tracegen.Options(node_days=nodes / 24, seed=seed, nodes=nodes, heartbeat_seconds=heartbeat)
        plans, _ = tracegen.plan_fleet(options)
        self.plans = plans[:nodes]  # no replacements: the model's fleet is fixed
        rng = random.Random(seed)
        self.samplers = []
        for plan in self.plans:
            plan.episodes = []
            self.samplers.append(tracegen._Sampler(plan, random.Random(rng.random()), heartbeat))
        self.faulty = [(k * nodes) // faults + nodes // (2 * faults) for k in range(faults)] if faults else []
        self.profiler: cProfile.Profile | None = None

    def clock(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now, datetime.UTC)

    def phase(self, index: int) -> float:
        """When node `index` reports first in the window; every `heartbeat` seconds after."""
        return (index + 0.5) * self.heartbeat / self.n

    def report(self, index: int, t: float) -> dict[str, Any]:
        """The agent's write at window time `t`: the cluster's GPUNode after it, as a watch decodes it."""
        status = self.samplers[index].sample(t)
        gpus = [{k: v for k, v in g.items() if k != "_view"} for g in status["gpus"]]
        for gpu in status["gpus"]:  # the sampler needs only each GPU's view of its last sample
            for key in [k for k in gpu if k != "_view"]:
                del gpu[key]
        body = self.client.put_gpunode(self.plans[index].name, {**status, "gpus": gpus})
        return json.loads(json.dumps(body))  # type: ignore[no-any-return]

    async def timed(self, call: Any) -> float:
        began = time.process_time()
        if self.profiler is not None:
            self.profiler.enable()
        await call
        if self.profiler is not None:
            self.profiler.disable()
        return time.process_time() - began

    async def run(self, minutes: float, profile: bool) -> dict[str, Any]:
        config = settings.Settings()
        logging.getLogger("gpuhealth_operator").setLevel(logging.ERROR)
        policy = replayer.load_policy(POLICY)
        # The cluster as the operator finds it: every Node, every GPUNode with the agent's last write.
        nodes = []
        for plan in self.plans:
            obj = tracegen.node_object(plan, False)
            nodes.append(self.client.put_node(replayer._merge_node(None, obj, apply_unschedulable=True)))
        for index in range(self.n):
            self.now = START + self.phase(index) - self.heartbeat
            self.report(index, self.now - START)
        self.now = START
        gc.collect()
        rss_before, cluster_before = rss_bytes(), cluster_size(self.client)
        operator = replay.Operator(self.client, self.clock, instance="fleet-model")
        if profile:
            self.profiler = cProfile.Profile()
        priming = await self.timed(operator.policy_event("ADDED", json.loads(json.dumps(policy))))
        for node in nodes:
            priming += await self.timed(operator.node_event("ADDED", json.loads(json.dumps(node))))
        del nodes
        for index, plan in enumerate(self.plans):
            self.now = START - self.priming_seconds * (1 - index / self.n)
            body = json.loads(json.dumps(self.client.gpunodes[plan.name]))
            priming += await self.timed(operator.gpunode_event("ADDED", body))
        self.now = START
        priming += await self.timed(operator.tick(full=True, refresh=True))
        gc.collect()
        rss_after = rss_bytes()
        # The operator's writes grow the cluster too (its conditions on every GPUNode, its labels): the
        # fleet's API server's memory, not the operator's; taken out of the per-node figure.
        cluster_growth = cluster_size(self.client) - cluster_before
        began = time.process_time()
        heap.trim()
        trim = time.process_time() - began
        rss_trimmed = rss_bytes()

        window = minutes * 60
        tick_seconds, full_seconds = config.tick_seconds, config.full_pass_seconds
        fault_at = [window * (k + 0.5) / len(self.faulty) for k in range(len(self.faulty))]
        for index, at in zip(self.faulty, fault_at, strict=True):
            self.plans[index].episodes = [
                tracegen.Episode("fatal", at, float("inf"), {"fault": "DBE", "gpu": 0})
            ]
        pending = sorted(zip(fault_at, self.faulty, strict=True))
        watched: dict[int, tuple[float, float]] = {}
        """Fault node → (fault time, CPU of its report's handler), until it is cordoned."""
        faults: list[dict[str, Any]] = []
        report_cpu: list[float] = []
        tick_cpu: list[float] = []
        full_cpu: list[float] = []
        next_tick, last_full, last_refresh = tick_seconds, 0.0, 0.0

        async def ticks_until(t: float) -> None:
            nonlocal next_tick, last_full, last_refresh
            while next_tick <= t:
                self.now = START + next_tick
                full = next_tick - last_full >= full_seconds
                refresh = full or next_tick - last_refresh >= ticker.REFRESH_SECONDS
                last_full = next_tick if full else last_full
                last_refresh = next_tick if refresh else last_refresh
                spent = await self.timed(operator.tick(full=full, refresh=refresh))
                (full_cpu if full else tick_cpu).append(spent)
                self.cordoned(watched, faults, next_tick)
                next_tick += tick_seconds

        async def deliver(index: int, t: float) -> float:
            await ticks_until(t)
            self.now = START + t
            return await self.timed(operator.gpunode_event("MODIFIED", self.report(index, t)))

        cycle = 0
        while cycle * self.heartbeat < window:
            for index in range(self.n):
                t = self.phase(index) + cycle * self.heartbeat
                if t > window:
                    break
                while pending and pending[0][0] <= t:
                    at, faulty = pending.pop(0)
                    watched[faulty] = (at, await deliver(faulty, at))
                    self.cordoned(watched, faults, at)
                report_cpu.append(await deliver(index, t))
            cycle += 1
        for at, faulty in pending:
            watched[faulty] = (at, await deliver(faulty, at))
        await ticks_until(window + 5)  # a fault near the end gets its ticks
        faults += [
            {"node": self.plans[i].name, "at": at, "cordonedAfter": None} for i, (at, _) in watched.items()
        ]

        result: dict[str, Any] = {
            "nodes": self.n,
            "minutes": minutes,
            "heartbeatSeconds": self.heartbeat,
            "primingSeconds": self.priming_seconds,
            "tickSeconds": tick_seconds,
            "fullPassSeconds": full_seconds,
            "primingCpuSeconds": round(priming, 2),
            "rssBeforeMiB": round(rss_before / 2**20, 1),
            "rssAfterMiB": round(rss_after / 2**20, 1),
            "rssPerNodeRawKiB": round((rss_after - rss_before) / 1024 / self.n, 2),
            "clusterGrowthPerNodeKiB": round(cluster_growth / 1024 / self.n, 2),
            "rssPerNodeKiB": round((rss_after - rss_before - cluster_growth) / 1024 / self.n, 2),
            "rssPerNodeTrimmedKiB": round((rss_trimmed - rss_before - cluster_growth) / 1024 / self.n, 2),
            "trimMs": round(trim * 1000, 1),
            "reports": len(report_cpu),
            "reportCpuMs": round(1000 * sum(report_cpu) / max(1, len(report_cpu)), 3),
            "reportCpuP99Ms": round(1000 * percentile(report_cpu, 0.99), 3),
            "ticks": len(tick_cpu),
            "tickMeanMs": round(1000 * statistics.fmean(tick_cpu), 3) if tick_cpu else None,
            "tickP99Ms": round(1000 * percentile(tick_cpu, 0.99), 3),
            "fullPasses": len(full_cpu),
            "fullMeanMs": round(1000 * statistics.fmean(full_cpu), 1) if full_cpu else None,
            "fullP99Ms": round(1000 * percentile(full_cpu, 0.99), 1),
            "windowCpuSeconds": round(sum(report_cpu) + sum(tick_cpu) + sum(full_cpu), 2),
            "faults": sorted(faults, key=lambda f: f["at"]),
            "cordoned": sum(1 for f in faults if f["cordonedAfter"] is not None),
        }
        # One core's capacity: the timer's CPU per second of time, the rest for reports.
        timer_share = (sum(tick_cpu) + sum(full_cpu)) / window
        per_report = sum(report_cpu) / max(1, len(report_cpu))
        result["timerCpuShare"] = round(timer_share, 4)
        result["reportsPerSecond"] = round(self.n / self.heartbeat, 1)
        result["coreReportsPerSecond"] = round((1 - timer_share) / per_report) if per_report else None
        if self.profiler is not None:
            result["profile"] = top_functions(self.profiler)
            result["profileSelf"] = top_functions(self.profiler, order="tottime")
        return result

    def cordoned(
        self, watched: dict[int, tuple[float, float]], faults: list[dict[str, Any]], t: float
    ) -> None:
        for index in [
            i for i in watched if self.client.nodes[self.plans[i].name]["spec"].get("unschedulable")
        ]:
            at, cpu = watched.pop(index)
            faults.append(
                {
                    "node": self.plans[index].name,
                    "at": round(at, 3),
                    "cordonedAfter": round(t - at, 3),
                    "reportCpuMs": round(cpu * 1000, 3),
                }
            )


def top_functions(profiler: cProfile.Profile, count: int = 10, order: str = "cumulative") -> list[str]:
    """The operator's `count` functions of most `order` time (cProfile), as lines."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(order).print_stats(r"gpuhealth_operator", count)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return [line.rstrip() for line in lines[start : start + count + 1] if line.strip()]


def one(args: argparse.Namespace) -> None:
    model = Model(args.one, args.heartbeat, args.faults, args.seed, args.priming_seconds)
    result = asyncio.run(model.run(args.minutes, args.profile == args.one))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 20000, 100000])
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes per fleet")
    parser.add_argument(
        "--largest-minutes", type=float, help="simulated minutes of the largest fleet (a sample)"
    )
    parser.add_argument("--heartbeat", type=float, default=300.0)
    parser.add_argument(
        "--priming-seconds",
        type=float,
        default=30.0,
        help="simulated time over which the first GPUNode events arrive (0: at one instant, as before 11-28)",
    )
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", type=int, help="cProfile the operator at this fleet size (slower)")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return
    results = []
    largest = max(args.nodes)
    for n in args.nodes:
        minutes = args.largest_minutes if n == largest and args.largest_minutes else args.minutes
        command = [sys.executable, __file__, "--one", str(n), "--minutes", str(minutes)]
        command += [
            "--heartbeat",
            str(args.heartbeat),
            "--priming-seconds",
            str(args.priming_seconds),
            "--faults",
            str(args.faults),
            "--seed",
            str(args.seed),
        ]
        if args.profile is not None:
            command += ["--profile", str(args.profile)]
        began = time.perf_counter()
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["processWallSeconds"] = round(time.perf_counter() - began, 1)
        results.append(result)
        print(f"{n} nodes: done in {result['processWallSeconds']} s", file=sys.stderr, flush=True)
    print_table(results)
    if args.json:
        document = {
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "loadAverage": os.getloadavg(),
            "results": results,
        }
        args.json.write_text(json.dumps(document, indent=1), encoding="utf-8")


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        "| nodes | sim. min | reports | priming CPU s | RSS/node KiB: operator (trimmed; raw ΔRSS) "
        "| CPU/report ms (p99) | tick mean / p99 ms | full pass mean / p99 ms | timer CPU share "
        "| reports/s: fleet / one core | faults cordoned (max after, s) |"
    )
    print("|" + "---|" * 11)
    for r in results:
        after = [f["cordonedAfter"] for f in r["faults"] if f["cordonedAfter"] is not None]
        rss = f"{r['rssPerNodeKiB']} ({r['rssPerNodeTrimmedKiB']}; {r['rssPerNodeRawKiB']})"
        print(
            f"| {r['nodes']:,} | {r['minutes']:g} | {r['reports']:,} | {r['primingCpuSeconds']} | {rss} "
            f"| {r['reportCpuMs']} ({r['reportCpuP99Ms']}) | {r['tickMeanMs']} / {r['tickP99Ms']} "
            f"| {r['fullMeanMs']} / {r['fullP99Ms']} | {100 * r['timerCpuShare']:.1f} % "
            f"| {r['reportsPerSecond']} / {r['coreReportsPerSecond']} "
            f"| {r['cordoned']}/{len(r['faults'])} ({max(after, default=None)}) |"
        )
    base = next((r for r in results if r["nodes"] == 5000), results[0])
    big = max(results, key=lambda r: r["nodes"])
    ratio = big["reportCpuMs"] / base["reportCpuMs"] if base["reportCpuMs"] else float("nan")
    rss_met = "met" if big["rssPerNodeKiB"] <= TARGET_RSS_KIB else "NOT met"
    print(
        f"\ntargets (issue 29): RSS/node at {big['nodes']:,} ≤ {TARGET_RSS_KIB:g} KiB: "
        f"{big['rssPerNodeKiB']} ({rss_met}); CPU/report at {big['nodes']:,} within {TARGET_REPORT_RATIO:g}x "
        f"of {base['nodes']:,}: {ratio:.2f}x ({'met' if ratio <= TARGET_REPORT_RATIO else 'NOT met'})"
    )
    for r in results:
        if r["minutes"] != results[0]["minutes"]:
            print(f"sampled: {r['nodes']:,} nodes ran {r['minutes']:g} simulated minutes")
    for r in results:
        if "profile" in r:
            print(f"\ncProfile at {r['nodes']:,} nodes (operator functions, cumulative):")
            print("\n".join(r["profile"]))
            print(f"\ncProfile at {r['nodes']:,} nodes (operator functions, own time):")
            print("\n".join(r["profileSelf"]))


if __name__ == "__main__":
    main()
