"""Candidates side by side, and what the text report says of the budget and the breaker (issue 52).

`gpu-health-sim backtest --policy a.yaml --policy b.yaml --trace T` replays each candidate in its own
process and ends with what each would have done differently: per node, the actions and their times;
per policy, GPU-hours out of service, nodes left Pending, when the breaker opened, faults missed.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim import cli
from gpuhealth_sim.backtest import replayer, traces
from gpunode_facts import agent_status

POLICY: Final = pathlib.Path(__file__).parents[3] / "examples" / "default-policy.yaml"
START: Final = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
NODES: Final = [f"n{i}" for i in range(10)]
LOOSE: Final = {"maxNewUnhealthy": 5, "windowSeconds": 600}
"""A breaker that lets both faults through (the default one, 10 % of ten nodes, allows one)."""


def stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_trace(path: pathlib.Path, faults: dict[str, float], minutes: int = 20) -> pathlib.Path:
    """Ten 8-GPU nodes reporting every minute, with truth; `faults`: node → when a DBE appears (for good)."""
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name, start in faults.items():
            writer.write(
                {"kind": "truth", "type": "fatal", "node": name, "start": start, "end": 1e9, "fault": "DBE"}
            )
        for name in NODES:
            body = {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {"unschedulable": False},
                "status": {"capacity": {"nvidia.com/gpu": "8"}},
            }
            writer.write({"kind": "node", "t": 0, "object": body})
        for minute in range(minutes):
            for i, name in enumerate(NODES):
                t = minute * 60 + i
                start = faults.get(name, 1e9)
                broken = {0: {"ecc": {"uncorrectedVolatile": 1}, "observedTime": stamp(start)}}
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(0), overrides=broken if start <= t else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def policy_file(path: pathlib.Path, name: str, **spec: Any) -> pathlib.Path:
    document = replayer.load_policy(POLICY)
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def two_faults(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Two double-bit ECC errors 30 s apart: enough for a breaker that allows one new Unhealthy node.
    return write_trace(tmp_path_factory.mktemp("t") / "t.jsonl", {"n1": 600.0, "n2": 630.0})


def test_two_candidates_end_with_what_each_would_have_done_differently(
    two_faults: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = policy_file(tmp_path / "a.yaml", "loose", maxUnavailable=5, breaker=LOOSE)
    strict = policy_file(
        tmp_path / "b.yaml", "strict", maxUnavailable=5, breaker={"maxNewUnhealthy": 1, "windowSeconds": 600}
    )
    args = [
        "backtest",
        "--policy",
        str(loose),
        "--policy",
        str(strict),
        "--trace",
        str(two_faults),
        "--score",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    side = out[out.index("== side by side") :]
    assert "loose" in side.splitlines()[0] and "strict" in side.splitlines()[0], side
    # The figures, one row each, a column per policy.
    assert any(
        line.split() == ["GPU-hours", "out", "of", "service", "2.3", "1.2"] for line in side.splitlines()
    ), side
    assert any(line.split() == ["fatal", "faults", "missed", "0", "1"] for line in side.splitlines()), side
    # Only the node they disagree on, with each one's actions and times: n1 is drained by both.
    nodes = [line.strip() for line in side.splitlines() if re.fullmatch(r"  n\d+", line)]
    assert nodes == ["n2"], side
    block = side[side.index("  n2") :]
    assert "loose   d0 00:11:02  Drain" in block, block
    assert "strict  (nothing)" in block, block
    assert "n2 DBE at 630s" in side, "the fault the strict policy would have missed is named"
    assert "breaker opened" in side and "d0 00:1" in side.split("breaker opened")[1].splitlines()[0], side


def test_the_comparison_is_in_the_json_report_too(
    two_faults: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = policy_file(tmp_path / "a.yaml", "loose", maxUnavailable=5, breaker=LOOSE)
    tight = policy_file(tmp_path / "b.yaml", "tight", maxUnavailable=1)
    args = ["backtest", "--policy", str(loose), "--policy", str(tight), "--trace", str(two_faults)]
    assert cli.main([*args, "-o", "json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["policies"] == ["loose", "tight"]
    assert [d["node"] for d in comparison["nodes"]] == ["n2"], comparison
    differs = comparison["nodes"][0]["actions"]
    assert [a["action"] for a in differs["loose"]] == ["Drain"]
    assert differs["tight"] == []
    assert comparison["figures"]["leftPending"] == {"loose": [], "tight": ["n2"]}


def test_one_policy_prints_no_comparison(
    two_faults: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["backtest", "--policy", str(POLICY), "--trace", str(two_faults)]) == 0
    assert "side by side" not in capsys.readouterr().out


def test_the_text_report_names_the_nodes_left_pending(
    two_faults: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # maxUnavailable 1: n2's drain waits behind n1's. Before issue 52 the text said only "left Pending 1".
    tight = policy_file(tmp_path / "b.yaml", "tight", maxUnavailable=1)
    assert cli.main(["backtest", "--policy", str(tight), "--trace", str(two_faults)]) == 0
    out = capsys.readouterr().out
    assert "left Pending 1 (n2)" in out, out


def test_the_text_report_says_when_the_breaker_opened(
    two_faults: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strict = policy_file(
        tmp_path / "b.yaml", "strict", maxUnavailable=5, breaker={"maxNewUnhealthy": 1, "windowSeconds": 600}
    )
    assert cli.main(["backtest", "--policy", str(strict), "--trace", str(two_faults)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "breaker opened" in line]
    assert len(lines) == 1 and "d0 00:1" in lines[0], out
