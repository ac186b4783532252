"""Verdict quality and backtest speed: the default policy on a synthetic labelled 1,000 node-day trace.

Generates (or reuses) a trace with `gpu-health-sim trace generate`, backtests
examples/default-policy.yaml on it through the operator's own code, scores the
result against the trace's truth, and prints the figures beside the targets
of issue 13, with the baseline straggler rule (CV of step time > 0.1) beside
ours. `--record` appends the section to bench/RESULTS.md.

    .venv/bin/python bench/backtest_quality.py [--quick] [--node-days 1000] [--seed 1] [--record]
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any

from gpuhealth_sim.backtest import replayer, scoring, subcommands, tracegen, traces

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "default-policy.yaml"
TARGETS = {
    "fatal recall": "100 %",
    "false disruptive actions": "0",
    "straggler precision": "≥ 99 %",
    "straggler recall": "≥ 90 %",
    "label flaps per node-day": "0",
    "maxUnavailable kept": "yes",
    "backtest seconds": "≤ 60",
}


def measure(
    node_days: float, seed: int, workdir: pathlib.Path, tick_seconds: float, node_faults: bool = False
) -> dict[str, Any]:
    trace = workdir / f"bench-{node_days:g}nd-seed{seed}{'-nodefaults' if node_faults else ''}.jsonl.gz"
    generated = None
    if not trace.exists() or _revision(trace) != tracegen.REVISION:
        began = time.perf_counter()
        tracegen.generate(tracegen.Options(node_days, seed, node_faults=node_faults), trace)
        generated = time.perf_counter() - began
    result = replayer.run(trace, replayer.load_policy(POLICY), tick_seconds)
    score = scoring.score(trace, result)
    report = {**result.to_json(), "score": score}
    trace.with_suffix(".backtest.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return {"trace": trace, "generated": generated, "result": result, "score": score}


def _revision(trace: pathlib.Path) -> object:
    """The generator revision a cached trace was written by (None: unreadable or before revisions)."""
    try:
        with traces.open_trace(trace) as (header, _):
            return (header.get("generator") or {}).get("revision")
    except traces.TraceError:
        return None


def per_sample(trace: pathlib.Path, tick_seconds: float) -> dict[str, Any]:
    """The straggler score with the rule as it was before the window: every sample must be flagged."""
    result = replayer.run(trace, replayer.load_policy(POLICY), tick_seconds, straggler_window=False)
    return scoring.score(trace, result, baseline=False)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def section(args: argparse.Namespace, run: dict[str, Any], before: dict[str, Any] | None) -> str:
    result: replayer.Result = run["result"]
    score = run["score"]
    fatal, ours, base = score["fatal"], score["stragglers"], score["baselineStragglers"]
    rows = [
        (
            "fatal recall",
            f"{_pct(fatal['recall'])} ({fatal['acted']}/{fatal['faults']}"
            + (f", {fatal['alreadyOut']} on a node already out of service" if fatal.get("alreadyOut") else "")
            + ")",
            "—",
        ),
        ("fault → action p50 / p99", f"{fatal['secondsToActionP50']} / {fatal['secondsToActionP99']} s", "—"),
        ("false disruptive actions", str(fatal["falseDisruptive"]), "—"),
        (
            "straggler precision",
            f"{_pct(ours['precision'])} ({ours['trueFlags']} right, {ours['falseFlags']} wrong, "
            f"{ours['explainedFlags']} while thermal or power slowed the node: neither)",
            # The baseline has no thermal or power label: its flags there are wrong (scoring.score).
            f"{_pct(base['precision'])} ({base['trueFlags']} right, {base['falseFlags']} wrong, "
            f"{base['explainedFlags']} of them while thermal or power slowed the node)",
        ),
        (
            "straggler recall",
            f"{_pct(ours['recall'])} ({ours['found']}/{ours['episodes']})",
            f"{_pct(base['recall'])} ({base['found']}/{base['episodes']})",
        ),
        ("label flaps per node-day", str(score["labelFlapsPerNodeDay"]), "—"),
        ("maxUnavailable kept", "yes" if score["maxUnavailableRespected"] else "NO", "—"),
        ("backtest seconds", f"{result.seconds:.1f} (CPU {result.cpu_seconds:.1f})", "—"),
    ]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    size = " --quick" if args.quick else f" --node-days {args.node_days:g}"
    command = "python bench/backtest_quality.py" + size + (" --node-faults" if args.node_faults else "")
    lines = [
        f"## backtest_quality — {now}{' (quick)' if args.quick else ''}",
        "",
        f"- machine: {platform.node() or 'vm'}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.platform()}",
        f"- command: `{command} --seed {args.seed}`",
        f"- trace: {result.nodes} nodes, {result.node_days:.0f} node-days, {result.records} records"
        + (f", generated in {run['generated']:.0f} s" if run["generated"] is not None else ""),
        f"- replay: {result.records / max(result.seconds, 1e-9):.0f} records/s, "
        f"tick {args.tick_seconds:g} s, load average {os.getloadavg()[0]:.1f} at the end",
        "",
        "| measure | ours (default policy) | baseline rule (CV > 0.1) | target |",
        "|---|---|---|---|",
    ]
    for name, value, baseline in rows:
        lines.append(f"| {name} | {value} | {baseline} | {TARGETS.get(name.split(' p50')[0], '—')} |")
    if fatal["missed"]:
        lines += ["", f"- missed fatal faults: {', '.join(fatal['missed'])}"]
    early = score["earlyWarnings"]
    if args.node_faults:
        lead = "n/a" if early["leadSecondsP50"] is None else f"{early['leadSecondsP50'] / 3600:.1f} h"
        by_fault = ", ".join(f"{k} {v['acted']}/{v['faults']}" for k, v in fatal["byFault"].items())
        degraded = ", ".join(
            f"{k} {v['found']}/{v['episodes']}" for k, v in early["degradedEpisodes"].items()
        )
        lines += [
            "",
            f"- fatal faults acted on, by fault: {by_fault}",
            "- fatal memory faults preceded by a MemoryDegrading label: "
            f"{early['warned']}/{early['memoryFaults']} ({_pct(early['share'])}); "
            "of those whose truth has a warning phase "
            f"{early['withWarningPhaseWarned']}/{early['withWarningPhase']}; median lead "
            f"{lead}",
            f"- non-fatal episodes whose condition named the node while they lasted: {degraded}",
        ]
    lines += ["", "- " + subcommands.score_line(score)]
    if before is not None:
        old = before["stragglers"]
        lines.append(
            f"- the same trace with Straggler judged per sample (before the window): precision "
            f"{_pct(old['precision'])} ({old['trueFlags']} right, {old['falseFlags']} wrong), recall "
            f"{_pct(old['recall'])} ({old['found']}/{old['episodes']}), "
            f"flaps/node-day {before['labelFlapsPerNodeDay']}"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    top.add_argument("--quick", action="store_true", help="100 node-days instead of 1,000 (development)")
    top.add_argument("--node-days", type=float, default=1000.0)
    top.add_argument("--seed", type=int, default=1)
    top.add_argument("--tick-seconds", type=float, default=30.0)
    top.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/gpu-health-bench"))
    top.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    top.add_argument(
        "--node-faults",
        action="store_true",
        help="a trace with issue 27's faults (trace generate --node-faults)",
    )
    top.add_argument(
        "--per-sample", action="store_true", help="also score the Straggler rule as judged before the window"
    )
    args = top.parse_args()
    if args.quick:
        args.node_days = 100.0
    args.workdir.mkdir(parents=True, exist_ok=True)
    run = measure(args.node_days, args.seed, args.workdir, args.tick_seconds, args.node_faults)
    before = per_sample(run["trace"], args.tick_seconds) if args.per_sample else None
    text = section(args, run, before)
    print(text)
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a", encoding="utf-8") as results:
            results.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
