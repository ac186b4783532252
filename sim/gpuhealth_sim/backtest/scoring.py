"""Scoring a backtest against a trace's ground truth, and the baseline straggler rule beside it.

What is measured (docs/backtest.md has the reasoning), on the nodes the policy
selected (`Result.selected`: a pool's policy answers for its pool, not for the
faults of nodes it never selects):

- fatal-fault recall: the share of `truth` fatal faults on whose node the
  policy cordoned or drained (or, in dry run, said it would) between the
  fault and its repair; the time from the fault to that action, p50/p99;
- false disruptive actions: cordons and drains of a node with no fatal fault
  at the time (from the fault to RECOVERY_SLACK after its repair);
- stragglers, per episode: recall over the real stragglers of at least
  STRAGGLER_SLOWDOWN, labelled between the start and the end of the episode;
  precision over the straggler labels set, a label being right when it falls
  in a real straggler episode (any slowdown) and wrong when it falls where
  nothing slowed the node (labels during thermal or power-brake episodes,
  where the node was in fact slowed, count neither way);
- early warnings (issue 27): of the fatal memory faults (MEMORY_FAULTS), the
  share whose node had a MemoryDegrading label (any Node change while its
  issues named MemoryDegrading) before the fault, within WARNING_LOOKBACK or
  the truth's warning phase, and the median lead time from that label to the
  fault; the same for the faults whose truth had a warning phase at all (a
  fault with none gave the facts nothing to warn on); and how many of the
  non-fatal NVLink and NIC episodes got their condition (NvLinkDegraded,
  NicDegraded) into the node's issues while they lasted;
- label flaps per node-day: a straggler or thermal label removed and set
  again within replayer.FLAP_SECONDS with no new episode (truth) on the node
  in between to explain it; and whether maxUnavailable was ever exceeded.

The baseline is the rule of the documents this project started from: per
sample, within each cohort (same model and driver), take step time as
1/score (the operator's own node score) and flag the slowest node when the
coefficient of variation of step time exceeds BASELINE_CV. Its flags are
scored like our labels.
"""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuhealth_operator.decisions import straggler_scores
from gpuhealth_sim.backtest import replayer, traces

STRAGGLER_SLOWDOWN: Final = 0.10
JUDGEABLE_SECONDS: Final = 1800.0
"""The shortest straggler episode a windowed rule must find: the verdict's median over the last 6
reports turns after 4 slow ones (20 minutes at the agent's 300 s heartbeat), then the rule's forSeconds
(300 s in the default policy) runs. The generator draws episodes of 60-360 minutes; shorter ones are
those a trace's end cut. A shorter episode that is found still counts; one missed is reported apart
(`too_short_missed`), not as a miss (issue 47, seed 107)."""
RECOVERY_SLACK: Final = 1200.0
"""The operator uncordons recovery.healthyForSeconds after a repair: actions until then are not false."""
EXPLAINED_SLACK: Final = 600.0
BASELINE_CV: Final = 0.1
DISRUPTIVE: Final = frozenset({"Cordon", "Drain"})
MEMORY_FAULTS: Final = frozenset({"DBE", "RowRemapFailure", "XID48", "XID94", "XID95"})
"""Fatal faults of a GPU's memory (`tracegen.MEMORY_FAULTS`): the ones MemoryDegrading should precede."""
WARNING_CONDITION: Final = "MemoryDegrading"
WARNING_LOOKBACK: Final = 86_400.0
"""How far before a memory fault without a warning phase in the truth a MemoryDegrading label counts."""
WARNED_LABELS: Final = frozenset({"Issues health=degraded", "Issues health=unhealthy"})
"""Issue changes (`Result.issue_changes`) on a node whose health label already says it is not healthy."""
EXPLAINING: Final = ("thermal", "powerBrake", "powerCap")
"""Truth episodes that slow a node for another reason than a straggler's: a straggler label then is
neither right nor wrong (a facility power cap longer than forSeconds slows the node as much)."""
DEGRADED_EPISODES: Final = {"nvlink": "NvLinkDegraded", "nic": "NicDegraded"}
"""Non-fatal truth episodes and the condition that should name them."""
ISOLATE: Final = "Isolate GPU "
"""A replay's action isolating one GPU (`Isolate GPU 3`): acts on a fatal fault of that GPU."""


@dataclasses.dataclass(frozen=True)
class Flag:
    t: float
    node: str


@dataclasses.dataclass
class StragglerScore:
    flags: int
    true_flags: int
    false_flags: int
    episodes: int
    found: int
    explained_flags: int = 0
    """Flags where the truth had the node slowed by something else (thermal, power brake, power cap)."""
    too_short_missed: int = 0
    """Episodes of at least 10 % shorter than `JUDGEABLE_SECONDS` and not found: left out of recall."""

    @property
    def precision(self) -> float | None:
        judged = self.true_flags + self.false_flags
        return self.true_flags / judged if judged else None

    @property
    def recall(self) -> float | None:
        return self.found / self.episodes if self.episodes else None

    def to_json(self) -> dict[str, Any]:
        return {
            "flags": self.flags,
            "trueFlags": self.true_flags,
            "falseFlags": self.false_flags,
            "episodes": self.episodes,
            "found": self.found,
            "explainedFlags": self.explained_flags,
            "tooShortMissed": self.too_short_missed,
            "precision": _round(self.precision),
            "recall": _round(self.recall),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _disruptive(action: replayer.Action) -> bool:
    if action.action in DISRUPTIVE:
        return True
    return action.action == "DryRun" and "cordon" in action.reason


def _out_of_service(actions: list[replayer.Action]) -> dict[str, list[tuple[float, float]]]:
    """Per node, the spans it was cordoned or drained by the policy: from the action to its Uncordon."""
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for action in actions:
        if action.action in DISRUPTIVE:
            since.setdefault(action.node, action.t)
        elif action.action == "Uncordon" and action.node in since:
            spans.setdefault(action.node, []).append((since.pop(action.node), action.t))
    for node, t in since.items():
        spans.setdefault(node, []).append((t, float("inf")))
    return spans


def _already_out(spans: list[tuple[float, float]], fault: Mapping[str, Any]) -> float | None:
    """When a fault on a node already out of service at its start must be acted on again: None when the
    node stays out for the whole fault (nothing is left to do), else the moment it returned."""
    for began, ended in spans:
        if began < fault["start"] <= ended:
            return None if ended >= fault["end"] else ended
    return float(fault["start"])


def score_fatal(truth: list[dict[str, Any]], actions: list[replayer.Action]) -> dict[str, Any]:
    faults = [r for r in truth if r.get("type") == "fatal"]
    per_node: dict[str, list[replayer.Action]] = {}
    isolated: dict[str, list[replayer.Action]] = {}
    for action in actions:
        if _disruptive(action):
            per_node.setdefault(action.node, []).append(action)
        elif action.action.startswith(ISOLATE):
            isolated.setdefault(action.node, []).append(action)
    spans = _out_of_service(actions)
    already_out = 0
    delays: list[float] = []
    missed: list[str] = []
    by_fault: dict[str, dict[str, int]] = {}
    for fault in faults:
        # Isolating the faulty GPU (IsolateGPU on a DRA node) acts on the fault too; it disrupts no node.
        gpu = fault.get("gpu")
        isolations = [
            a
            for a in isolated.get(fault["node"], [])
            if not isinstance(gpu, int) or a.action == f"{ISOLATE}{gpu}"
        ]
        # A node already cordoned or drained when the fault starts (an earlier fault's, another GPU's) has
        # nothing left to do: not a miss, acted on from the fault's first second, while it stays out.
        due = _already_out(spans.get(fault["node"], []), fault)
        hits = [
            a.t
            for a in per_node.get(fault["node"], []) + isolations
            if due is not None and due <= a.t <= fault["end"] and a.t >= fault["start"]
        ]
        counts = by_fault.setdefault(str(fault.get("fault")), {"faults": 0, "acted": 0})
        counts["faults"] += 1
        if due is None:
            delays.append(0.0)
            counts["acted"] += 1
            already_out += 1
        elif hits:
            delays.append(min(hits) - fault["start"])
            counts["acted"] += 1
        else:
            missed.append(f"{fault['node']} {fault.get('fault')} at {fault['start']:.0f}s")
    false_actions = [
        a
        for node, acts in per_node.items()
        for a in acts
        if not any(f["node"] == node and f["start"] <= a.t <= f["end"] + RECOVERY_SLACK for f in faults)
    ]
    return {
        "faults": len(faults),
        "acted": len(delays),
        "byFault": dict(sorted(by_fault.items())),
        "recall": _round(len(delays) / len(faults)) if faults else None,
        "secondsToActionP50": _round(percentile(delays, 0.5)),
        "secondsToActionP99": _round(percentile(delays, 0.99)),
        "missed": missed,
        "alreadyOut": already_out,
        "falseDisruptive": len(false_actions),
        "falseDisruptiveActions": [a.to_json() for a in false_actions[:20]],
    }


def score_early_warnings(
    truth: list[dict[str, Any]],
    actions: list[replayer.Action],
    issue_changes: Iterable[replayer.Action] = (),
) -> dict[str, Any]:
    """MemoryDegrading before fatal memory faults, and the non-fatal NVLink and NIC episodes found
    (module docstring). `issue_changes`: the replay's `Result.issue_changes`; a node already labelled
    degraded gets no Node change when MemoryDegrading joins its issues, yet it is warned then."""
    memory = [r for r in truth if r.get("type") == "fatal" and r.get("fault") in MEMORY_FAULTS]
    phases = {(r["node"], r["end"]): r for r in truth if r.get("type") == "memoryDegrading"}
    warned_at: dict[str, list[float]] = {}
    for action in actions:
        if WARNING_CONDITION in action.reason.split(","):
            warned_at.setdefault(action.node, []).append(action.t)
    for change in issue_changes:
        if change.action in WARNED_LABELS and WARNING_CONDITION in change.reason.split(","):
            warned_at.setdefault(change.node, []).append(change.t)
    leads: list[float] = []
    phased = phased_warned = 0
    for fault in memory:
        phase = phases.get((fault["node"], fault["start"]))
        since = phase["start"] if phase is not None else fault["start"] - WARNING_LOOKBACK
        before = [t for t in warned_at.get(fault["node"], []) if since <= t <= fault["start"]]
        phased += phase is not None
        if before:
            leads.append(fault["start"] - min(before))
            phased_warned += phase is not None
    degraded: dict[str, dict[str, int]] = {}
    for kind, condition in DEGRADED_EPISODES.items():
        episodes = [r for r in truth if r.get("type") == kind]
        found = sum(
            1
            for e in episodes
            if any(
                a.node == e["node"] and condition in a.reason.split(",") and e["start"] <= a.t <= e["end"]
                for a in actions
            )
        )
        degraded[kind] = {"episodes": len(episodes), "found": found}
    return {
        "memoryFaults": len(memory),
        "warned": len(leads),
        "share": _round(len(leads) / len(memory)) if memory else None,
        "withWarningPhase": phased,
        "withWarningPhaseWarned": phased_warned,
        "leadSecondsP50": _round(percentile(leads, 0.5)),
        "degradedEpisodes": degraded,
    }


def score_stragglers(
    truth: list[dict[str, Any]], flags: Iterable[Flag], *, explained_are_wrong: bool = False
) -> StragglerScore:
    """`explained_are_wrong`: a flag where the node was slowed by something else (EXPLAINING) counts as
    wrong, not neither way: for the baseline rule, which has no thermal or power label to say why."""
    episodes = [r for r in truth if r.get("type") == "straggler"]
    explained = [r for r in truth if r.get("type") in EXPLAINING]
    wanted = [e for e in episodes if e.get("slowdown", 0) >= STRAGGLER_SLOWDOWN]
    found: set[int] = set()
    flags = list(flags)
    true_flags = false_flags = explained_flags = 0
    for flag in flags:
        inside = [
            i for i, e in enumerate(episodes) if e["node"] == flag.node and e["start"] <= flag.t <= e["end"]
        ]
        if inside:
            true_flags += 1
            found.update(i for i in inside if episodes[i] in wanted)
        elif any(
            e["node"] == flag.node and e["start"] <= flag.t <= e["end"] + EXPLAINED_SLACK for e in explained
        ):
            explained_flags += 1
            false_flags += explained_are_wrong
        else:
            false_flags += 1
    short = [i for i, e in enumerate(episodes) if e in wanted and e["end"] - e["start"] < JUDGEABLE_SECONDS]
    missed_short = [i for i in short if i not in found]
    return StragglerScore(
        len(flags),
        true_flags,
        false_flags,
        len(wanted) - len(missed_short),
        len(found),
        explained_flags,
        too_short_missed=len(missed_short),
    )


SLOWING: Final = frozenset({"straggler", "thermal", "powerBrake", "powerCap"})


def label_flaps(truth: list[dict[str, Any]], actions: list[replayer.Action]) -> list[replayer.Action]:
    """Label re-sets that no new episode explains (module docstring)."""
    cleared: dict[tuple[str, str], float] = {}
    flaps = []
    for action in actions:
        if action.action.startswith("Unlabel "):
            cleared[(action.node, action.action.removeprefix("Unlabel "))] = action.t
            continue
        if not action.action.startswith("Label ") or action.action.startswith("Label health="):
            continue
        label = action.action.removeprefix("Label ").split("=", 1)[0]
        since = cleared.pop((action.node, label), None)
        if since is None or action.t - since >= replayer.FLAP_SECONDS:
            continue
        explained = any(
            e["node"] == action.node and e.get("type") in SLOWING and since <= e["start"] <= action.t
            for e in truth
        )
        if not explained:
            flaps.append(action)
    return flaps


def our_straggler_flags(actions: list[replayer.Action]) -> list[Flag]:
    return [Flag(a.t, a.node) for a in actions if a.action.startswith("Label straggler")]


def baseline_flags(trace: pathlib.Path) -> list[Flag]:
    """The baseline rule's flags over the trace, one judgement per cohort per sample period."""
    flags: list[Flag] = []
    with traces.open_trace(trace) as (header, records):
        generator = header.get("generator") or {}
        # One round per heartbeat (every node has written once), or per sample if every sample is written.
        period = float(generator.get("heartbeatSeconds") or generator.get("sampleSeconds") or 60.0)
        latest: dict[str, dict[str, Any]] = {}
        last: dict[str, dict[str, Any]] = {}
        boundary = period
        for record in records:
            if record["kind"] != "gpunode":
                continue
            while record["t"] >= boundary:
                flags.extend(_baseline_round(latest, boundary))
                latest = {}
                boundary += period
            name = record["name"]
            if traces.deletion(record):
                last.pop(name, None)  # gone from the fleet (and from its cohort) before this round
                latest.pop(name, None)
                continue
            if "status" in record:
                status = record["status"]
            else:
                status = traces.apply_status_patch(last.get(name, {}), record["patch"])
            last[name] = status
            latest[name] = status
        flags.extend(_baseline_round(latest, boundary))
    return flags


def _baseline_round(latest: Mapping[str, Mapping[str, Any]], t: float) -> list[Flag]:
    cohorts: dict[tuple[str, str], dict[str, float]] = {}
    for name, status in latest.items():
        cohort = straggler_scores.cohort_of(status)  # type: ignore[arg-type]
        score = straggler_scores.node_score(status)  # type: ignore[arg-type]
        if cohort is not None and score is not None and score > 0:
            cohorts.setdefault(cohort, {})[name] = 1 / score
    flags = []
    for steps in cohorts.values():
        if len(steps) < 2:
            continue
        values = list(steps.values())
        mean = statistics.fmean(values)
        if statistics.pstdev(values) / mean > BASELINE_CV:
            flags.append(Flag(t, max(steps, key=lambda n: steps[n])))
    return flags


def score(trace: pathlib.Path, result: replayer.Result, *, baseline: bool = True) -> dict[str, Any]:
    """The whole score of one policy's backtest (module docstring)."""
    _, everything = traces.read_truth(trace)
    truth = [r for r in everything if r.get("node") in result.selected]
    node_days = max(result.selected_node_days, 1e-9)
    flaps = label_flaps(truth, result.actions)
    report: dict[str, Any] = {
        "policy": result.policy,
        "fatal": score_fatal(truth, result.actions),
        "earlyWarnings": score_early_warnings(truth, result.actions, result.issue_changes),
        "stragglers": score_stragglers(truth, our_straggler_flags(result.actions)).to_json(),
        "labelFlapsPerNodeDay": round(len(flaps) / node_days, 4),
        "labelFlaps": [a.to_json() for a in flaps[:20]],
        "maxUnavailableRespected": result.max_cordoned_by_policy <= result.max_unavailable_limit,
    }
    if baseline:
        flags = [f for f in baseline_flags(trace) if f.node in result.selected]
        report["baselineStragglers"] = score_stragglers(truth, flags, explained_are_wrong=True).to_json()
    return report
