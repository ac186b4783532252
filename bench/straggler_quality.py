"""Straggler verdict quality across seeds: precision and recall per seed, their mean and worst.

A verdict tuned on one trace must hold on traces it has never seen (issue 27). For
each seed this generates (or reuses) a synthetic labelled trace of `--node-days`
(`gpu-health-sim trace generate`), backtests examples/default-policy.yaml on it
through the operator's own code, and scores the Straggler labels against the
truth (`scoring.score_stragglers`: recall over episodes of at least 10 %
slowdown, precision over the labels set). It prints one line per seed, the
mean and the worst, and every missed episode with what the operator saw of it
(its node's z-scores during the episode: median and the share below
-threshold). `--record` appends the section to bench/RESULTS.md.

    .venv/bin/python bench/straggler_quality.py [--seeds 101-112] [--node-days 200] [--jobs 2] [--record]

The default seeds (101-112) are used by no test and by no other benchmark.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

from gpuhealth_operator.decisions import straggler_stats
from gpuhealth_sim.backtest import replayer, scoring, tracegen, traces

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "default-policy.yaml"
THRESHOLD = 3.5
"""The default policy's Straggler threshold (examples/default-policy.yaml)."""


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def _trace(node_days: float, seed: int, workdir: pathlib.Path) -> pathlib.Path:
    trace = workdir / f"stragglers-{node_days:g}nd-seed{seed}.jsonl.gz"
    if not trace.exists() or _revision(trace) != tracegen.REVISION:
        partial = trace.with_suffix(f".partial-{os.getpid()}.gz")  # two runs may generate the same seed
        tracegen.generate(tracegen.Options(node_days, seed), partial)
        partial.rename(trace)
    return trace


def _revision(trace: pathlib.Path) -> object:
    try:
        with traces.open_trace(trace) as (header, _):
            return (header.get("generator") or {}).get("revision")
    except traces.TraceError:
        return None


def measure(node_days: float, seed: int, workdir: str, tag: str = "") -> dict[str, Any]:
    """One seed: the trace, its backtest, the straggler score and the missed episodes (in a worker).
    With a `tag` (naming the code measured), the result is kept in `workdir` and read back next time."""
    kept = pathlib.Path(workdir) / f"stragglers-{node_days:g}nd-seed{seed}.{tag}.json"
    if tag and kept.exists():
        run = json.loads(kept.read_text(encoding="utf-8"))
        return {**run, "score": scoring.StragglerScore(**run["score"])}
    run = _measure(node_days, seed, workdir)
    if tag:
        kept.write_text(json.dumps({**run, "score": dataclasses.asdict(run["score"])}), encoding="utf-8")
    return run


def _measure(node_days: float, seed: int, workdir: str) -> dict[str, Any]:
    began = time.process_time()
    trace = _trace(node_days, seed, pathlib.Path(workdir))
    seen: dict[str, list[tuple[float, float, int]]] = {}
    """Each node's (time, z, peers) as the timer judged it: what the operator saw of a missed episode."""
    result = _run_watching(trace, seen)
    header_start = _start(trace)
    _, truth_all = traces.read_truth(trace)
    truth = [r for r in truth_all if r.get("node") in result.selected]
    flags = scoring.our_straggler_flags(result.actions)
    score = scoring.score_stragglers(truth, flags)
    missed = []
    for episode in truth:
        if episode.get("type") != "straggler" or episode.get("slowdown", 0) < scoring.STRAGGLER_SLOWDOWN:
            continue
        if any(f.node == episode["node"] and episode["start"] <= f.t <= episode["end"] for f in flags):
            continue
        zs = [
            (z, peers)
            for at, z, peers in seen.get(episode["node"], [])
            if episode["start"] <= at - header_start <= episode["end"]
        ]
        model = next(
            (r["model"] for r in truth_all if r.get("type") == "node" and r["node"] == episode["node"]), "?"
        )
        missed.append(
            {
                "node": episode["node"],
                "model": model,
                "slowdown": episode["slowdown"],
                "gpus": episode["gpus"],
                "hours": round((episode["end"] - episode["start"]) / 3600, 1),
                "samples": len(zs),
                "zMedian": statistics.median(z for z, _ in zs) if zs else None,
                "belowThreshold": sum(1 for z, _ in zs if z < -THRESHOLD) / len(zs) if zs else None,
                "peers": min((p for _, p in zs), default=None),
            }
        )
    return {
        "seed": seed,
        "nodes": result.nodes,
        "nodeDays": result.node_days,
        "score": score,
        "missed": missed,
        "observed": [sum(len(v) for v in seen.values()), len(seen)],
        "cpuSeconds": time.process_time() - began,
    }


def _start(trace: pathlib.Path) -> float:
    with traces.open_trace(trace) as (header, _):
        return float(header["start"])


class HookNotCalled(RuntimeError):
    """The operator never told the observer of a sample: this benchmark would measure nothing."""


def _run_watching(trace: pathlib.Path, seen: dict[str, list[tuple[float, float, int]]]) -> replayer.Result:
    """Backtest with every node's z-score recorded per sample, as the operator's straggler windows take
    them (`replay.StragglerObserver`, the product's own hook: no function of the operator is patched).
    A trace with straggler reports whose replay never calls the hook fails loudly (`HookNotCalled`)."""
    calls = 0

    def observe(key: tuple[str, str], sampled_at: datetime.datetime, score: Any) -> None:
        nonlocal calls
        calls += 1
        seen.setdefault(key[1], []).append((sampled_at.timestamp(), score.z_score, score.peers))

    result = replayer.run(trace, replayer.load_policy(POLICY), 30.0, straggler_observer=observe)
    if calls == 0 and result.nodes >= straggler_stats.MIN_PEERS + 1:
        raise HookNotCalled(
            f"{trace.name}: the operator never called its straggler observer over {result.nodes} nodes "
            "(cohorts.Cohorts.observer, told each sample a straggler window takes): the hook is gone "
            "or moved, and the missed episodes' z-scores would read 'no score'. Wire it again."
        )
    return result


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def section(args: argparse.Namespace, runs: list[dict[str, Any]], wall: float, label: str) -> str:
    lines = [
        f"## straggler_quality — {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}{label}",
        "",
        f"- machine: {platform.node() or 'vm'}: {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- command: `python bench/straggler_quality.py --seeds {args.seeds} --node-days {args.node_days:g}`",
        f"- {len(runs)} seeds, {wall:.0f} s wall, {sum(r['cpuSeconds'] for r in runs):.0f} CPU-s "
        f"({args.jobs} jobs)",
        "- z-scores seen through the operator's straggler observer: "
        + ", ".join(
            f"seed {r['seed']} {r['observed'][0]} samples of {r['observed'][1]} nodes"
            if "observed" in r  # a result kept (--tag) by an older version has none
            else f"seed {r['seed']} not recorded"
            for r in runs
        ),
        "",
        "| seed | nodes | episodes ≥ 10 % | found | recall | labels right | labels wrong | precision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s: scoring.StragglerScore = run["score"]
        lines.append(
            f"| {run['seed']} | {run['nodes']} | {s.episodes} | {s.found} | {_pct(s.recall)} | "
            f"{s.true_flags} | {s.false_flags} | {_pct(s.precision)} |"
        )
    recalls = [r["score"].recall for r in runs if r["score"].recall is not None]
    precisions = [r["score"].precision for r in runs if r["score"].precision is not None]
    episodes = sum(r["score"].episodes for r in runs)
    found = sum(r["score"].found for r in runs)
    right = sum(r["score"].true_flags for r in runs)
    wrong = sum(r["score"].false_flags for r in runs)
    lines += [
        f"| **mean** | | {episodes} | {found} | {_pct(statistics.fmean(recalls) if recalls else None)} | "
        f"{right} | {wrong} | {_pct(statistics.fmean(precisions) if precisions else None)} |",
        f"| **worst** | | | | {_pct(min(recalls, default=None))} | | | "
        f"{_pct(min(precisions, default=None))} |",
        "",
    ]
    missed = [(r["seed"], m) for r in runs for m in r["missed"]]
    if missed:
        lines.append("Missed episodes (z: the node's z-scores during the episode, per report):")
        lines.append("")
        for seed, m in missed:
            z = "no score" if m["zMedian"] is None else f"z median {m['zMedian']:.1f}"
            below = "" if m["belowThreshold"] is None else f", {100 * m['belowThreshold']:.0f} % below -3.5"
            lines.append(
                f"- seed {seed} {m['node']} ({m['model']}): {100 * m['slowdown']:.1f} % {m['gpus']} GPU(s), "
                f"{m['hours']} h; {m['samples']} reports, {z}{below}, min peers {m['peers']}"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    top.add_argument("--seeds", default="101-112", help="seeds: 101-112, or 5,9,101-104")
    top.add_argument("--node-days", type=float, default=200.0)
    top.add_argument("--jobs", type=int, default=2, help="seeds judged at once (processes)")
    top.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/gpu-health-bench"))
    top.add_argument("--label", default="", help="appended to the section's title (e.g. ' (before)')")
    top.add_argument(
        "--tag", default="", help="keep each seed's result in --workdir under this tag, reuse it"
    )
    top.add_argument("--reverse", action="store_true", help="judge the seeds last first (results in order)")
    top.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    args = top.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    seeds = _seeds(args.seeds)
    order = seeds[::-1] if args.reverse else seeds
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        done = pool.map(
            measure,
            [args.node_days] * len(order),
            order,
            [str(args.workdir)] * len(order),
            [args.tag] * len(order),
        )
        runs = sorted(done, key=lambda run: seeds.index(run["seed"]))
    text = section(args, runs, time.perf_counter() - began, args.label)
    print(text)
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a", encoding="utf-8") as results:
            results.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
