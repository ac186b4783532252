"""The backtest replays recorded active-check runs (trace format 6, `check` records), as a user runs it.

A replay cannot run check Jobs: the runs a recording saw in GPUNode `status.checks[]` are handed to the
replayed operator at their time, which judges ActiveCheckFailed from them and acts by the policy's rules
(docs/backtest.md). The replayed operator never starts a check of its own.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import pathlib
from typing import Any, Final

import pytest

from gpuhealth_sim import cli
from gpuhealth_sim.backtest import replayer, scoring, tracerecord, traces
from gpunode_facts import agent_status

START: Final = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
NODES: Final = [f"n{i}" for i in range(4)]
FAILED_AT, PASSED_AT = 600.0, 1800.0
CHECKS: Final = """
  activeChecks:
  - {name: quick, template: DcgmDiagQuick, everySeconds: 600, idleForSeconds: 5, timeoutSeconds: 60,
     maxConcurrent: 3}
"""


def stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy(path: pathlib.Path, *, checks: bool = True) -> pathlib.Path:
    path.write_text(
        f"""apiVersion: gpuhealth.io/v1alpha1
kind: GPUHealthPolicy
metadata: {{name: checked}}
spec:
  maxUnavailable: 2
  rules:
  - {{name: ecc, condition: EccUncorrectable, action: Drain}}
  - {{name: check, condition: ActiveCheckFailed, action: Drain}}
  recovery: {{uncordon: true, healthyForSeconds: 60}}
{CHECKS if checks else ""}""",
        encoding="utf-8",
    )
    return path


def run_entry(result: str, t: float) -> dict[str, Any]:
    """An entry of GPUNode `status.checks[]` as the operator's check step writes it."""
    entry: dict[str, Any] = {
        "name": "quick",
        "template": "DcgmDiagQuick",
        "policy": "checked",
        "time": stamp(t),
        "result": result,
        "started": stamp(t - 3),
    }
    if result == "Failed":
        entry["message"] = "simulated check DcgmDiagQuick failed"
    return entry


def write_trace(
    path: pathlib.Path, runs: list[tuple[float, str, dict[str, Any]]], start: float = START.timestamp()
) -> pathlib.Path:
    """Four nodes reporting every minute for an hour; `runs`: (t, node, entry) of check records."""
    with traces.Writer(path, {"start": start}) as writer:
        for name in NODES:
            obj = {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {"unschedulable": False},
                "status": {"capacity": {"nvidia.com/gpu": "8"}},
            }
            writer.write({"kind": "node", "t": 0, "object": obj})
        pending = sorted(runs, key=lambda r: r[0])
        for minute in range(60):
            for i, name in enumerate(NODES):
                t = minute * 60 + i
                while pending and pending[0][0] <= t:
                    at, node, entry = pending.pop(0)
                    writer.write({"kind": "check", "t": at, "node": node, "run": entry})
                status = agent_status(heartbeat=stamp(t), observed=stamp(0))
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def backtest(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["backtest", *args]) == 0
    return capsys.readouterr().out


def report(capsys: pytest.CaptureFixture[str], trace: pathlib.Path, policy_path: pathlib.Path) -> Any:
    return json.loads(backtest(capsys, "--policy", str(policy_path), "--trace", str(trace), "-o", "json"))


@pytest.fixture
def failing(tmp_path: pathlib.Path) -> pathlib.Path:
    runs = [
        (FAILED_AT, "n1", run_entry("Failed", FAILED_AT)),
        (PASSED_AT, "n1", run_entry("Passed", PASSED_AT)),
        (900.0, "n2", run_entry("Passed", 900.0)),
    ]
    return write_trace(tmp_path / "checks.jsonl", runs)


def test_a_recorded_failed_check_drains_the_node_and_a_later_pass_returns_it(
    tmp_path: pathlib.Path, failing: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replayed = report(capsys, failing, policy(tmp_path / "p.yaml"))["policies"][0]
    acted = replayed["nodeActions"]
    actions = [(a["node"], a["action"]) for a in acted if not a["action"].startswith("Label")]
    assert actions == [("n1", "Drain"), ("n1", "Uncordon")], replayed["nodeActions"]
    drain = next(a for a in replayed["nodeActions"] if a["action"] == "Drain")
    assert FAILED_AT <= drain["t"] < FAILED_AT + 60, "drained at the recorded failure"
    assert "ActiveCheckFailed" in drain["reason"]
    uncordon = next(a for a in replayed["nodeActions"] if a["action"] == "Uncordon")
    assert uncordon["t"] >= PASSED_AT + 60, "back once the later pass cleared it, after healthyForSeconds"
    said = [(e["node"], e["reason"]) for e in replayed["events"] if e["reason"].startswith("Check")]
    assert said == [("n1", "CheckFailed"), ("n2", "CheckPassed"), ("n1", "CheckPassed")], (
        "the recorded runs, said as live; no check of the replay's own (it runs no Jobs)"
    )


def test_the_text_report_shows_the_drain_of_the_failed_check(
    tmp_path: pathlib.Path, failing: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = backtest(capsys, "--policy", str(policy(tmp_path / "p.yaml")), "--trace", str(failing))
    lines = [line.strip() for line in text.splitlines()]
    at = lines.index("n1")
    assert lines[at + 1 : at + 3] == ["d0 00:10:00  Drain (ActiveCheckFailed)", "d0 00:31:00  Uncordon"], text
    assert "n2" not in lines, "a passed check is no action"


def test_without_recorded_runs_a_policys_active_checks_change_nothing_in_a_replay(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "plain.jsonl", [])
    with_checks = report(capsys, trace, policy(tmp_path / "with.yaml"))["policies"][0]
    without = report(capsys, trace, policy(tmp_path / "without.yaml", checks=False))["policies"][0]
    for kept in (with_checks, without):
        kept.pop("replaySeconds")
        kept.pop("replayCpuSeconds")
    assert with_checks["events"] == without["events"], "no check Job of the replay's own, none timed out"
    assert with_checks == without


def test_a_recording_writes_each_check_run_once_after_its_gpunode() -> None:
    compactor = tracerecord.Compactor(START.timestamp())
    first = run_entry("Passed", 100.0)
    body: dict[str, Any] = {
        "metadata": {"name": "n1"},
        "status": {**agent_status(heartbeat=stamp(1), observed=stamp(0)), "checks": [first]},
    }
    found = compactor.gpunode_records(body, START.timestamp() + 1)
    assert [r["kind"] for r in found] == ["gpunode", "check"], "a run already there when the node is found"
    assert found[1] == {"kind": "check", "t": 1.0, "node": "n1", "run": first}
    failed = run_entry("Failed", 200.0)
    body["status"] = {**body["status"], "checks": [first, failed]}
    assert compactor.gpunode_records(body, START.timestamp() + 201) == [
        {"kind": "check", "t": 201.0, "node": "n1", "run": failed}
    ], "only the new run, the agent's part unchanged"
    assert compactor.gpunode_records(body, START.timestamp() + 202) == []


def test_a_check_record_without_its_run_is_refused_naming_the_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.jsonl"
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        writer.write({"kind": "check", "t": 1, "node": "n1"})
    with (
        pytest.raises(traces.TraceError, match=r"bad.jsonl:2: check record needs"),
        traces.open_trace(path) as (_, records),
    ):
        list(records)


def test_the_replayed_operator_starts_no_check_job_of_its_own(tmp_path: pathlib.Path) -> None:
    """What the backtest's cluster was asked: a replay runs no Jobs, so its check step is off (it would
    start a check on every idle node, which never ends there)."""
    trace = write_trace(tmp_path / "plain.jsonl", [(FAILED_AT, "n1", run_entry("Failed", FAILED_AT))])
    with traces.open_trace(trace) as (header, records):
        replay = replayer.Replay(replayer.load_policy(policy(tmp_path / "p.yaml")), header["start"], 30.0)
        asyncio.run(replay.run(records))
    assert [j["metadata"]["name"] for j in replay.client.job_log] == [], "no check Job"


def test_a_failed_check_is_a_fault_the_score_counts_acted_on_not_a_false_drain(
    tmp_path: pathlib.Path, failing: pathlib.Path
) -> None:
    result = replayer.run(failing, replayer.load_policy(policy(tmp_path / "p.yaml")))
    fatal = scoring.score(failing, result, baseline=False)["fatal"]
    assert fatal["byFault"] == {"ActiveCheckFailed": {"faults": 1, "acted": 1}}, fatal
    assert fatal["falseDisruptive"] == 0, fatal["falseDisruptiveActions"]
    assert fatal["secondsToActionP50"] is not None and fatal["secondsToActionP50"] < 60


def test_a_drain_at_the_instant_of_a_recorded_failure_is_acted_on_whatever_the_clocks_rounding(
    tmp_path: pathlib.Path,
) -> None:
    """A recording's start and times are fractional (the demo's: start ...540.37, the run at t=13.143):
    the replay's clock (start + t, less start) reads the drain a float's hair before the record's t."""
    runs = [(13.143, "n1", run_entry("Failed", 13.0))]
    trace = write_trace(tmp_path / "demo-like.jsonl", runs, start=1_764_666_540.370_123)
    result = replayer.run(trace, replayer.load_policy(policy(tmp_path / "p.yaml")))
    assert [a.action for a in result.actions if a.node == "n1" and a.action in ("Cordon", "Drain")] == [
        "Drain"
    ], result.actions
    fatal = scoring.score(trace, result, baseline=False)["fatal"]
    assert (fatal["acted"], fatal["faults"], fatal["falseDisruptive"]) == (1, 1, 0), fatal
