"""The demo's backtest of its own run: the scripted faults as ground truth, and the one-line verdict.

The demo records its run with `tracerecord.Recorder` (the `record` command's
code) while the live operator acts. At the end it appends, as `truth`
records, the faults its fleet file scripted (so `scoring.score` can say what
was caught), replays the trace under the demo's policy with `replayer.run`,
and prints one line: how many Node actions the replay took, whether they are
the live operator's (per node, in order: `liveactions`), and the score.

Truth comes from the scenarios, read as the agent reads them: a double-bit
ECC error or a fatal XID is a `fatal` fault until the end (a repair that
fixed it live is not in the scenario's timeline; the score asks whether the
fault was acted on, which a repair does not change); a GPU whose clock
reasons include HwThermalSlowdown is a `thermal` episode until they no
longer do; GPUs clocked below 90 % of their maximum from the start are a
`straggler` for the whole run (slowdown: the missing fraction of the clock).
Other scripted changes are not ground truth here.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Collection, Iterator
from typing import Any, Final

from gpuhealth_agent import scenario as agent_scenario
from gpuhealth_sim.backtest import liveactions, replayer, scoring, traces
from gpuhealth_sim.fleet import fleetfile

FATAL_XIDS: Final = frozenset({48, 79, 94, 95})
THERMAL_REASON: Final = "HwThermalSlowdown"
STRAGGLER_CLOCK: Final = 0.9
"""A GPU clocked below this share of its maximum under load from the start is a straggler."""


def truth(
    spec: fleetfile.Fleet, offset: float, end: float, human: tuple[str, float] | None = None
) -> Iterator[dict[str, Any]]:
    """Truth records for the fleet's scripted faults; `offset`: the fleet's start in trace seconds."""
    offset, end = round(offset, 3), round(end, 3)
    for plan in spec.nodes:
        script = agent_scenario.from_data(plan.scenario, plan.scenario_source)
        base: dict[str, Any] = {"kind": "truth", "node": plan.name}
        clock, top = script.defaults.get("smClockMHz"), script.defaults.get("maxSmClockMHz")
        if clock and top and clock < STRAGGLER_CLOCK * top:
            slowdown = round(1 - clock / top, 3)
            episode = {"type": "straggler", "start": offset, "end": end, "slowdown": slowdown, "gpus": "all"}
            yield {**base, **episode}
        hot: dict[int, float] = {}
        for entry in script.timeline:
            at = round(offset + entry.after_seconds, 3)
            fault = (
                f"XID{entry.xid}"
                if entry.xid in FATAL_XIDS
                else "DBE"
                if entry.set.get("eccUncorrectedVolatile", 0) > 0
                else None
            )
            if fault is not None:
                yield {**base, "type": "fatal", "start": at, "end": end, "fault": fault, "gpu": entry.gpu}
            reasons = entry.set.get("clockEventReasons")
            if reasons is not None and (THERMAL_REASON in reasons) != (entry.gpu in hot):
                if entry.gpu in hot:
                    start = hot.pop(entry.gpu)
                    yield {**base, "type": "thermal", "start": start, "end": at, "gpus": [entry.gpu]}
                else:
                    hot[entry.gpu] = at
        for gpu, start in hot.items():
            yield {**base, "type": "thermal", "start": start, "end": end, "gpus": [gpu]}
    if human is not None:
        node, start = human[0], round(human[1], 3)
        yield {"kind": "truth", "type": "humanCordon", "node": node, "start": start, "end": end}


def verdict(
    trace: pathlib.Path, policy_path: pathlib.Path, tick_seconds: float, dra_nodes: Collection[str] = ()
) -> str:
    """Backtest `trace` under the policy and say, in one line, how that compares with the live run.

    `dra_nodes`: nodes whose GPUs DRA allocates; where the trace holds no ResourceSlice of one
    (a recording without DRA), the replay's IsolateGPU falls back to the node ladder there, and a
    difference is said to come from that.
    """
    began = time.monotonic()
    policy = replayer.load_policy(policy_path)
    name = str(policy["metadata"]["name"])
    result = replayer.run(trace, policy, tick_seconds)
    score = scoring.score(trace, result, baseline=False)
    with traces.open_trace(trace) as (_, records):
        kept = list(records)
    live = liveactions.from_trace(kept, name)
    sliced = {
        r["object"]["spec"].get("nodeName") for r in kept if r["kind"] == "resourceslice" and "object" in r
    }
    shown = [a for a in result.actions if a.action != "DryRun"]
    nodes = {a.node for a in live} | {a.node for a in shown}
    differ = liveactions.differences(live, shown)
    waited = {e["node"] for e in result.events if e["reason"] == "DisruptionBudgetExceeded"}
    same = "yes" if not differ else f"on {len(nodes) - len(differ)} of {len(nodes)} nodes, not on "
    same += " and ".join(
        _difference(n, *differ[n], n in dra_nodes and n not in sliced, n in waited) for n in differ
    )
    fatal = score["fatal"]
    return (
        f"backtest of this run (policy {name}, {tick_seconds:g} s ticks, "
        f"{time.monotonic() - began:.1f} s): {len(shown)} Node actions; same as live: {same}; "
        f"fatal faults acted on {fatal['acted']}/{fatal['faults']}, "
        f"false disruptive {fatal['falseDisruptive']}, "
        f"stragglers labelled {score['stragglers']['found']}/{score['stragglers']['episodes']}"
    )


def _difference(node: str, live: list[str], replayed: list[str], dra: bool, waited: bool) -> str:
    extra = [a for a in replayed if a not in live]
    missing = [a for a in live if a not in replayed]
    said = ([f"also {', '.join(extra)}"] if extra else []) + ([f"no {', '.join(missing)}"] if missing else [])
    why = (
        "; the trace holds no DRA devices of it, so IsolateGPU fell back to the node ladder"
        if dra
        else "; its budget was full"
        if waited
        else ""
    )
    return f"{node} (replay: {', '.join(said) or 'another order'}{why})"
