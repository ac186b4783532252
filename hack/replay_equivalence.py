#!/usr/bin/env python3
"""Whether two source trees replay the same traces to the same report (issues 46 and 52's proof).

Usage: hack/replay_equivalence.py OLD_TREE NEW_TREE [--workdir D] [--node-days N] [--trace T --policy P]

A speed-up or a restructuring must not change one decision: every report of
`gpu-health-sim backtest -o json` must stay byte-identical but for its two
timing keys (`replaySeconds`, `replayCpuSeconds`). This script generates the
traces once into `--workdir` (this tree's generator; a trace already there is
reused), replays each under each tree's code in a process of its own (the
tree's api/, agent/, operator/, sim/ and plugin/ first on PYTHONPATH) and
compares the two reports. The cases: the seed trace under the default policy,
a trace whose counters creep (issue 52's hard case), node faults under the
default policy, under IsolateGPU (examples/fleets/demo-policy.yaml for every
node) and under a repair ladder; `--trace T --policy P` adds one of your own
(a demo's recorded run: `--policy examples/fleets/demo-policy.yaml`, with
`--tick-seconds 1` as the demo replays it). Prints one line per case and exits
1 when any differs, 2 when a replay fails.

A tree older than this one may read older trace formats only: edit the
header's `"version"` of a copy (`zcat T | sed '1s/"version":6/"version":5/'`)
when the trace holds no record the newer format added.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any, Final

REPO: Final = pathlib.Path(__file__).resolve().parents[1]
SOURCE_FOLDERS: Final = ("api", "agent", "operator", "sim", "plugin")
TIMING_KEYS: Final = frozenset({"replaySeconds", "replayCpuSeconds"})
DEFAULT: Final = REPO / "examples" / "default-policy.yaml"
REPAIR: Final = REPO / "examples" / "repair" / "reset-reboot-validate.yaml"
DEMO: Final = REPO / "examples" / "fleets" / "demo-policy.yaml"
CLI: Final = (
    "import sys; from gpuhealth_sim.cli import main; sys.argv[0] = 'gpu-health-sim'; sys.exit(main())"
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One replay to compare: a generated trace (its generator's flags) under a policy."""

    trace: str
    flags: tuple[str, ...]
    policy: str  # "default", "isolate", "repair" or a path
    tick_seconds: float | None = None


CASES: Final = (
    Case("seed1", ("--seed", "1"), "default"),
    Case("creeping5", ("--seed", "5", "--creeping-counters"), "default"),
    Case("faults2", ("--seed", "2", "--node-faults"), "default"),
    Case("faults3", ("--seed", "3", "--node-faults"), "isolate"),
    Case("faults4", ("--seed", "4", "--node-faults"), "isolate"),
    Case("faults2", ("--seed", "2", "--node-faults"), "repair"),
)


def comparable(report: Any) -> Any:
    """The report without its timing keys, which differ between any two runs."""
    if isinstance(report, dict):
        return {k: comparable(v) for k, v in report.items() if k not in TIMING_KEYS}
    if isinstance(report, list):
        return [comparable(v) for v in report]
    return report


def isolate_policy(workdir: pathlib.Path) -> pathlib.Path:
    """The demo's IsolateGPU policy without its nodeSelector, so that every node of a trace is judged."""
    kept = []
    skipping = False
    for line in DEMO.read_text().splitlines():
        if line.startswith("  nodeSelector:"):
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        kept.append(line)
    path = workdir / "isolate-policy.yaml"
    path.write_text("\n".join(kept) + "\n")
    return path


def generate(workdir: pathlib.Path, case: Case, node_days: float) -> pathlib.Path:
    path = workdir / f"{case.trace}-{node_days:g}.jsonl.gz"
    if not path.exists():
        command = [sys.executable, "-c", CLI, "trace", "generate", "--node-days", f"{node_days:g}"]
        subprocess.run([*command, *case.flags, "--out", str(path)], check=True, capture_output=True, cwd=REPO)
    return path


def replay(tree: pathlib.Path, trace: pathlib.Path, policy: pathlib.Path, tick: float | None) -> str:
    """The tree's report of `trace` under `policy`, timing keys dropped, as canonical JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / f) for f in SOURCE_FOLDERS)}
    command = [sys.executable, "-c", CLI, "backtest", "--policy", str(policy), "--trace", str(trace)]
    command += ["-o", "json", *(["--tick-seconds", f"{tick:g}"] if tick is not None else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: backtest of {trace.name} failed: {done.stderr.strip()[-2000:]}")
    return json.dumps(comparable(json.loads(done.stdout)), sort_keys=True, indent=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", type=pathlib.Path, help="the tree before (a checkout of this repository)")
    parser.add_argument("new", type=pathlib.Path, help="the tree after")
    parser.add_argument(
        "--workdir", type=pathlib.Path, help="where the traces are kept (default: a temporary one)"
    )
    parser.add_argument("--node-days", type=float, default=40.0, help="size of each generated trace")
    parser.add_argument("--trace", type=pathlib.Path, help="also compare this trace (with --policy)")
    parser.add_argument("--policy", type=pathlib.Path, help="the policy for --trace")
    parser.add_argument(
        "--tick-seconds", type=float, help="for --trace: simulated seconds between timer passes"
    )
    args = parser.parse_args(argv)
    if (args.trace is None) != (args.policy is None):
        parser.error("--trace and --policy go together")
    with tempfile.TemporaryDirectory(prefix="gpuhealth-equivalence-") as scratch:
        workdir = args.workdir or pathlib.Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        policies = {"default": DEFAULT, "repair": REPAIR, "isolate": isolate_policy(workdir)}
        runs = [
            (
                f"{c.trace}-{args.node_days:g} {c.policy}",
                generate(workdir, c, args.node_days),
                policies[c.policy],
                None,
            )
            for c in CASES
        ]
        if args.trace is not None:
            runs.append((f"{args.trace.name} {args.policy.stem}", args.trace, args.policy, args.tick_seconds))
        differing = 0
        for name, trace, policy, tick in runs:
            try:
                old, new = (replay(tree.resolve(), trace, policy, tick) for tree in (args.old, args.new))
            except RuntimeError as failed:
                print(f"{name}: FAILED\n{failed}", flush=True)
                return 2
            if old == new:
                print(f"{name}: identical ({old.count(chr(10)) + 1} lines)", flush=True)
                continue
            differing += 1
            print(f"{name}: DIFFERENT", flush=True)
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "old", "new", lineterm="", n=1)
            print("\n".join(list(diff)[:40]), flush=True)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
