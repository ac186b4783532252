"""The backtest replays a trace through the operator's own code: what it does to Nodes, and when."""

import asyncio
import datetime
import json
import os
import pathlib
import subprocess
import sys

import pytest

from gpuhealth_sim import cli
from gpuhealth_sim.backtest import replayer, scoring, subcommands, tracegen, tracerecord, traces
from gpuhealth_sim.fleet import dra
from gpunode_facts import agent_status

POLICY = pathlib.Path(__file__).parents[3] / "examples" / "default-policy.yaml"
START = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
NODES = [f"n{i}" for i in range(10)]


def stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node(name: str, **labels: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", **labels}},
        "spec": {"unschedulable": False},
        "status": {"capacity": {"nvidia.com/gpu": "32" if labels else "8"}},
    }


def write_trace(
    path: pathlib.Path,
    faults: dict[str, tuple[float, float]],
    minutes: int = 60,
    deleted: dict[str, float] | None = None,
    silent: dict[str, float] | None = None,
    pods: dict[str, list[tuple[float, bool | None]]] | None = None,
) -> pathlib.Path:
    """Ten H100 nodes (n9 time-sliced) reporting every minute; `faults`: node → (DBE at, repaired at);
    `deleted`: node → when its Node was deleted (the garbage collector's GPUNode deletion 1 s later);
    `silent`: node → when its agent stopped reporting; `pods`: node → its agent pod's changes (t, Ready,
    or None: deleted), the pod Ready from the start."""
    gone = {t: name for name, t in (deleted or {}).items()}
    pod_changes = sorted(
        (t, name, ready) for name, changes in (pods or {}).items() for t, ready in [(0.0, True), *changes]
    )
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name, (start, end) in faults.items():
            writer.write(
                {"kind": "truth", "type": "fatal", "node": name, "start": start, "end": end, "fault": "DBE"}
            )
        for name in NODES:
            labels = {"nvidia.com/gpu.replicas": "4"} if name == "n9" else {}
            writer.write({"kind": "node", "t": 0, "object": node(name, **labels)})
        for minute in range(minutes):
            for t, name, ready in [c for c in pod_changes if minute * 60 <= c[0] < (minute + 1) * 60]:
                pod = {"name": f"gpu-health/agent-{name}"}
                if ready is None:
                    writer.write({"kind": "agentpod", "t": t, **pod, "deleted": True})
                else:
                    since = stamp(t)
                    writer.write(
                        {"kind": "agentpod", "t": t, **pod, "node": name, "ready": ready, "since": since}
                    )
            for t in sorted(t for t in gone if minute * 60 <= t < (minute + 1) * 60):
                writer.write({"kind": "node", "t": t, "name": gone[t], "deleted": True})
                writer.write({"kind": "gpunode", "t": t + 1, "name": gone[t], "deleted": True})
            for i, name in enumerate(NODES):
                t = minute * 60 + i
                if min((deleted or {}).get(name, 1e9), (silent or {}).get(name, 1e9)) <= t:
                    continue
                start, end = faults.get(name, (1e9, 1e9))
                broken = {0: {"ecc": {"uncorrectedVolatile": 1}, "observedTime": stamp(start)}}
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(0), overrides=broken if start <= t < end else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def test_every_dbe_node_is_drained_within_the_budget(tmp_path: pathlib.Path) -> None:
    faults = {"n1": (600.0, 1500.0), "n2": (660.0, 3600.0)}
    trace = write_trace(tmp_path / "t.jsonl", faults)
    result = replayer.run(trace, replayer.load_policy(POLICY))
    drains = [(a.node, a.t) for a in result.actions if a.action == "Drain"]
    assert [n for n, _ in drains] == ["n1", "n2"], "n2 waits for n1 (maxUnavailable 10% of 10 = 1)"
    assert drains[0][1] - 600 < 60, "drained at the first report of the fault"
    uncordon = next(a.t for a in result.actions if a.action == "Uncordon" and a.node == "n1")
    assert uncordon >= 1500 + 600, "uncordoned after recovery.healthyForSeconds"
    assert drains[1][1] >= uncordon, "the budget admits n2 only once n1 is back"
    assert result.pending_nodes == {"n2"}
    assert result.max_cordoned_by_policy == 1 == result.max_unavailable_limit
    score = scoring.score(trace, result, baseline=False)
    assert score["fatal"]["recall"] == 1.0 and score["fatal"]["falseDisruptive"] == 0
    assert score["maxUnavailableRespected"]


def test_a_node_deleted_while_drained_frees_the_budget_for_the_next_fault(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A node with a DBE is often replaced rather than repaired: its Node is deleted while drained.
    # Live, the next fatal node is drained at once; a replay that kept the deleted node cordoned
    # left it Pending behind a node that no longer exists.
    faults = {"n1": (600.0, 1e9), "n2": (1500.0, 1e9)}
    trace = write_trace(tmp_path / "t.jsonl", faults, deleted={"n1": 1200.0})
    result = replayer.run(trace, replayer.load_policy(POLICY))
    drains = {a.node: a.t for a in result.actions if a.action == "Drain"}
    assert drains.keys() == {"n1", "n2"}, result.actions
    assert 1500 <= drains["n2"] < 1500 + 60, "drained at the first report of its fault"
    assert result.pending_nodes == set(), "no node waited for the budget"
    assert not [a for a in result.actions if a.node == "n1" and a.t >= 1200], "no action on a deleted node"
    assert result.nodes == 10 and result.max_cordoned_by_policy == 1
    end = 59 * 60 + 9  # the last report
    out = (1200 - drains["n1"]) + (end - drains["n2"])
    assert result.gpu_hours_out == pytest.approx(out / 3600 * 8), "n1's GPUs left service with it"
    score = scoring.score(trace, result, baseline=False)
    assert score["fatal"]["recall"] == 1.0 and score["fatal"]["falseDisruptive"] == 0
    assert result.summary()["deletedNodes"] == [{"t": 1200.0, "node": "n1"}]
    subcommands.print_text(result, None)
    report = capsys.readouterr().out
    assert report.index("Drain") < report.index("d0 00:20:00  (Node deleted)") < report.index("  n2")


def test_a_node_deleted_and_created_again_is_judged_as_a_new_one(tmp_path: pathlib.Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", {"n1": (300.0, 1e9)}, minutes=20, deleted={"n1": 600.0})
    with trace.open("a", encoding="utf-8") as out:  # the replacement joins under the same name, healthy
        out.write(json.dumps({"kind": "node", "t": 1300, "object": node("n1")}) + "\n")
        status = agent_status(heartbeat=stamp(1301), observed=stamp(1301))
        out.write(json.dumps({"kind": "gpunode", "t": 1301, "name": "n1", "status": status}) + "\n")
    result = replayer.run(trace, replayer.load_policy(POLICY))
    on_n1 = [(a.action, a.t) for a in result.actions if a.node == "n1"]
    assert [a for a, _ in on_n1] == [
        "Label health=healthy",
        "Drain",
        "Label health=unhealthy",
        "Label health=healthy",
    ]
    assert on_n1[-1][1] >= 1301, "the new node is labelled healthy, not uncordoned: it was never cordoned"


def test_an_agent_that_stops_reporting_is_judged_stale_as_live(tmp_path: pathlib.Path) -> None:
    # Live, three missed heartbeats by the operator's clock make the agent stale (its node's health
    # Unknown, nothing disruptive on its old facts). The replay's clock is the trace's, and the time a
    # report was seen must be too: it was the machine's, so no agent ever went stale in a replay.
    trace = write_trace(tmp_path / "t.jsonl", {}, minutes=30, silent={"n3": 600.0})
    result = replayer.run(trace, replayer.load_policy(POLICY))
    stale = [e["t"] for e in result.events if e["reason"] == "AgentStale"]
    last_report = 9 * 60 + 3
    assert len(stale) == 1 and last_report + 3 * 60 <= stale[0] <= last_report + 3 * 60 + 30, result.events
    assert {e["node"] for e in result.events if e["reason"] == "AgentStale"} == {"n3"}


def test_an_agent_whose_pod_turns_not_ready_is_judged_stale_after_the_grace_as_live(
    tmp_path: pathlib.Path,
) -> None:
    # Live, the operator watches the agents' pods: a hung agent's NotReady pod (or a deleted one)
    # makes its node Unknown after a 60 s grace, not only after three missed heartbeats. The trace
    # records the pods, so the replay says AgentStale as soon as live did.
    pods: dict[str, list[tuple[float, bool | None]]] = {
        "n3": [(600.0, False)],
        "n4": [(600.0, None)],
        "n5": [(600.0, False), (630.0, True)],  # an agent restart, within the grace
    }
    silent = {"n3": 600.0, "n4": 600.0}
    trace = write_trace(tmp_path / "t.jsonl", {}, minutes=30, silent=silent, pods=pods)
    result = replayer.run(trace, replayer.load_policy(POLICY))
    stale = {e["node"]: e for e in result.events if e["reason"] == "AgentStale"}
    assert set(stale) == {"n3", "n4"}, result.events
    for name in ("n3", "n4"):
        assert 660 <= stale[name]["t"] <= 690, stale  # the grace past the last report, plus a tick
    assert "is not Ready since" in stale["n3"]["message"], stale["n3"]
    assert not any(a.action in ("Cordon", "Drain") for a in result.actions), "missing data is never a fault"


def test_a_fault_storm_trips_the_breaker_in_the_replay_as_live(tmp_path: pathlib.Path) -> None:
    # Four nodes Unhealthy within two minutes with maxNewUnhealthy 2 per 10 minutes: the breaker opens
    # at the third and pauses new drains (the storm is a bad rollout more often than bad GPUs).
    faults = {name: (600.0 + 30 * i, 1e9) for i, name in enumerate(("n1", "n2", "n3", "n4"))}
    policy = replayer.load_policy(POLICY)
    policy["spec"]["maxUnavailable"] = 5
    policy["spec"]["breaker"] = {"maxNewUnhealthy": 2, "windowSeconds": 600}
    result = replayer.run(write_trace(tmp_path / "t.jsonl", faults, minutes=20), policy)
    drained = [a.node for a in result.actions if a.action == "Drain"]
    assert drained == ["n1", "n2"], result.actions
    assert any(e["reason"] == "RemediationPaused" for e in result.events), {
        e["reason"] for e in result.events
    }


def test_a_pool_policy_is_scored_on_the_nodes_it_selects(tmp_path: pathlib.Path) -> None:
    # A policy for one pool (here: every node but the time-sliced n9) says nothing of the other
    # pools' faults: they are not its misses, and its report says how many nodes it selects.
    policy = replayer.load_policy(POLICY)
    policy["spec"]["nodeSelector"] = {
        "matchExpressions": [{"key": "nvidia.com/gpu.replicas", "operator": "DoesNotExist"}]
    }
    trace = tmp_path / "t.jsonl"
    with_truth = write_trace(
        trace, {"n9": (300.0, 1e9), "n1": (600.0, 1e9)}, minutes=20, deleted={"n9": 900.0}
    )
    result = replayer.run(with_truth, policy)
    assert [a.node for a in result.actions if a.action == "Drain"] == ["n1"]
    summary = result.summary()
    assert (summary["nodes"], summary["selectedNodes"]) == (10, 9), summary
    assert summary["deletedNodes"] == [], "n9 is not the policy's: its deletion is not in the report"
    fatal = scoring.score(trace, result)["fatal"]
    assert (fatal["faults"], fatal["acted"], fatal["recall"]) == (1, 1, 1.0), fatal


def test_a_time_sliced_node_is_not_lost(tmp_path: pathlib.Path) -> None:
    result = replayer.run(write_trace(tmp_path / "t.jsonl", {}, minutes=10), replayer.load_policy(POLICY))
    assert [a for a in result.actions if a.action in ("Cordon", "Drain")] == []


def test_a_dry_run_policy_changes_nothing_and_says_what_it_would_do(tmp_path: pathlib.Path) -> None:
    policy = replayer.load_policy(POLICY)
    policy["spec"]["dryRun"] = True
    result = replayer.run(write_trace(tmp_path / "t.jsonl", {"n1": (300.0, 1e9)}, minutes=10), policy)
    assert result.max_unschedulable == 0
    said = [a for a in result.actions if a.action == "DryRun"]
    assert said and said[0].node == "n1" and "cordon and drain" in said[0].reason


def test_generated_trace_replays_with_every_fatal_fault_acted_on(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "g.jsonl.gz"
    tracegen.generate(tracegen.Options(node_days=3, seed=18, nodes=12), trace)  # a recovery action, an XID 79
    result = replayer.run(trace, replayer.load_policy(POLICY))
    score = scoring.score(trace, result, baseline=False)
    assert score["fatal"]["falseDisruptive"] == 0
    assert score["fatal"]["acted"] == score["fatal"]["faults"] == 2
    assert score["maxUnavailableRespected"]


def test_a_policy_file_without_a_policy_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "p.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(replayer.PolicyError, match="no GPUHealthPolicy"):
        replayer.load_policy(tmp_path / "p.yaml")


def test_a_policy_the_operator_would_refuse_is_refused_naming_the_field(tmp_path: pathlib.Path) -> None:
    # Live, the operator acts on nothing under an invalid policy; a replay of it said "selects 0 nodes".
    text = POLICY.read_text().replace("action: Drain", "action: Explode", 1)
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(
        replayer.PolicyError, match=r"p\.yaml: policy .* is invalid: spec\.rules\[\d\]\.action"
    ):
        replayer.load_policy(tmp_path / "p.yaml")
    (tmp_path / "q.yaml").write_text("kind: GPUHealthPolicy\nspec: [1]\n")
    with pytest.raises(replayer.PolicyError, match="must be mappings"):
        replayer.load_policy(tmp_path / "q.yaml")


def test_the_commands_generate_and_backtest(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "c.jsonl.gz"
    assert (
        cli.main(
            ["trace", "generate", "--node-days", "1", "--nodes", "12", "--seed", "2", "--out", str(trace)]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        cli.main(["backtest", "--policy", str(POLICY), "--trace", str(trace), "--score", "-o", "json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["policies"][0]["policy"] == "default"
    assert "baselineStragglers" in report["policies"][0]["score"]
    (tmp_path / "bad.jsonl").write_text("{}\n")
    assert cli.main(["backtest", "--policy", str(POLICY), "--trace", str(tmp_path / "bad.jsonl")]) == 3
    assert "bad.jsonl:1: not a gpu-health trace" in capsys.readouterr().err


def test_scoring_a_recorded_trace_without_ground_truth_is_refused_not_scored_as_all_false(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A recorded week has no truth records: scored, every drain was "false" and every label wrong.
    recorded = write_trace(tmp_path / "recorded.jsonl", {}, minutes=5)
    args = ["backtest", "--policy", str(POLICY), "--trace", str(recorded)]
    assert cli.main([*args, "--score"]) == 2
    assert "recorded.jsonl holds no ground truth" in capsys.readouterr().err
    assert cli.main(args) == 0, "the report itself needs no truth"
    assert "== policy default" in capsys.readouterr().out


def test_two_policies_are_replayed_side_by_side_as_each_alone(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "g.jsonl.gz"
    tracegen.generate(tracegen.Options(node_days=3, seed=18, nodes=12), trace)
    dry = replayer.load_policy(POLICY)
    dry["metadata"]["name"], dry["spec"]["dryRun"] = "dry", True
    policies = [replayer.load_policy(POLICY), dry]
    together = subcommands.replay_all(trace, policies, 30.0, score=True)
    alone = [subcommands.replay(trace, p, 30.0, score=True, baseline=i == 0) for i, p in enumerate(policies)]
    assert [r.policy for r, _ in together] == ["default", "dry"], "in the order given"
    for (result, score), (expected, expected_score) in zip(together, alone, strict=True):
        assert result.actions == expected.actions and result.events == expected.events
        assert score == expected_score
    assert together[0][1] is not None and "baselineStragglers" in together[0][1], "beside the first only"
    assert together[1][1] is not None and "baselineStragglers" not in together[1][1]
    assert [a.action for a in together[1][0].actions if a.action in ("Cordon", "Drain")] == []


def test_a_bad_trace_is_named_when_policies_are_replayed_side_by_side(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cut.jsonl").write_text(
        '{"kind": "header", "format": "gpu-health-trace", "version": 3, "start": 0}\n{"kind"'
    )
    args = [
        "backtest",
        "--policy",
        str(POLICY),
        "--policy",
        str(POLICY),
        "--trace",
        str(tmp_path / "cut.jsonl"),
    ]
    assert cli.main(args) == 3
    assert "cut.jsonl:2: truncated trace" in capsys.readouterr().err


def test_the_recorded_operators_own_cordon_is_not_replayed_as_a_humans(tmp_path: pathlib.Path) -> None:
    """A trace of an acting policy holds its cordons; they are its own, not others' changes to replay."""
    path = write_trace(tmp_path / "t.jsonl", {}, minutes=3)
    lines = path.read_text().splitlines()
    echo = node("n1")
    echo["metadata"]["annotations"] = {"gpuhealth.io/cordoned-by": "default"}
    echo["spec"]["unschedulable"] = True
    human = node("n2")
    human["spec"]["unschedulable"] = True
    lines.append(json.dumps({"kind": "node", "t": 200, "object": echo}))
    lines.append(json.dumps({"kind": "node", "t": 200, "object": human}))
    lines.append(json.dumps({"kind": "gpunode", "t": 230, "name": "n1", "status": agent_status()}))
    path.write_text("\n".join(lines) + "\n")
    result = replayer.run(path, replayer.load_policy(POLICY))
    assert result.max_unschedulable == 1, "only the human's cordon of n2 is replayed"


def test_a_recording_that_starts_on_the_policys_cordon_replays_it_as_the_policys(
    tmp_path: pathlib.Path,
) -> None:
    # `record` started while n1 was cordoned and drained by policy default (its GPU since repaired) and
    # n2 cordoned by a person. Live, default uncordons n1 once healthy for healthyForSeconds (600 s)
    # and leaves n2 alone. The first version of a Node is the cluster's state then, claims included.
    path = write_trace(tmp_path / "t.jsonl", {}, minutes=15)
    claimed = node("n1")
    claimed["metadata"]["labels"]["gpuhealth.io/health"] = "unhealthy"
    claimed["metadata"]["annotations"] = {
        "gpuhealth.io/cordoned-by": "default",
        "gpuhealth.io/cordoned-at": stamp(-3600),
        "gpuhealth.io/drain-started": stamp(-3600),
    }
    claimed["spec"]["unschedulable"] = True
    human = node("n2")
    human["spec"]["unschedulable"] = True
    first = {"n1": claimed, "n2": human}
    lines = []
    for text in path.read_text().splitlines():
        record = json.loads(text)
        name = record.get("object", {}).get("metadata", {}).get("name")
        if record.get("kind") == "node" and record["t"] == 0 and name in first:
            record["object"] = first[name]
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    result = replayer.run(path, replayer.load_policy(POLICY))
    done = [
        (a.node, a.action) for a in result.actions if a.node in first and not a.action.startswith("Label")
    ]
    assert done == [("n1", "Uncordon")], result.actions
    [uncordon] = [a for a in result.actions if a.action == "Uncordon"]
    assert 600 <= uncordon.t <= 700, uncordon
    assert result.max_cordoned_by_policy == 1
    assert result.gpu_hours_out == pytest.approx(8 * uncordon.t / 3600), "out of service from the start"


def test_a_recording_begun_on_a_held_label_keeps_it_as_live_does(tmp_path: pathlib.Path) -> None:
    # n1 has been thermally throttled for an hour when `record` starts: labelled, its ThermalThrottled
    # condition True in the GPUNode status the operator wrote. Live, the label stays. The replay starts
    # as an operator restarted then (it reads its conditions back), so it neither drops the label for
    # forSeconds nor counts the flap.
    hot = {4: {"temperatureCelsius": 93, "clockEventReasons": ["HwThermalSlowdown"], "smClockMHz": 1400}}
    held = {
        "type": "ThermalThrottled",
        "status": "True",
        "reason": "ThermalThrottled",
        "message": "GPU 4: HwThermalSlowdown",
        "lastTransitionTime": stamp(-3600),
    }
    path = tmp_path / "t.jsonl"
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name in NODES[:6]:
            first = node(name)
            if name == "n1":
                first["metadata"]["labels"]["gpuhealth.io/thermal-throttled"] = "true"
                first["metadata"]["labels"]["gpuhealth.io/health"] = "degraded"
            writer.write({"kind": "node", "t": 0, "object": first})
        for minute in range(5):
            for i, name in enumerate(NODES[:6]):
                t = minute * 60 + i
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(0), overrides=hot if name == "n1" else None
                )
                record = {"kind": "gpunode", "t": t, "name": name, "status": status}
                if minute == 0 and name == "n1":
                    record["operator"] = {"conditions": [held]}  # the operator's, in the first one recorded
                writer.write(record)
    result = replayer.run(path, replayer.load_policy(POLICY))
    assert [a for a in result.actions if a.node == "n1"] == [], result.actions
    assert result.label_flaps == 0


def test_labels_people_set_under_the_prefix_come_from_the_trace(tmp_path: pathlib.Path) -> None:
    """gpuhealth.io/exclude (and a selector's gpuhealth.io/… label) are not the operator's to keep."""
    path = write_trace(tmp_path / "t.jsonl", {"n1": (120.0, 1e9)}, minutes=5)
    excluded = node("n1", **{"gpuhealth.io/exclude": "true"})
    lines = [
        json.dumps({"kind": "node", "t": 0, "object": excluded})
        if '"kind":"node"' in line and '"n1"' in line
        else line
        for line in path.read_text().splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    result = replayer.run(path, replayer.load_policy(POLICY))
    assert not [a for a in result.actions if a.node == "n1" and a.action in ("Cordon", "Drain")]


def isolating_policy() -> dict:
    return {
        "apiVersion": "gpuhealth.io/v1alpha1",
        "kind": "GPUHealthPolicy",
        "metadata": {"name": "iso", "generation": 1},
        "spec": {
            "maxUnavailable": 2,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 120},
        },
    }


def dra_slice(name: str) -> dict:
    """The node's ResourceSlice as a trace records it (what the operator reads of it)."""
    devices = [
        {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i:08d}-0000-0000-0000-000000000000"}}}
        for i in range(8)
    ]
    return {
        "metadata": {"name": f"{name}-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": name, "pool": {"name": name}, "devices": devices},
    }


def write_dra_trace(
    path: pathlib.Path, *, slices: bool, served: bool = True, replaced: bool = False
) -> pathlib.Path:
    """Two nodes; GPU 3 of n1 has a DBE from 600 s to 1200 s; ResourceSlices of both if `slices`;
    if `replaced`, n1 is deleted at 900 s instead and GPU 3 of n0 has a DBE from 1200 s."""
    rules = {"version": "v1beta2" if served else None, "actedOn": True if served else None}
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        writer.write({"kind": "cluster", "t": 0, "deviceTaintRules": rules})
        for name in ("n0", "n1"):
            writer.write({"kind": "node", "t": 0, "object": node(name)})
            if slices:
                writer.write({"kind": "resourceslice", "t": 0, "object": dra_slice(name)})
        for minute in range(40):
            if replaced and minute == 15:
                for kind in ("node", "gpunode", "resourceslice"):
                    gone = dra.slice_name("n1") if kind == "resourceslice" else "n1"
                    writer.write({"kind": kind, "t": 900, "name": gone, "deleted": True})
            for i, name in enumerate(("n0", "n1")):
                t = minute * 60 + i
                if replaced and name == "n1" and t >= 900:
                    continue
                broken = (name == "n1" and 600 <= t < 1200) or (replaced and name == "n0" and t >= 1200)
                overrides = {3: {"ecc": {"uncorrectedVolatile": 1}, "observedTime": stamp(600)}}
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(0), overrides=overrides if broken else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


def test_a_dra_node_has_its_faulty_gpu_isolated_not_its_node_drained(tmp_path: pathlib.Path) -> None:
    result = replayer.run(write_dra_trace(tmp_path / "t.jsonl", slices=True), isolating_policy())
    on_n1 = [(a.action, a.t) for a in result.actions if a.node == "n1" and not a.action.startswith("Label")]
    assert [a for a, _ in on_n1] == ["Isolate GPU 3", "Restore GPU 3"], result.actions
    assert 600 <= on_n1[0][1] < 660 and on_n1[1][1] >= 1200 + 120
    assert not [a for a in result.actions if a.action in ("Cordon", "Drain")]
    assert any(e["reason"] == "GPUIsolated" and "GPU 3" in e["message"] for e in result.events)


@pytest.mark.parametrize(("slices", "served"), [(False, True), (True, False)])
def test_without_dra_devices_or_rules_isolate_gpu_falls_back_to_the_node_ladder(
    tmp_path: pathlib.Path, slices: bool, served: bool
) -> None:
    trace = write_dra_trace(tmp_path / "t.jsonl", slices=slices, served=served)
    result = replayer.run(trace, isolating_policy())
    on_n1 = [a.action for a in result.actions if a.node == "n1" and not a.action.startswith("Label")]
    assert on_n1 == ["Drain", "Uncordon"], result.actions


def test_the_rule_of_a_deleted_node_goes_with_it_and_frees_the_gpu_budget(tmp_path: pathlib.Path) -> None:
    policy = isolating_policy()
    policy["spec"]["maxUnavailableGPUs"] = 1
    result = replayer.run(write_dra_trace(tmp_path / "t.jsonl", slices=True, replaced=True), policy)
    isolated = [(a.node, a.action, a.t) for a in result.actions if "GPU" in a.action]
    assert [(n, a) for n, a, _ in isolated] == [("n1", "Isolate GPU 3"), ("n0", "Isolate GPU 3")], isolated
    assert 1200 <= isolated[1][2] < 1260, "n0's GPU isolated at its first faulty report: n1's rule is gone"
    assert not [a for a in result.actions if a.action in ("Cordon", "Drain")]


def test_a_recording_begun_midway_goes_on_as_the_whole_run(tmp_path: pathlib.Path) -> None:
    # `record` started on a running fleet writes the first version of everything: Nodes with the
    # operator's labels, GPUNodes with the conditions and isolated GPUs it had written, the rules in
    # place. That must be enough to go on: the second half of a run, replayed from what `record` would
    # have found at its middle (here: GPU 3 of n1 isolated, about to be repaired), decides what the
    # whole run decided in it. Without the rule and the isolation in place, it isolated GPU 3 again.
    whole = write_dra_trace(tmp_path / "whole.jsonl", slices=True)
    policy = isolating_policy()
    expected = [(a.t - HALF, a.node, a.action) for a in replayer.run(whole, policy).actions if a.t >= HALF]
    with traces.open_trace(whole) as (_, read):
        records = list(read)
    first_half = replayer.Replay(policy, START.timestamp(), 30.0)
    asyncio.run(first_half.run(r for r in records if r["kind"] != "truth" and r["t"] < HALF))
    assert [a.action for a in first_half.result.actions if "GPU" in a.action] == ["Isolate GPU 3"]

    cluster, at = first_half.client, START.timestamp() + HALF
    found = tracerecord.Compactor(at)
    begun = [found.cluster("v1beta2", True, at)]
    begun += [found.node(obj, at) for obj in cluster.nodes.values()]
    begun += [r for obj in cluster.slices.values() for r in found.resource("resourceslice", obj, at)]
    begun += [
        r for obj in cluster.rules.values() for r in found.resource("devicetaintrule", obj, at, existing=True)
    ]
    for (
        name,
        body,
    ) in cluster.gpunodes.items():  # as the API serves it: the agent's report, the operator's part
        served = {**body, "status": {**body["status"], **first_half.agent[name]}}
        # As JSON: the replay's cluster holds the GPUs compacted and the conditions as the operator's
        # cache keeps them (read-only mappings; a GPU's kept fields only).
        served = json.loads(json.dumps(served, default=dict))
        begun.append(found.gpunode(served, at))
    midway = tmp_path / "midway.jsonl"
    with traces.Writer(midway, {"start": at}) as writer:
        for record in [
            *begun,
            *({**r, "t": r["t"] - HALF} for r in records if r["kind"] != "truth" and r["t"] >= HALF),
        ]:
            assert record is not None
            writer.write(record)
    went_on = [(a.t, a.node, a.action) for a in replayer.run(midway, policy).actions]
    assert went_on == expected
    assert ("n1", "Restore GPU 3") in {(node, action) for _, node, action in went_on}


HALF = 900.0


def test_isolating_the_faulty_gpu_acts_on_the_fatal_fault(tmp_path: pathlib.Path) -> None:
    trace = write_dra_trace(tmp_path / "t.jsonl", slices=True)
    with trace.open("a", encoding="utf-8") as out:
        fault = {"kind": "truth", "type": "fatal", "node": "n1", "start": 600.0, "end": 1200.0, "gpu": 3}
        out.write(json.dumps({**fault, "fault": "DBE"}) + "\n")
    fatal = scoring.score(trace, replayer.run(trace, isolating_policy()), baseline=False)["fatal"]
    assert (fatal["acted"], fatal["faults"], fatal["falseDisruptive"]) == (1, 1, 0), fatal


def write_hot_trace(path: pathlib.Path) -> pathlib.Path:
    """Ten nodes that turn thermally throttled in the same minute: the timer labels them in one pass."""
    hot = {i: {"clockEventReasons": ["HwThermalSlowdown"]} for i in range(8)}
    with traces.Writer(path, {"start": START.timestamp()}) as writer:
        for name in NODES:
            writer.write({"kind": "node", "t": 0, "object": node(name)})
        for minute in range(6):
            for name in NODES:
                t = minute * 60.0
                status = agent_status(
                    heartbeat=stamp(t), observed=stamp(t), overrides=hot if minute else None
                )
                writer.write({"kind": "gpunode", "t": t, "name": name, "status": status})
    return path


SIM = [sys.executable, "-c", "import sys; from gpuhealth_sim import cli; sys.exit(cli.main(sys.argv[1:]))"]
"""`gpu-health-sim` in a new process (one per string-hash seed)."""


def test_the_same_trace_gives_the_same_report_in_every_run(tmp_path: pathlib.Path) -> None:
    """Reports are compared and diffed: actions at one instant come in the order the operator took
    them, not in an order Python's per-process string hashing picks."""
    trace = write_hot_trace(tmp_path / "hot.jsonl")
    reports = []
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [*SIM, "backtest", "--policy", str(POLICY), "--trace", str(trace), "-o", "json"],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(done.stdout)["policies"][0]
        labels = [a["node"] for a in report["nodeActions"] if a["action"] == "Label thermal-throttled=true"]
        assert sorted(labels) == NODES, "every node is labelled (in one pass)"
        reports.append([(a["t"], a["node"], a["action"]) for a in report["nodeActions"]])
    assert reports[0] == reports[1] == reports[2]
