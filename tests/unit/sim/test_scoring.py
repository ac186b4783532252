"""The scorer on hand-made truths and actions: recall, delays, false actions, straggler precision."""

import pathlib

from gpuhealth_sim.backtest import replayer, scoring, traces

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
        straggler("s1", 0, 1000, 0.2),
        straggler("s2", 0, 1000, 0.15),  # never flagged: recall 1/2
        straggler("s3", 0, 1000, 0.06),  # below 10 %: not counted in recall, a flag on it is right
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
