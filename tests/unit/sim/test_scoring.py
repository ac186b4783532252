"""The scorer on hand-made truths and actions: recall, delays, false actions, straggler precision."""

import datetime
import pathlib

from gpuhealth_sim.backtest import replayer, scoring, traces
from gpunode_facts import agent_status

A = replayer.Action


def fatal(node: str, start: float, end: float) -> dict:
    return {"kind": "truth", "type": "fatal", "node": node, "start": start, "end": end, "fault": "DBE"}


def straggler(node: str, start: float, end: float, slowdown: float) -> dict:
    return {
        "kind": "truth",
        "type": "straggler",
        "node": node,
        "start": start,
        "end": end,
        "slowdown": slowdown,
    }


def test_fatal_recall_delay_and_false_actions() -> None:
    truth = [fatal("a", 100, 1000), fatal("b", 200, 900), fatal("c", 300, 800)]
    actions = [
        A(130, "a", "Drain", "EccUncorrectable"),
        A(260, "b", "Cordon", "EccUncorrectable"),
        A(500, "d", "Drain", "GPULost"),  # no fault on d: a false disruptive action
        A(600, "c", "Label straggler=true", ""),  # not disruptive: c's fault is missed
    ]
    got = scoring.score_fatal(truth, actions)
    assert (got["faults"], got["acted"], got["falseDisruptive"]) == (3, 2, 1)
    assert got["recall"] == round(2 / 3, 4)
    assert got["secondsToActionP50"] == 30 and got["secondsToActionP99"] == 60
    assert got["missed"] == ["c DBE at 300s"]


def test_a_dry_run_that_would_drain_counts_as_acting() -> None:
    got = scoring.score_fatal([fatal("a", 0, 100)], [A(5, "a", "DryRun", "would cordon and drain")])
    assert got["recall"] == 1.0


def test_straggler_precision_and_recall_per_episode() -> None:
    truth = [
        straggler("s1", 0, 3600, 0.2),
        straggler("s2", 0, 3600, 0.15),  # never flagged: recall 1/2
        straggler("s3", 0, 3600, 0.06),  # below 10 %: not counted in recall, a flag on it is right
        {"kind": "truth", "type": "thermal", "node": "h", "start": 0, "end": 100},
    ]
    flags = [
        scoring.Flag(400, "s1"),
        scoring.Flag(500, "s3"),
        scoring.Flag(300, "h"),  # during a thermal episode (+ slack): explained, neither right nor wrong
        scoring.Flag(50, "x"),  # a healthy node: wrong
    ]
    got = scoring.score_stragglers(truth, flags)
    assert (got.episodes, got.found, got.true_flags, got.false_flags) == (2, 1, 2, 1)
    assert got.precision == 2 / 3 and got.recall == 0.5


def test_baseline_flags_the_slowest_node_when_step_times_vary(tmp_path: pathlib.Path) -> None:
    def status(clock: int) -> dict:
        gpu = {"index": 0, "model": "M", "smClockMHz": clock, "maxSmClockMHz": 2000, "utilizationPercent": 90}
        return {"agent": {"driverVersion": "1"}, "summary": {"model": "M"}, "gpus": [gpu]}

    path = tmp_path / "t.jsonl"
    with traces.Writer(path, {"start": 0, "generator": {"sampleSeconds": 60}}) as writer:
        for t, clocks in ((10, (2000, 2000, 2000, 1980)), (70, (2000, 2000, 2000, 1300))):
            for i, clock in enumerate(clocks):
                writer.write({"kind": "gpunode", "t": t + i, "name": f"n{i}", "status": status(clock)})
    assert scoring.baseline_flags(path) == [scoring.Flag(120, "n3")], "only the sample with CV > 0.1"


def test_a_label_set_again_is_a_flap_unless_a_new_episode_explains_it() -> None:
    truth = [
        {"type": "thermal", "node": "a", "start": 0, "end": 300},
        {"type": "thermal", "node": "a", "start": 2000, "end": 2300},
    ]
    actions = [
        A(60, "a", "Label thermal-throttled=true", ""),
        A(900, "a", "Unlabel thermal-throttled", ""),
        A(2060, "a", "Label thermal-throttled=true", ""),  # a new episode: not a flap
        A(2900, "a", "Unlabel thermal-throttled", ""),
        A(3000, "a", "Label thermal-throttled=true", ""),  # nothing new: a flap
        A(3100, "b", "Label straggler=true", ""),  # first set: not a flap
    ]
    assert [a.t for a in scoring.label_flaps(truth, actions)] == [3000]


# --- issue 47 item 4: the scorer tells the truth --------------------------------------------------------


def test_a_fault_on_a_node_already_drained_is_not_a_miss() -> None:
    """The node is out of service when its second fault starts: nothing is left to do, nothing missed."""
    truth = [fatal("a", 100, 1000), {**fatal("a", 500, 900), "fault": "XID79"}]
    got = scoring.score_fatal(truth, [A(130, "a", "Drain", "EccUncorrectable")])
    assert (got["faults"], got["acted"], got["missed"]) == (2, 2, [])
    assert got["alreadyOut"] == 1
    assert got["secondsToActionP50"] == 0  # the second fault: out of service from its first second


def test_a_fault_on_a_node_returned_to_service_before_it_ended_needs_an_action_of_its_own() -> None:
    truth = [fatal("a", 100, 400), {**fatal("a", 300, 900), "fault": "XID79"}]
    actions = [A(130, "a", "Drain", "EccUncorrectable"), A(600, "a", "Uncordon", "")]
    got = scoring.score_fatal(truth, actions)
    assert got["missed"] == ["a XID79 at 300s"]
    again = scoring.score_fatal(truth, [*actions, A(620, "a", "Drain", "XidCritical")])
    assert again["missed"] == [] and again["acted"] == 2


def test_straggler_labels_during_a_power_cap_are_not_false() -> None:
    """A facility power cap longer than forSeconds slows the node for real: as thermal, neither way."""
    truth = [{"kind": "truth", "type": "powerCap", "node": "p", "start": 0, "end": 3600, "factor": 0.8}]
    got = scoring.score_stragglers(truth, [scoring.Flag(400, "p"), scoring.Flag(3700, "p")])
    assert (got.true_flags, got.false_flags, got.explained_flags) == (0, 0, 2)


def memory_fault(node: str, start: float) -> list[dict]:
    phase = {"type": "memoryDegrading", "node": node, "start": start - 3600, "end": start, "fault": "DBE"}
    return [phase, {**fatal(node, start, start + 7200), "fault": "DBE"}]


def test_early_warning_counts_a_node_already_labelled_degraded() -> None:
    """The node carried `health=degraded` (a NIC) before its memory degraded: no Node change, yet it was
    warned as soon as its issues named MemoryDegrading."""
    truth = memory_fault("m", 10_000)
    actions = [A(1000, "m", "Label health=degraded", "NicDegraded")]
    issues = [A(7000, "m", "Issues health=degraded", "NicDegraded,MemoryDegrading")]
    assert scoring.score_early_warnings(truth, actions)["warned"] == 0  # the Node did not change
    got = scoring.score_early_warnings(truth, actions, issues)
    assert (got["warned"], got["withWarningPhaseWarned"], got["leadSecondsP50"]) == (1, 1, 3000)


def test_issues_on_a_node_without_the_degraded_label_are_no_warning() -> None:
    truth = memory_fault("m", 10_000)
    issues = [A(7000, "m", "Issues health=healthy", "MemoryDegrading")]  # e.g. a dry-run or excluded node
    assert scoring.score_early_warnings(truth, [], issues)["warned"] == 0


def test_the_baseline_rule_gets_a_precision_even_when_its_flags_fall_in_slowed_episodes() -> None:
    """The baseline has no thermal or power label of its own: its flag on a throttled node is a wrong
    straggler flag (a human would look for a slow node that is merely hot), never "n/a"."""
    truth = [
        {"kind": "truth", "type": "thermal", "node": "h", "start": 0, "end": 1000},
        straggler("s", 0, 1000, 0.2),
    ]
    flags = [scoring.Flag(100, "h"), scoring.Flag(200, "h"), scoring.Flag(300, "s")]
    ours = scoring.score_stragglers(truth, flags)
    assert ours.precision == 1.0 and ours.explained_flags == 2
    base = scoring.score_stragglers(truth, flags, explained_are_wrong=True)
    assert (base.true_flags, base.false_flags, base.explained_flags) == (1, 2, 2)
    assert base.precision == 1 / 3
    only_hot = scoring.score_stragglers(truth, flags[:2], explained_are_wrong=True)
    assert only_hot.precision == 0.0
    assert only_hot.to_json()["explainedFlags"] == 2


def test_a_replay_warns_a_node_already_degraded_when_memory_degrading_joins(tmp_path: pathlib.Path) -> None:
    """End to end (the replay records issue changes): n0 is thermally throttled (labelled degraded) from
    minute 1; a single-bit page retirement pending from minute 5 adds MemoryDegrading without a Node
    change; a DBE at minute 9."""
    start = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)

    def stamp(t: float) -> str:
        return (start + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%SZ")

    path = tmp_path / "t.jsonl"
    policy = pathlib.Path(__file__).parents[3] / "examples" / "default-policy.yaml"
    with traces.Writer(path, {"start": start.timestamp()}) as writer:
        writer.write({"kind": "truth", "type": "memoryDegrading", "node": "n0", "start": 300, "end": 540})
        writer.write({**fatal("n0", 540, 900), "kind": "truth"})
        for i in range(5):
            body = {
                "metadata": {"name": f"n{i}", "labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {"unschedulable": False},
                "status": {"capacity": {"nvidia.com/gpu": "8"}},
            }
            writer.write({"kind": "node", "t": 0, "object": body})
        for minute in range(15):
            for i in range(5):
                t = minute * 60 + i
                gpu0: dict = {}
                if i == 0 and minute >= 1:
                    gpu0["clockEventReasons"] = ["HwThermalSlowdown"]
                if i == 0 and minute >= 5:
                    gpu0["retiredPages"] = {"doubleBit": 0, "pending": True}
                if i == 0 and minute >= 9:
                    gpu0["ecc"] = {"uncorrectedVolatile": 1}
                status = agent_status(heartbeat=stamp(t), observed=stamp(0), overrides={0: gpu0})
                writer.write({"kind": "gpunode", "t": t, "name": f"n{i}", "status": status})
    result = replayer.run(path, replayer.load_policy(policy), 30.0)
    changes = [c for c in result.issue_changes if c.node == "n0" and "MemoryDegrading" in c.reason]
    assert changes and changes[0].action == "Issues health=degraded"
    node_changes = [a.t for a in result.actions if a.node == "n0" and "MemoryDegrading" in a.reason]
    assert changes[0].t == 300 and min(node_changes) > 300  # no Node change when it joined
    warned = scoring.score(path, result, baseline=False)["earlyWarnings"]
    assert warned["warned"] == 1 and warned["withWarningPhaseWarned"] == 1
    assert warned["leadSecondsP50"] == 240  # from the issues, not from the next Node change


def test_a_straggler_episode_too_short_to_judge_is_not_a_miss() -> None:
    """Seed 107 (issue 47): an episode the trace's end cut to 11 minutes had 2 reports, fewer than the
    verdict's median window and the rule's forSeconds need; no windowed rule can label it, so missing it
    is not a miss. Found, it still counts; missed, it is reported apart."""
    truth = [
        straggler("long", 0, 3600, 0.2),
        straggler("cut", 10_000, 10_000 + 660, 0.15),  # never flagged, too short to judge
        straggler("quick", 20_000, 20_000 + 900, 0.2),  # short but flagged: found
    ]
    got = scoring.score_stragglers(truth, [scoring.Flag(900, "long"), scoring.Flag(20_500, "quick")])
    assert (got.episodes, got.found, got.recall) == (2, 2, 1.0)
    assert got.too_short_missed == 1
    assert got.to_json()["tooShortMissed"] == 1
