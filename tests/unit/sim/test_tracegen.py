"""Synthetic traces: the same seed writes the same trace, and the trace holds what it claims."""

import hashlib
import itertools
import pathlib
from typing import Any, cast

import pytest
import yaml

from gpuhealth_api import conditions, gpu_uuids, xid_catalogue
from gpuhealth_sim.backtest import replayer, scoring, tracegen, traces

ROOT = pathlib.Path(__file__).resolve().parents[3]
POLICY = ROOT / "examples" / "default-policy.yaml"


def digest(path: pathlib.Path) -> str:
    with traces.open_trace(path) as (header, records):
        text = repr(header) + "".join(repr(r) for r in records)
    return hashlib.sha256(text.encode()).hexdigest()


def test_same_seed_same_trace_other_seed_other_trace(tmp_path: pathlib.Path) -> None:
    options = tracegen.Options(node_days=2, seed=3, nodes=12, sample_seconds=120)
    tracegen.generate(options, tmp_path / "a.jsonl.gz")
    tracegen.generate(options, tmp_path / "b.jsonl")
    tracegen.generate(
        tracegen.Options(node_days=2, seed=4, nodes=12, sample_seconds=120), tmp_path / "c.jsonl"
    )
    assert digest(tmp_path / "a.jsonl.gz") == digest(tmp_path / "b.jsonl")
    assert digest(tmp_path / "a.jsonl.gz") != digest(tmp_path / "c.jsonl")


def test_trace_covers_the_fleet_and_its_truth(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.jsonl"
    counts = tracegen.generate(tracegen.Options(node_days=3, seed=1, nodes=12), path)
    header, truth = traces.read_truth(path)
    assert header["generator"]["nodes"] == 12 == counts["nodes"]
    nodes = [t for t in truth if t["type"] == "node"]
    assert {n["model"] for n in nodes} >= {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"}
    assert any(n["sharing"] == "timeSlicing" for n in nodes)
    with traces.open_trace(path) as (_, records):
        statuses = [r for r in records if r["kind"] == "gpunode"]
    assert all(b["t"] >= a["t"] for a, b in itertools.pairwise(statuses)), "in time order"
    first = next(r for r in statuses if "status" in r)["status"]
    assert set(first) == {"agent", "summary", "gpus"}, "the agent's part of a GPUNode status"
    assert {"smClockMHz", "maxSmClockMHz", "ecc", "xids", "observedTime"} <= set(first["gpus"][0])
    # as the agent writes them: NVML's UUID form, which the CRD and repair's Jobs require (issue 45)
    uuids = {g["uuid"] for r in statuses if "status" in r for g in r["status"]["gpus"]}
    assert uuids and not gpu_uuids.invalid(sorted(uuids)), sorted(uuids)[:3]


def test_fleet_plan_mixes_episodes_and_keeps_major_ones_apart() -> None:
    plans, _duration = tracegen.plan_fleet(tracegen.Options(node_days=400, seed=2))
    kinds = {e.kind for p in plans for e in p.episodes}
    assert {"fatal", "straggler", "thermal", "powerCap", "idle", "agentGap", "humanCordon"} <= kinds
    for plan in plans:
        major = [
            e for e in plan.episodes if e.kind in ("fatal", "straggler", "idle", "agentGap", "humanCordon")
        ]
        for a, b in itertools.pairwise(major):
            assert a.end <= b.start
    faults = {e.detail["fault"] for p in plans for e in p.episodes if e.kind == "fatal"}
    assert len(faults) >= 5


def test_the_agent_writes_on_a_significant_change_or_on_its_heartbeat(tmp_path: pathlib.Path) -> None:
    """As the agent does (its changes.fingerprint): clock jitter is no reason to write, a fault is."""
    path = tmp_path / "t.jsonl"
    tracegen.generate(tracegen.Options(node_days=3, seed=18, nodes=12), path)
    header, truth = traces.read_truth(path)
    assert header["generator"]["heartbeatSeconds"] == 300
    with traces.open_trace(path) as (_, records):
        writes: dict[str, list[float]] = {}
        for record in records:
            if record["kind"] == "gpunode":
                writes.setdefault(record["name"], []).append(record["t"])
    heartbeats = 3 / 12 * 86_400 / 300  # the trace's length over the heartbeat
    for times in writes.values():
        assert heartbeats * 0.8 < len(times) < heartbeats * 1.5, "about one write per heartbeat"
    fatal = next(t for t in truth if t["type"] == "fatal")
    node = writes[fatal["node"]]
    assert any(fatal["start"] <= t < fatal["start"] + 60 for t in node), "a fault is written within a sample"
    every = tmp_path / "every.jsonl"
    tracegen.generate(tracegen.Options(node_days=3, seed=18, nodes=12, heartbeat_seconds=0), every)
    with traces.open_trace(every) as (_, records):
        assert sum(r["kind"] == "gpunode" for r in records) > 4 * sum(len(t) for t in writes.values())


def healthy_gpu() -> dict[str, Any]:
    return {
        "index": 0,
        "ecc": {"correctedVolatile": 0, "uncorrectedVolatile": 0},
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "xids": [],
        "lost": False,
    }


@pytest.mark.parametrize("fault", tracegen.FATAL_FAULTS)
def test_every_fatal_fault_reads_as_the_agent_would_show_it_and_the_default_policy_drains_it(
    fault: str,
) -> None:
    """The truth calls these fatal: the facts a real GPU shows for them fire a default Drain rule."""
    policy = yaml.safe_load((ROOT / "examples" / "default-policy.yaml").read_text())
    draining = {r["condition"] for r in policy["spec"]["rules"] if r["action"] == "Drain"}
    gpu = healthy_gpu()
    assert not conditions.gpu_faults(cast(Any, gpu), xid_catalogue.default_critical())
    tracegen.apply_fault(gpu, tracegen.Episode("fatal", 0.0, 3600.0, {"fault": fault, "gpu": 0}), 60.0)
    fired = conditions.gpu_faults(cast(Any, gpu), xid_catalogue.default_critical())
    assert set(fired) & draining, f"{fault}: {fired}"


def test_an_ecc_xid_comes_with_the_uncorrectable_count_it_logs() -> None:
    for code in (48, 94, 95):
        gpu = healthy_gpu()
        tracegen.apply_fault(
            gpu, tracegen.Episode("fatal", 0.0, 60.0, {"fault": f"XID{code}", "gpu": 0}), 1.0
        )
        assert gpu["ecc"]["uncorrectedVolatile"] >= 1
        assert gpu["remappedRows"]["pending"] is (code != 48)


def test_a_node_with_a_row_remap_failure_or_a_lost_gpu_is_replaced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    # A row-remap failure, one other fatal fault, and an idle episode the replacement inherits, in 3
    # node-days (a search of seeds 1-10000 with `plan_fleet`; 2 node-days give no inherited episode).
    tracegen.generate(tracegen.Options(node_days=3, seed=3255, nodes=12), path)
    header, truth = traces.read_truth(path)
    [fault] = [t for t in truth if t["type"] == "fatal" and "replacedBy" in t]
    assert fault["fault"] in tracegen.REPLACED_FAULTS and header["generator"]["replaced"] == 1
    with traces.open_trace(path) as (_, records):
        seen = [r for r in records if r["kind"] in ("node", "gpunode")]
    old, new = fault["node"], fault["replacedBy"]
    gone = [(r["kind"], r["t"]) for r in seen if r.get("name") == old and r.get("deleted")]
    assert [k for k, _ in gone] == ["node", "gpunode"] and fault["end"] <= gone[0][1] < fault["end"] + 60
    assert not [r for r in seen if r.get("name") == old and r["t"] > gone[0][1]], "nothing after it left"
    joined = next(r for r in seen if r.get("object", {}).get("metadata", {}).get("name") == new)
    assert joined["t"] >= fault["end"] + tracegen.PROVISION_SECONDS
    models = {t["node"]: t["model"] for t in truth if t["type"] == "node"}
    assert models[new] == models[old]

    result = replayer.run(path, replayer.load_policy(POLICY))
    on_old = [a for a in result.actions if a.node == old and a.action in ("Cordon", "Drain", "Uncordon")]
    assert [a.action for a in on_old] == ["Drain"], "drained, then replaced: never uncordoned"
    assert not [a for a in result.actions if a.node == old and a.t > gone[0][1]]
    assert [a.action for a in result.actions if a.node == new] == ["Label health=healthy"]
    score = scoring.score(path, result)  # the baseline rule's reading of the trace too
    assert score["fatal"]["acted"] == score["fatal"]["faults"] and score["fatal"]["falseDisruptive"] == 0


def test_an_agent_gap_is_a_not_ready_agent_pod_and_the_replay_says_the_agent_is_stale(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "t.jsonl.gz"
    tracegen.generate(tracegen.Options(node_days=6, seed=4, nodes=12), path)  # two gaps of 8 minutes
    _, truth = traces.read_truth(path)
    gaps = [t for t in truth if t["type"] == "agentGap"]
    assert gaps
    with traces.open_trace(path) as (_, records):
        pods = [r for r in records if r["kind"] == "agentpod"]
    for name in {t["node"] for t in truth if t["type"] == "node"}:
        mine = [(r["t"], r["ready"]) for r in pods if r["node"] == name]
        assert mine[0][1] is True, "Ready from the node's first sample"
        assert all(a[1] != b[1] for a, b in itertools.pairwise(mine)), "written when readiness changes"
    for gap in gaps:
        [down] = [r for r in pods if r["node"] == gap["node"] and gap["start"] <= r["t"] < gap["end"]]
        assert down["ready"] is False and down["since"], down
        assert any(r["node"] == gap["node"] and r["ready"] and r["t"] >= gap["end"] for r in pods)

    result = replayer.run(path, replayer.load_policy(POLICY))
    long_gaps = {(g["node"], g["start"]) for g in gaps if g["end"] - g["start"] > 120}
    # Not the Normal "AgentStale cleared: ..." Event that says the agent is back (issue 45: both ways).
    stale = [e for e in result.events if e["reason"] == "AgentStale" and " cleared: " not in e["message"]]
    assert any(" cleared: " in e["message"] for e in result.events if e["reason"] == "AgentStale")
    assert long_gaps and len(stale) >= len(long_gaps), (long_gaps, stale)
    assert all("is not Ready since" in e["message"] for e in stale)
    during = [
        a
        for a in result.actions
        for g in gaps
        if a.node == g["node"] and g["start"] <= a.t <= g["end"] and a.action in ("Cordon", "Drain")
    ]
    assert during == [], "missing data is never a fault"


def test_creeping_counters_grow_slowly_on_most_nodes_and_trip_no_rule(tmp_path: pathlib.Path) -> None:
    # Issue 52: real fleets' AER correctable and NVLink CRC counters creep; each such report is a change a
    # verdict reads. The option adds that creep, below every rule's rate, and leaves the rest as the seed has.
    plain, creeping = tmp_path / "plain.jsonl", tmp_path / "creeping.jsonl"
    tracegen.generate(tracegen.Options(node_days=2, seed=5, nodes=12, sample_seconds=120), plain)
    options = tracegen.Options(node_days=2, seed=5, nodes=12, sample_seconds=120, creeping_counters=True)
    tracegen.generate(options, creeping)
    with traces.open_trace(creeping) as (header, records):
        assert header["generator"]["creepingCounters"] is True
        gpunodes: dict[str, list[dict[str, Any]]] = {}
        current: dict[str, dict[str, Any]] = {}
        for record in records:
            if record["kind"] != "gpunode" or record.get("deleted"):
                continue
            name = record["name"]
            status = record.get("status") or traces.apply_status_patch(current[name], record["patch"])
            current[name] = status
            gpunodes.setdefault(name, []).append(status)
    crept = []
    for name, statuses in gpunodes.items():
        aer = [
            sum(g.get("pcie", {}).get("aer", {}).get("correctable", 0) for g in s["gpus"]) for s in statuses
        ]
        assert aer == sorted(aer), f"{name}: a counter never goes down"
        if aer[-1] > aer[0]:
            crept.append(name)
    assert len(crept) >= 0.6 * len(gpunodes), (len(crept), len(gpunodes))
    with traces.open_trace(plain) as (_, plain_records):
        plain_truth = [r for r in plain_records if r["kind"] == "truth"]
    with traces.open_trace(creeping) as (_, creeping_records):
        assert [r for r in creeping_records if r["kind"] == "truth"] == plain_truth, "the same faults"
    result = replayer.run(creeping, replayer.load_policy(POLICY))
    reasons = {a.reason for a in result.actions}
    assert not any("NvLinkDegraded" in r or "PcieErrors" in r for r in reasons), reasons
