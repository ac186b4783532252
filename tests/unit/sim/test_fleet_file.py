"""Fleet files: names, pools, scenarios and overrides, and the errors a bad file gets."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_sim import cli
from gpuhealth_sim.demo import walkthrough
from gpuhealth_sim.fleet import fleetfile, names

H100 = "NVIDIA H100 80GB HBM3"
HEALTHY = {"gpus": 8, "model": H100, "defaults": {"temperatureCelsius": 45, "utilizationPercent": 95}}
ECC = {**HEALTHY, "timeline": [{"after": "5s", "gpu": 3, "set": {"eccUncorrectedVolatile": 1}}]}


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def problems(data: Any, tmp_path: Path) -> list[str]:
    with pytest.raises(fleetfile.FleetError) as caught:
        fleetfile.parse(data, source="fleet.yaml", base_dir=tmp_path)
    assert str(caught.value).startswith("fleet.yaml: invalid fleet file")
    return caught.value.problems


# --- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu-node-{0..2}", ["gpu-node-0", "gpu-node-1", "gpu-node-2"]),
        ("n{08..10}", ["n08", "n09", "n10"]),
        ("r{1..2}-{a,b}", ["r1-a", "r1-b", "r2-a", "r2-b"]),
        ("plain", ["plain"]),
    ],
)
def test_brace_patterns_expand_like_the_shell(pattern: str, expected: list[str]) -> None:
    assert names.expand(pattern) == expected


@pytest.mark.parametrize("pattern", ["n{3..1}", "n{0..", "n{x}", "n{0..99999999}"])
def test_bad_patterns_say_why(pattern: str) -> None:
    with pytest.raises(names.PatternError):
        names.expand(pattern)


def test_select_takes_braces_and_globs_among_existing_names() -> None:
    fleet = ["gpu-0", "gpu-1", "gpu-10", "cpu-0"]
    assert names.select("gpu-{0..1}", fleet) == ["gpu-0", "gpu-1"]
    assert names.select("gpu-1*", fleet) == ["gpu-1", "gpu-10"]
    assert names.select("tpu-*", fleet) == []


# --- a good fleet ------------------------------------------------------------------------------------


def test_pools_overrides_and_defaults_resolve_to_one_plan_per_node(tmp_path: Path) -> None:
    write(tmp_path, "healthy.yaml", HEALTHY)
    write(tmp_path, "ecc.yaml", ECC)
    fleet = fleetfile.parse(
        {
            "seed": 7,
            "agent": {"intervalSeconds": 2, "heartbeatSeconds": 30},
            "labels": {"team": "ml"},
            "pools": [
                {
                    "name": "h100",
                    "nodes": "gpu-node-{0..3}",
                    "scenario": "healthy.yaml",
                    "resources": {"cpu": 96},
                    "labels": {"zone": "a"},
                },
                {"name": "a100", "count": 2, "gpu": {"model": "NVIDIA A100-SXM4-80GB", "count": 4}},
            ],
            "overrides": [
                {"nodes": "gpu-node-2", "scenario": "ecc.yaml", "labels": {"zone": "b"}},
                {"nodes": "a100-*", "scenario": {"defaults": {"temperatureCelsius": 60}}},
            ],
        },
        source="fleet.yaml",
        base_dir=tmp_path,
    )
    assert [n.name for n in fleet.nodes] == [
        "gpu-node-0",
        "gpu-node-1",
        "gpu-node-2",
        "gpu-node-3",
        "a100-0",
        "a100-1",
    ]
    assert (fleet.seed, fleet.interval_seconds, fleet.heartbeat_seconds) == (7, 2.0, 30.0)
    ecc = fleet.node("gpu-node-2")
    assert ecc.scenario["timeline"] == ECC["timeline"]
    assert ecc.scenario_source == str(tmp_path / "ecc.yaml")
    assert ecc.labels == {"team": "ml", "zone": "b"}
    assert ecc.resources["cpu"] == "96" and ecc.resources["memory"] == fleetfile.DEFAULT_RESOURCES["memory"]
    assert fleet.node("gpu-node-0").scenario.get("timeline") is None
    a100 = fleet.node("a100-1")
    # The pool's hardware replaces whatever the scenario says.
    assert (a100.gpu_model, a100.gpu_count) == ("NVIDIA A100-SXM4-80GB", 4)
    assert (a100.scenario["model"], a100.scenario["gpus"]) == ("NVIDIA A100-SXM4-80GB", 4)
    assert a100.scenario_source == "inline (overrides[1].scenario)"


def test_a_pool_without_scenario_runs_a_builtin_healthy_one(tmp_path: Path) -> None:
    fleet = fleetfile.parse({"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}}]}, base_dir=tmp_path)
    (plan,) = fleet.nodes
    assert plan.name == "pool-0-0"
    assert plan.scenario["defaults"]["utilizationPercent"] > 50
    assert (fleet.interval_seconds, fleet.heartbeat_seconds) == (5.0, 300.0)


def test_the_example_fleets_load() -> None:
    root = Path(__file__).resolve().parents[3] / "examples" / "fleets"
    files = [p for p in sorted(root.glob("*.yaml")) if "kind" not in yaml.safe_load(p.read_text())]
    assert files, "examples/fleets/ has no fleet files"
    for path in files:
        assert fleetfile.load(path).nodes


# --- bad fleets --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, "it needs at least `pools`"),
        ({"pools": []}, "pools: expected a non-empty list"),
        ({"pools": [{"count": 2}], "speed": 1}, "speed: unknown field"),
        (
            {"pools": [{"count": 0, "gpu": {"model": H100, "count": 8}}]},
            "pools[0].count: expected an integer >= 1",
        ),
        ({"pools": [{"gpu": {"model": H100, "count": 8}}]}, "give exactly one of nodes"),
        ({"pools": [{"nodes": "n{3..1}", "gpu": {"model": H100, "count": 8}}]}, "runs backwards"),
        ({"pools": [{"nodes": "GPU_Node", "gpu": {"model": H100, "count": 8}}]}, "is not a valid Node name"),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": "eight"}}]},
            "pools[0].gpu.count: expected an integer",
        ),
        ({"pools": [{"count": 1}]}, "pools[0].gpu.model: missing"),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "scenario": "nope.yaml"}]},
            "cannot read",
        ),
        ({"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "scenario": 3}]}, "expected a scenario"),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "labels": {"a": "x y"}}]},
            "pools[0].labels.a: label value",
        ),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "resources": {"cpu": "lots"}}]},
            "is not a Kubernetes quantity",
        ),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "resources": {"nvidia.com/gpu": 8}}]},
            "set the GPU count with gpu.count",
        ),
        (
            {"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "baseline": {"powerWatts": -1}}]},
            "pools[0].baseline.powerWatts: expected a number >= 0",
        ),
        (
            {
                "agent": {"intervalSeconds": 10, "heartbeatSeconds": 5},
                "pools": [{"count": 1, "gpu": {"model": H100}}],
            },
            "agent.heartbeatSeconds: must be at least intervalSeconds",
        ),
        (
            {
                "agent": {"heartbeatSeconds": 601},
                "pools": [{"count": 1, "gpu": {"model": H100}}],
            },
            "agent.heartbeatSeconds: must be at most 600",
        ),
        (
            {
                "pools": [
                    {"nodes": "n{0..1}", "gpu": {"model": H100, "count": 8}},
                    {"nodes": "n1", "gpu": {"model": H100, "count": 8}},
                ]
            },
            "n1 is already in pool",
        ),
        (
            {
                "pools": [{"nodes": "n{0..1}", "gpu": {"model": H100, "count": 8}}],
                "overrides": [{"nodes": "m*"}],
            },
            "'m*' matches no node of the fleet",
        ),
        (
            {
                "pools": [{"nodes": "n{0..1}", "gpu": {"model": H100, "count": 8}}],
                "overrides": [{"nodes": "n*", "labels": {"a": "b"}}, {"nodes": "n1", "labels": {"a": "c"}}],
            },
            "n1 is also matched by overrides[0]",
        ),
        (
            {
                "pools": [{"count": 1, "gpu": {"model": H100, "count": 2}}],
                "overrides": [
                    {"nodes": "pool-0-0", "scenario": {"timeline": [{"after": "1s", "gpu": 5, "xid": 79}]}}
                ],
            },
            "timeline[0].gpu",
        ),
    ],
)
def test_bad_fleet_files_are_rejected_naming_the_field(data: Any, expected: str, tmp_path: Path) -> None:
    found = problems(data, tmp_path)
    assert any(expected in p for p in found), found


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    found = problems({"seed": "x", "workers": 0, "pools": [{"count": 1}]}, tmp_path)
    assert len(found) == 3, found


def test_an_unreadable_or_non_yaml_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(fleetfile.FleetError, match=r"missing\.yaml: invalid fleet file"):
        fleetfile.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(fleetfile.FleetError, match="not valid YAML"):
        fleetfile.load(bad)


def test_the_cli_validates_fleet_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(
        tmp_path, "good.yaml", {"pools": [{"name": "a", "count": 3, "gpu": {"model": H100, "count": 8}}]}
    )
    assert cli.main(["validate", str(good)]) == 0
    assert "3 nodes in 1 pool(s): a (3)" in capsys.readouterr().out
    bad = write(tmp_path, "bad.yaml", {"pools": [{"name": "a", "count": 0}]})
    assert cli.main(["validate", str(bad)]) == cli.INVALID_FLEET
    assert "pools[0].count: expected an integer >= 1" in capsys.readouterr().err
    # `run` spells it --fleet; a user who types the same for validate is understood.
    assert cli.main(["validate", "--fleet", str(good)]) == 0
    assert "3 nodes in 1 pool(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        cli.main(["validate"])
    assert usage.value.code == 2 and "one fleet file" in capsys.readouterr().err


def test_the_demo_names_every_kind_of_node_in_a_mixed_fleet(tmp_path: Path) -> None:
    a100 = "NVIDIA A100-SXM4-80GB"
    pools = [
        {"name": "a", "count": 3, "gpu": {"model": a100, "count": 4}},
        {"name": "h", "count": 2, "gpu": {"model": H100, "count": 8}},
    ]
    mixed = fleetfile.parse({"pools": pools}, source="fleet.yaml", base_dir=tmp_path)
    assert walkthrough.hardware(mixed) == f"3 of 4x {a100}, 2 of 8x {H100}"
    one = fleetfile.parse({"pools": pools[1:]}, source="fleet.yaml", base_dir=tmp_path)
    assert walkthrough.hardware(one) == f"8x {H100}"
