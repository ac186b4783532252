"""Backtest speed on both kinds of trace: CPU-s per 1,000 node-days, A/B between source trees.

Issue 52: the target (≤ 60 CPU-s per 1,000 node-days, aim 30) holds on the
project's seed traces and on one whose counters creep as real fleets' do
(`trace generate --creeping-counters`: PCIe AER correctable errors and
NVLink CRC counts growing slowly on most nodes; each such report is a change
a verdict reads). This bench generates one trace of each kind with this
tree's generator (same seed, same size), then replays the default policy on
each in a fresh process per run, for every `--tree` given (default: this
one), alternating the trees run by run so that the machine's load falls on
all alike; it prints each tree's median CPU-s per 1,000 node-days per trace
and, with two trees, the ratio (first ÷ second: > 1 means the second is
faster). A shared 2-core machine cannot replay 1,000 node-days for each
run: measure a small slice (the default, 60 node-days) and compare ratios.

    .venv/bin/python bench/backtest_speed.py [--node-days 60] [--nodes 30] [--rounds 3] \\
        [--tree /tmp/cost-base --tree .]

A tree is a checkout of this repository (its api/, agent/, operator/, sim/
source folders go first on the replay's PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from gpuhealth_sim.backtest import tracegen

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "default-policy.yaml"
SOURCE_FOLDERS = ("api", "agent", "operator", "sim", "plugin")
REPLAY = """
import json, pathlib, sys
from gpuhealth_sim.backtest import replayer
result = replayer.run(pathlib.Path(sys.argv[1]), replayer.load_policy(pathlib.Path(sys.argv[2])))
print(json.dumps({"cpu": result.cpu_seconds, "nodeDays": result.node_days, "records": result.records,
                  "actions": [a.to_json() for a in result.actions]}))
"""


def replay(tree: pathlib.Path, trace: pathlib.Path) -> dict[str, Any]:
    """One replay of `trace` under the default policy by `tree`'s code, in a fresh process."""
    path = os.pathsep.join(str(tree / folder) for folder in SOURCE_FOLDERS)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", REPLAY, str(trace), str(POLICY)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node-days", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree and trace (median kept)")
    parser.add_argument("--tree", type=pathlib.Path, action="append", help="source tree (default: this one)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    with tempfile.TemporaryDirectory(prefix="gpuhealth-speed-") as workdir:
        kinds = {"seed": False, "creeping": True}
        paths = {}
        for kind, creeping in kinds.items():
            paths[kind] = pathlib.Path(workdir) / f"{kind}.jsonl.gz"
            options = tracegen.Options(args.node_days, args.seed, args.nodes, creeping_counters=creeping)
            counts = tracegen.generate(options, paths[kind])
            print(f"{kind} trace: {args.node_days:g} node-days, {counts['records']} records", flush=True)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {str(t): {k: [] for k in kinds} for t in trees}
        for round_ in range(args.rounds):
            for kind in kinds:
                # Alternate the trees' order each round: neither always runs on the busier machine.
                for tree in trees if round_ % 2 == 0 else list(reversed(trees)):
                    runs[str(tree)][kind].append(replay(tree, paths[kind]))
    results: dict[str, Any] = {
        "nodeDays": args.node_days,
        "nodes": args.nodes,
        "seed": args.seed,
        "trees": {},
    }
    for tree, by_kind in runs.items():
        results["trees"][tree] = {}
        for kind, done in by_kind.items():
            per_1000 = [1000 * r["cpu"] / r["nodeDays"] for r in done]
            per_record_ms = [1000 * r["cpu"] / r["records"] for r in done]
            results["trees"][tree][kind] = {
                "cpuSecondsPer1000NodeDays": round(statistics.median(per_1000), 1),
                "msPerRecord": round(statistics.median(per_record_ms), 3),
                "runs": [round(x, 1) for x in per_1000],
            }
            print(
                f"{tree} {kind}: {statistics.median(per_1000):.1f} CPU-s per 1,000 node-days "
                f"({statistics.median(per_record_ms):.3f} ms per record; runs {[round(x) for x in per_1000]})"
            )
    if len(trees) == 2:
        a, b = (str(t) for t in trees)
        for kind in kinds:
            first, second = (results["trees"][t][kind]["cpuSecondsPer1000NodeDays"] for t in (a, b))
            # Same actions, or the speed-up is of another replay: compare what both trees did.
            same = runs[a][kind][0]["actions"] == runs[b][kind][0]["actions"]
            results.setdefault("ratio", {})[kind] = {"ratio": round(first / second, 2), "sameActions": same}
            print(f"{kind}: {a} ÷ {b} = {first / second:.2f}x (same actions: {'yes' if same else 'NO'})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
