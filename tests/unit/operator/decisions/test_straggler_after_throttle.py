"""Stragglers after a thermal episode, and in small cohorts (issue 47 item 3).

16-20 minutes after a thermal episode ended, the 6-heartbeat clock window still held the throttled
reports: their throttle share's median kept the node's score low, and a node at full clock was labelled
Straggler (the one false label on the independent trace and on the project's seed 1). Once a report
shows the episode over, its reports leave the window and their z-scores the node's evidence.
"""

import datetime
from typing import Any

from gpuhealth_operator.decisions import model, straggler_scores, stragglers

T0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
PERIOD = 300.0
H100 = "NVIDIA H100 80GB HBM3"


def report(throttled: bool) -> Any:
    """Eight busy GPUs at 97.5 % of max clock; two at their slowdown temperature while `throttled`."""
    gpus = []
    for i in range(8):
        gpu: dict[str, Any] = {"index": i, "model": H100, "maxSmClockMHz": 2000, "utilizationPercent": 95}
        hot = throttled and i < 2
        gpu["smClockMHz"] = 1650 if hot else 1950
        gpu["clockEventReasons"] = ["SwThermalSlowdown"] if hot else []
        gpus.append(gpu)
    return {"agent": {"driverVersion": "570"}, "summary": {"model": H100, "gpuCount": 8}, "gpus": gpus}


def feed(samples: stragglers.Samples, reports: list[bool]) -> straggler_scores.Performance:
    """The node's reports one heartbeat apart (True: throttled); its smoothed performance after the last,
    with a z-score recorded for each (a throttled report's low, as the cohort judged it then)."""
    performance: straggler_scores.Performance = (None, None)
    for i, throttled in enumerate(reports):
        at = T0 + datetime.timedelta(seconds=i * PERIOD)
        facts = report(throttled)
        clocks = straggler_scores.clocks_of(facts)
        performance = stragglers.smoothed(
            samples, straggler_scores.performance_with(facts, clocks), clocks, at, at, PERIOD
        )
        samples.append((at, -6.0 if throttled else 0.0))
    return performance


def test_a_thermal_episode_that_ended_leaves_the_score_at_once() -> None:
    samples = stragglers.Samples()
    _, during = feed(samples, [False, True, True, True])
    assert during is not None and during < 0.8  # throttled: the share counts (the burst costs throughput)
    samples = stragglers.Samples()
    _, after = feed(samples, [False, True, True, True, False])
    assert after == 0.975, "the first report after the episode: its throttled reports are out of the window"
    assert all(z == 0.0 for _, z in samples), "nor do their z-scores stay the node's evidence"


def test_a_node_throttled_on_every_report_keeps_its_window() -> None:
    samples = stragglers.Samples()
    _, score = feed(samples, [True, True, True])
    assert score is not None and score < 0.8
    assert len(samples.clocks) == 3


def test_a_flagged_node_whose_episode_ended_is_cleared_not_held_by_old_evidence() -> None:
    samples = stragglers.Samples()
    feed(samples, [True, True, True, True, False])
    now = T0 + datetime.timedelta(seconds=4 * PERIOD)
    judged = model.StragglerScore(score=0.975, z_score=0.0, peers=10, flagged=False)
    out = stragglers.windowed(
        samples, judged, now, now, 300.0, PERIOD, 3.5, was_flagged=True, flagged_since=T0
    )
    assert not out.flagged
