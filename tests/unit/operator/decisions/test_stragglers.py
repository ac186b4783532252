"""Stragglers: robust z-scores within (model, driver) cohorts; idle, stale and lost nodes are not judged."""

import random
import statistics
from typing import Any

import pytest

from gpuhealth_operator.decisions import straggler_scores, straggler_stats

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def node(
    clock: float = 1980,
    *,
    gpus: int = 8,
    slow_gpu_clock: float | None = None,
    utilization: int = 95,
    model: str = H100,
    driver: str = "570.124.06",
    heartbeat: str = "2026-11-22T00:59:30Z",
    reasons: list[str] | None = None,
    lost: bool = False,
    expected: int | None = None,
) -> Any:
    gpu_list = []
    for i in range(gpus):
        gpu: dict[str, Any] = {
            "index": i,
            "model": model,
            "smClockMHz": slow_gpu_clock if (i == 0 and slow_gpu_clock is not None) else clock,
            "maxSmClockMHz": 1980,
            "utilizationPercent": utilization,
        }
        if i == 0 and reasons is not None:
            gpu["clockEventReasons"] = reasons
        if i == 0 and lost:
            gpu["lost"] = True
        gpu_list.append(gpu)
    agent: dict[str, Any] = {"lastHeartbeatTime": heartbeat, "heartbeatSeconds": 60, "driverVersion": driver}
    if expected is not None:
        agent["expectedGpuCount"] = expected
    return {"agent": agent, "summary": {"model": model, "gpuCount": gpus}, "gpus": gpu_list}


def score(members: dict[str, Any]) -> dict[str, Any]:
    """The timer's judgement of fresh nodes' facts (`reconciler.score_stragglers` leaves out stale ones)."""
    return straggler_stats.judge_nodes(
        {name: straggler_scores.performance_of(f) for name, f in members.items()}, 3.5
    )


def flagged(scores: dict[str, Any]) -> set[str]:
    return {name for name, s in scores.items() if s.flagged}


def test_one_slow_node_among_eight_is_flagged_and_only_it() -> None:
    members = {f"n{i}": node(1980 - 5 * i) for i in range(7)}
    members["slow"] = node(slow_gpu_clock=1400)
    scores = score(members)
    assert flagged(scores) == {"slow"}
    assert set(scores) == set(members)
    assert scores["slow"].peers == 7
    assert scores["slow"].z_score < -3.5
    assert scores["slow"].score == pytest.approx(1400 / 1980, abs=1e-3)


def test_throttle_share_lowers_the_score_even_at_full_clock() -> None:
    members = {f"n{i}": node() for i in range(7)}
    members["throttled"] = node(reasons=["HwThermalSlowdown"])
    members["capped"] = node(reasons=["SwPowerCap"])  # normal under full load
    scores = score(members)
    assert scores["throttled"].score == pytest.approx(7 / 8)
    assert scores["capped"].score == 1.0
    assert flagged(scores) == {"throttled"}


def test_idle_node_gets_no_score_and_is_never_a_straggler() -> None:
    members = {f"n{i}": node() for i in range(7)}
    members["idle"] = node(clock=210, utilization=0)
    scores = score(members)
    assert "idle" not in scores
    assert flagged(scores) == set()
    assert scores["n0"].peers == 6


@pytest.mark.parametrize("peers", [0, 1])
def test_fewer_than_two_peers_never_flags(peers: int) -> None:
    """One peer cannot tell which of two nodes is the slow one (issue 47: the small-cohort fallback)."""
    members = {f"n{i}": node() for i in range(peers)}
    members["slow"] = node(clock=500)
    scores = score(members)
    assert scores["slow"].peers == peers
    assert not scores["slow"].flagged


@pytest.mark.parametrize("peers", [2, 3])
def test_a_small_cohort_flags_a_node_below_every_peer(peers: int) -> None:
    """Issue 47: a 5-node cohort with one or two peers idle kept 2-3 busy peers, and two real stragglers
    (22 % and 25 % slow, for hours) were never judged. With 2-3 peers a node is judged against the slowest
    of them (the median of so few says little): flagged only when below every one by the flag margin."""
    members = {f"n{i}": node(clock=1980 - 10 * i) for i in range(peers)}
    members["slow"] = node(clock=round(1980 / 1.22))
    members["idle"] = node(utilization=0)
    scores = score(members)
    assert scores["slow"].peers == peers
    assert flagged(scores) == {"slow"}


def test_a_small_cohort_flags_nobody_when_no_node_is_below_every_peer() -> None:
    """Two slow nodes among four: each has the other as its slowest peer, so neither is told apart."""
    members = {"a": node(), "b": node(), "slow1": node(clock=1500), "slow2": node(clock=1510)}
    assert flagged(score(members)) == set()
    members = {"a": node(), "b": node(clock=1960), "c": node(clock=1900)}  # within the margin
    assert flagged(score(members)) == set()


def test_four_peers_are_enough() -> None:
    members = {f"n{i}": node() for i in range(4)}
    members["slow"] = node(clock=1500)
    assert flagged(score(members)) == {"slow"}


def test_uniform_cohort_with_tiny_noise_flags_nobody() -> None:
    noise = [0, -3, 4, -8, 2, 9, -5, 1, -10, 6, -2, 3]  # within ±0.5 % of 1980 MHz
    members = {f"n{i}": node(1970 + n) for i, n in enumerate(noise)}
    scores = score(members)
    assert flagged(scores) == set()
    assert max(abs(s.z_score) for s in scores.values()) < 1


def test_perfectly_uniform_cohort_has_zero_z() -> None:
    scores = score({f"n{i}": node() for i in range(6)})
    assert {s.z_score for s in scores.values()} == {0.0}


def test_mixed_models_and_drivers_are_separate_cohorts() -> None:
    members = {f"h{i}": node(1980, model=H100) for i in range(5)}
    # A100s run at their own (lower) ratio; compared with H100s they would all look slow.
    members |= {f"a{i}": node(1400, model=A100) for i in range(5)}
    members |= {f"d{i}": node(1500, driver="535.0") for i in range(3)}
    scores = score(members)
    assert flagged(scores) == set()
    assert scores["h0"].peers == 4
    assert scores["a0"].peers == 4
    assert scores["d0"].peers == 2


@pytest.mark.parametrize(
    "excluded",
    [
        node(clock=500, lost=True),
        node(clock=500, gpus=7, expected=8),
        {"agent": {"lastHeartbeatTime": "2026-11-22T00:59:30Z"}},  # no GPUs reported
        node(clock=500, model=""),
    ],
)
def test_lost_and_unreported_nodes_are_left_out(excluded: Any) -> None:
    # A stale agent's node is left out by the timer (test_liveness: through `reconciler.score_stragglers`).
    members = {f"n{i}": node() for i in range(5)}
    members["x"] = excluded
    scores = score(members)
    assert "x" not in scores
    assert scores["n0"].peers == 4


def test_garbage_gpu_fields_do_not_score() -> None:
    facts = node()
    for gpu in facts["gpus"]:
        gpu["smClockMHz"] = "fast"
    facts["gpus"].append("junk")
    assert straggler_scores.node_score(facts) is None


def test_node_score_uses_worst_busy_gpu() -> None:
    facts = node(slow_gpu_clock=990)
    facts["gpus"][1]["utilizationPercent"] = 0  # an idle GPU is not judged
    facts["gpus"][1]["smClockMHz"] = 100
    assert straggler_scores.node_score(facts) == pytest.approx(0.5)


def test_a_reports_score_is_its_window_of_one_to_the_bit() -> None:
    """`score_of` (a report's score, once per report) is `_score` of a window of that report alone, the
    same float: replays of recorded fleets must decide exactly as before."""
    rng = random.Random(29)
    for _ in range(2_000):
        width = rng.randint(1, 8)
        ratios = tuple(rng.choice([None, rng.random(), 1.0, 0.5 + rng.random() / 3]) for _ in range(width))
        busy = [i for i, r in enumerate(ratios) if r is not None]
        if not busy:
            continue
        throttled = tuple(i for i in busy if rng.random() < 0.3)
        clocks = (ratios, len(throttled) / len(busy), throttled)
        assert straggler_scores.score_of(clocks) == straggler_scores.window_score((clocks,))
    assert straggler_scores.score_of(None) is None


def _reference_score(window: Any) -> float | None:
    """`_score` as first written (statistics.median per GPU): the definition the fast one must equal."""
    medians = []
    for position in range(max(len(ratios) for ratios, _, _ in window)):
        seen = [
            (r, position in throttled)
            for ratios, _, throttled in window
            if position < len(ratios) and (r := ratios[position]) is not None
        ]
        clear = [r for r, hot in seen if not hot]
        if seen:
            medians.append(statistics.median(clear or [r for r, _ in seen]))
    if not medians:
        return None
    return min(medians) * (1 - statistics.median(share for _, share, _ in window))


def test_a_windows_score_is_the_median_definition_to_the_bit() -> None:
    """Random windows of one to nine reports (GPUs busy or not, some throttled, a GPU lost from a report):
    `_score` gives the very float of the definition, so replays decide exactly as before."""
    rng = random.Random(2029)
    for _ in range(3_000):
        width = rng.choice([8, 8, 8, 4, 1])
        window = []
        for _ in range(rng.randint(1, 9)):
            ratios = tuple(
                None if rng.random() < 0.15 else rng.choice([1.0, rng.random(), 0.9 + rng.random() / 10])
                for _ in range(width - (rng.random() < 0.1))
            )
            busy = [i for i, r in enumerate(ratios) if r is not None] or [0]
            throttled = tuple(i for i in busy if rng.random() < 0.1)
            window.append((ratios, len(throttled) / len(busy), throttled))
        assert straggler_scores.window_score(window) == _reference_score(window)
