"""Healthy baselines: every node a little different, reproducibly, and never straggler-like."""

import statistics

from gpuhealth_agent import scenario as agent_scenario
from gpuhealth_sim.fleet import baselines, fleetfile

H100 = "NVIDIA H100 80GB HBM3"
SCENARIO = {
    "gpus": 8,
    "model": H100,
    "defaults": {
        "temperatureCelsius": 45,
        "powerWatts": 450.0,
        "smClockMHz": 1980,
        "maxSmClockMHz": 1980,
        "utilizationPercent": 95,
    },
    "timeline": [{"after": "5s", "gpu": 1, "set": {"temperatureCelsius": 92}}],
}
SPREAD = fleetfile.Spread()


def fleet_of(count: int, seed: int = 1) -> list[dict]:
    return [
        baselines.apply(SCENARIO, SPREAD, baselines.node_rng(seed, f"gpu-node-{i}")) for i in range(count)
    ]


def gpu_values(scenario: dict, field: str) -> list[float]:
    return [e["set"][field] for e in scenario["timeline"] if e["after"] == "0s"]


def robust_z(values: list[float]) -> list[float]:
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return [0.6745 * (v - median) / mad for v in values]


def test_the_same_seed_and_name_give_the_same_baseline_whatever_the_order() -> None:
    assert fleet_of(20) == fleet_of(20)
    again = baselines.apply(SCENARIO, SPREAD, baselines.node_rng(1, "gpu-node-7"))
    assert again == fleet_of(20)[7]
    assert fleet_of(5, seed=2) != fleet_of(5, seed=1)


def test_nodes_spread_realistically_around_the_scenario_values() -> None:
    nodes = fleet_of(300)
    temperatures = [statistics.mean(gpu_values(n, "temperatureCelsius")) for n in nodes]
    powers = [statistics.mean(gpu_values(n, "powerWatts")) for n in nodes]
    clocks = [n["defaults"]["smClockMHz"] for n in nodes]
    assert 1.5 < statistics.stdev(temperatures) < 3.5
    assert abs(statistics.mean(temperatures) - 45) < 1
    assert 5 < statistics.stdev(powers) < 15
    assert 4 < statistics.stdev(clocks) < 12
    assert len(set(clocks)) > 10, "clocks must not pile up on one value (a MAD of zero)"
    assert max(clocks) <= 1980


def test_no_healthy_node_is_far_enough_out_to_look_like_a_straggler() -> None:
    clocks = [n["defaults"]["smClockMHz"] for n in fleet_of(1000)]
    assert min(robust_z(clocks)) > -3.5


def test_gpus_of_one_node_differ_less_than_nodes_do() -> None:
    nodes = fleet_of(100)
    within = statistics.mean(statistics.stdev(gpu_values(n, "temperatureCelsius")) for n in nodes)
    across = statistics.stdev(statistics.mean(gpu_values(n, "temperatureCelsius")) for n in nodes)
    assert 0 < within < across


def test_the_scenario_timeline_still_wins_after_the_baseline() -> None:
    (node,) = fleet_of(1)
    assert node["timeline"][-1] == SCENARIO["timeline"][0]
    assert [e["gpu"] for e in node["timeline"][:8]] == list(range(8))
    assert SCENARIO["timeline"] == [{"after": "5s", "gpu": 1, "set": {"temperatureCelsius": 92}}], (
        "input mutated"
    )


def test_a_slow_scenario_clock_stays_slow() -> None:
    slow = {**SCENARIO, "defaults": {**SCENARIO["defaults"], "smClockMHz": 1300}}
    clock = baselines.apply(slow, SPREAD, baselines.node_rng(1, "n"))["defaults"]["smClockMHz"]
    assert abs(clock - 1300) <= 2 * SPREAD.sm_clock_mhz


def test_zero_spread_leaves_the_scenario_alone() -> None:
    flat = baselines.apply(SCENARIO, fleetfile.Spread(0, 0, 0), baselines.node_rng(1, "n"))
    assert flat == SCENARIO


def test_the_baselined_scenario_is_valid_for_the_agent() -> None:
    (node,) = fleet_of(1)
    plan = agent_scenario.from_data(node, "test")
    assert plan.gpus == 8 and plan.defaults["smClockMHz"] <= 1980


def test_drawing_onto_a_parsed_scenario_matches_the_mapping_path() -> None:
    parsed = agent_scenario.from_data(SCENARIO, "test")
    fast = baselines.apply_to(parsed, SPREAD, baselines.node_rng(1, "n"))
    slow = agent_scenario.from_data(baselines.apply(SCENARIO, SPREAD, baselines.node_rng(1, "n")), "test")
    assert fast.defaults == slow.defaults
    assert [(e.after_seconds, e.gpu, dict(e.set)) for e in fast.timeline] == [
        (e.after_seconds, e.gpu, dict(e.set)) for e in slow.timeline
    ]
