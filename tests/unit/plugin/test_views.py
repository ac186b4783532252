"""What `kubectl gpuhealth status` and `why` show, from cluster objects as `kubectl get -o json` has them."""

import datetime
import json
from typing import Any

from gpuhealth_api import keys
from gpuhealth_kubectl import views

NOW = datetime.datetime(2026, 11, 26, 12, 0, 0, tzinfo=datetime.UTC)
SELECTOR = {"matchLabels": {"pool": "a"}}


def t(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str, *, unschedulable: bool = False, labels: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"pool": "a", **(labels or {})},
            "annotations": dict(annotations),
        },
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {},
    }


def gpunode(
    name: str, health: str = "Healthy", issues: str = "", action: str = "None", **extra: Any
) -> dict[str, Any]:
    status = {
        "health": health,
        "issues": issues,
        "action": action,
        "agent": {"version": "0.1.0", "backend": "sim", "lastHeartbeatTime": t(5)},
        **extra,
    }
    return {"metadata": {"name": name}, "status": status}


def policy(
    name: str, *, dry_run: bool = False, paused: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True", "reason": "Accepted", "message": "acting"}]
    if paused:
        conditions.append({"type": "Paused", "lastTransitionTime": t(120), **paused})
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "nodeSelector": SELECTOR,
            "dryRun": dry_run,
            "maxUnavailable": 1,
            "rules": [
                {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
                {"name": "ecc-label", "condition": "EccUncorrectable", "action": "Label"},
                {"name": "hot", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 600},
            ],
            **spec,
        },
        "status": {
            "selectedNodes": 2,
            "unhealthyNodes": 1,
            "cordonedNodes": 1,
            "pendingNodes": 0,
            "conditions": conditions,
        },
    }


ECC_CONDITION = {
    "type": "EccUncorrectable",
    "status": "True",
    "reason": "EccUncorrectable",
    "message": "GPU 3: 1 uncorrected ECC error",
    "lastTransitionTime": t(90),
}
HOT_CONDITION = {
    "type": "ThermalThrottled",
    "status": "True",
    "message": "GPU 1 thermally throttled",
    "lastTransitionTime": t(60),
    "observedSince": t(60),
}


def drained_node() -> tuple[dict[str, Any], dict[str, Any]]:
    bad_gpu = {"index": 3, "uuid": "GPU-3", "ecc": {"uncorrectedVolatile": 1}, "temperatureCelsius": 40}
    good_gpu = {"index": 0, "uuid": "GPU-0", "ecc": {"uncorrectedVolatile": 0}, "temperatureCelsius": 40}
    return (
        node(
            "n1",
            unschedulable=True,
            labels={keys.HEALTH_LABEL: "unhealthy"},
            **{keys.CORDONED_BY_ANNOTATION: "p", "gpuhealth.io/cordoned-at": t(80)},
        ),
        gpunode(
            "n1",
            "Unhealthy",
            "EccUncorrectable,ThermalThrottled",
            "Drained",
            gpus=[good_gpu, bad_gpu],
            conditions=[ECC_CONDITION, HOT_CONDITION, {"type": "GPULost", "status": "False"}],
        ),
    )


EVENTS = [
    {
        "reason": "NodeDrained",
        "type": "Normal",
        "message": "drained",
        "lastTimestamp": t(30),
        "involvedObject": {"kind": "Node", "name": "n1"},
    },
    {
        "reason": "EccUncorrectable",
        "type": "Warning",
        "message": "GPU 3: 1 uncorrected ECC error",
        "lastTimestamp": t(90),
        "count": 2,
        "involvedObject": {"kind": "Node", "name": "n1"},
    },
]


def test_why_walks_from_the_fact_to_the_rule_that_fired_and_its_events() -> None:
    n, g = drained_node()
    report = views.why_report("n1", n, g, policy_bodies=[policy("p")], events=EVENTS, now=NOW)
    text = views.render_why(report, NOW)

    assert report["facts"] == [{"index": 3, "uuid": "GPU-3", "facts": ["ecc.uncorrectedVolatile=1"]}]
    assert [c["type"] for c in report["conditions"]] == ["EccUncorrectable", "ThermalThrottled", "GPULost"]
    (verdict,) = report["policies"]
    assert verdict["wins"]["rule"] == "ecc" and verdict["wins"]["action"] == "Drain"
    assert [r["rule"] for r in verdict["fired"]] == ["ecc", "ecc-label"]  # strongest action first
    assert verdict["waiting"] == [
        {
            "rule": "hot",
            "condition": "ThermalThrottled",
            "action": "Label",
            "forSeconds": 600.0,
            "firesInSeconds": 540,
        }
    ]
    assert [e["reason"] for e in report["events"]] == ["EccUncorrectable", "NodeDrained"]  # oldest first
    assert report["cordonedBy"] == "p"

    assert "n1: Unhealthy (EccUncorrectable,ThermalThrottled), action Drained" in text
    assert "cordoned (unschedulable) by policy p 1m ago" in text
    assert "GPU 3 GPU-3: ecc.uncorrectedVolatile=1" in text
    assert "EccUncorrectable=True for 1m: GPU 3: 1 uncorrected ECC error" in text
    assert "rule ecc: EccUncorrectable -> Drain fired  <- wins" in text
    assert "rule hot: ThermalThrottled -> Label fires in 540s (forSeconds)" in text
    assert "Warning EccUncorrectable (x2): GPU 3: 1 uncorrected ECC error" in text
    assert "(1 other conditions False)" in text
    json.dumps(report)  # -o json


def test_why_names_each_selecting_policy_by_its_own_verdict_and_skips_the_others() -> None:
    n, g = drained_node()
    g["status"]["policies"] = [
        {
            "policy": "p",
            "dryRun": False,
            "health": "Unhealthy",
            "issues": "EccUncorrectable",
            "action": "Drained",
        },
        {
            "policy": "q",
            "dryRun": True,
            "health": "Unhealthy",
            "issues": "EccUncorrectable",
            "action": "DryRun",
        },
    ]
    other = policy("other", nodeSelector={"matchLabels": {"pool": "b"}})
    report = views.why_report(
        "n1", n, g, policy_bodies=[policy("q", dry_run=True), other, policy("p")], events=[], now=NOW
    )
    assert [p["policy"] for p in report["policies"]] == ["p", "q"]
    assert report["policies"][1]["verdict"]["action"] == "DryRun"
    text = views.render_why(report, NOW)
    assert (
        "policy q (dryRun: decides and says, changes nothing): Unhealthy (EccUncorrectable), action DryRun"
        in text
    )
    assert "none (Events expire" in text


def test_why_on_an_excluded_node_a_node_without_gpunode_and_an_invalid_policy() -> None:
    n = node("n2", labels={keys.EXCLUDE_LABEL: "true"})
    report = views.why_report("n2", n, None, policy_bodies=[policy("p")], events=[], now=NOW)
    assert report["policies"] == []  # excluded: no policy selects it
    text = views.render_why(report, NOW)
    assert "no GPUNode" in text and "excluded" in text and "no policy selects this node" in text

    bad = policy("bad")
    bad["spec"]["rules"] = [{"name": "x", "condition": "Nope", "action": "Drain"}]
    report = views.why_report("n1", node("n1"), gpunode("n1"), policy_bodies=[bad], events=[], now=NOW)
    assert report["policies"][0]["policy"] == "bad" and "error" in report["policies"][0]
    assert "invalid, not acting" in views.render_why(report, NOW)


def test_why_shows_a_drill_and_a_human_cordon() -> None:
    n = node("n1", unschedulable=True)
    g = gpunode("n1", action="Drill")
    g["metadata"]["annotations"] = {
        keys.DRILL_ANNOTATION: "EccUncorrectable",
        keys.DRILL_STARTED_ANNOTATION: t(30),
    }
    text = views.render_why(views.why_report("n1", n, g, policy_bodies=[], events=[], now=NOW), NOW)
    assert "drill running: EccUncorrectable (ttl 10m, started 30s ago)" in text
    assert "by someone else (no gpuhealth.io/cordoned-by)" in text


def test_status_counts_health_budget_and_breaker_per_policy() -> None:
    n1, g1 = drained_node()
    nodes = [n1, node("n2"), node("n3", labels={"pool": "b"})]
    gpunodes = [g1, gpunode("n2"), gpunode("n3")]
    paused = {"status": "True", "reason": "FaultStorm", "message": "3 selected GPU nodes turned Unhealthy"}
    report = views.status_report(
        [policy("p", paused=paused), policy("q", dry_run=True)], gpunodes, nodes, NOW
    )

    p, q = report["policies"]
    assert p["health"] == {"Healthy": 1, "Unhealthy": 1}
    assert p["budget"] == {"maxUnavailable": 1, "allowed": 1, "unavailable": 1}
    assert p["breaker"]["state"] == "Open"
    assert q["breaker"]["state"] == "None" and q["dryRun"] is True
    assert [n["node"] for n in report["nodes"]] == ["n1"]
    assert "repairs" not in report and "degradedDomains" not in report  # not there yet: not shown

    text = views.render_status(report)
    assert "GPU nodes: 3 (2 Healthy, 1 Unhealthy)" in text
    assert "1/1 unschedulable" in text
    assert "breaker of p is Open: 3 selected GPU nodes turned Unhealthy" in text
    assert "resume: kubectl gpuhealth resume p" in text
    assert "n1    Unhealthy  EccUncorrectable,ThermalThrottled  Drained" in text
    json.dumps(report)


def test_status_shows_repairs_and_degraded_domains_only_when_present() -> None:
    nodes = [
        node("n1", labels={keys.DOMAIN_DEGRADED_LABEL: "true", "rack": "r1"}),
        node("n2", labels={keys.NEEDS_REPAIR_LABEL: "manual"}),
    ]
    g1 = gpunode(
        "n1",
        "Unhealthy",
        "EccUncorrectable",
        "Repairing",
        repairs=[{"cycle": 1, "step": "reset", "result": "Started"}],
    )
    topology = {"domains": [{"key": "rack", "unhealthy": 1, "action": "Label"}]}
    report = views.status_report([policy("p", topology=topology)], [g1, gpunode("n2")], nodes, NOW)
    assert report["repairs"] == [
        {
            "node": "n1",
            "action": "Repairing",
            "cycles": 1,
            "last": {"cycle": 1, "step": "reset", "result": "Started"},
        },
        {"node": "n2", "action": "None", "cycles": 0, "needsRepair": "manual"},
    ]
    assert report["degradedDomains"] == [{"key": "rack", "value": "r1", "nodes": ["n1"]}]
    text = views.render_status(report)
    assert "Degraded rack=r1: n1" in text and "reset Started" in text


def test_status_of_an_empty_cluster_and_an_invalid_policy() -> None:
    text = views.render_status(views.status_report([], [], [], NOW))
    assert "No GPUHealthPolicy" in text and "GPU nodes: 0 (none reported)" in text
    bad = policy("bad", maxUnavailable="lots")
    bad["status"]["conditions"][0] = {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "x",
    }
    text = views.render_status(views.status_report([bad], [], [], NOW))
    assert "invalid (InvalidSpec)" in text and "policy bad is invalid" in text


def test_gpu_facts_name_every_kind_of_fatal_evidence() -> None:
    gpu = {
        "index": 1,
        "uuid": "GPU-1",
        "lost": True,
        "remappedRows": {"failure": True},
        "xids": [{"code": 79, "count": 2, "lastSeen": "2026-11-26T11:59:00Z"}],
        "recoveryAction": "GpuReset",
        "clockEventReasons": ["GpuIdle", "HwThermalSlowdown"],
        "temperatureCelsius": 95,
        "slowdownTemperatureCelsius": 90,
        "pcie": {"generation": 3, "maxGeneration": 5, "width": 16, "maxWidth": 16},
    }
    (found,) = views.gpu_facts({"status": {"gpus": [gpu]}})
    assert found["facts"] == [
        "lost (fell off the bus)",
        "remappedRows.failure=True",
        "xid 79 x2 (last 2026-11-26T11:59:00Z)",
        "recoveryAction=GpuReset",
        "clockEventReasons=HwThermalSlowdown",
        "temperature 95C >= slowdown 90C",
        "pcie.generation=3 < 5",
    ]


def test_age_reads_rfc3339_and_tolerates_garbage() -> None:
    assert views.age(t(42), NOW) == "42s"
    assert views.age(t(7200), NOW) == "2h"
    assert views.age("yesterday", NOW) == "-"
    assert views.age(None, NOW) == "-"


def test_why_lists_every_verdict_in_status_policies_with_its_issues() -> None:
    """Each selecting policy's own verdict, issues included, and one the plugin cannot match to a
    listed policy (deleted since, or selecting by labels the Node no longer has) is still shown."""
    n, g = drained_node()
    g["status"]["policies"] = [
        {
            "policy": "gone",
            "dryRun": False,
            "health": "Degraded",
            "issues": "PcieDegraded",
            "action": "Labeled",
        },
        {
            "policy": "p",
            "dryRun": False,
            "health": "Unhealthy",
            "issues": "EccUncorrectable",
            "action": "Drained",
        },
        {
            "policy": "q",
            "dryRun": True,
            "health": "Unhealthy",
            "issues": "EccUncorrectable",
            "action": "DryRun",
        },
    ]
    report = views.why_report(
        "n1", n, g, policy_bodies=[policy("q", dry_run=True), policy("p")], events=[], now=NOW
    )
    assert [p["policy"] for p in report["policies"]] == ["gone", "p", "q"]
    gone = report["policies"][0]
    assert gone["verdict"] == g["status"]["policies"][0] and gone["listed"] is False
    text = views.render_why(report, NOW)
    assert "policy p: Unhealthy (EccUncorrectable), action Drained" in text
    assert (
        "policy q (dryRun: decides and says, changes nothing): Unhealthy (EccUncorrectable), action DryRun"
        in text
    )
    assert "policy gone: Degraded (PcieDegraded), action Labeled" in text
    assert "not among the policies listed" in text
    json.dumps(report)


def test_status_does_not_count_another_policys_verdict_for_a_policy_status_policies_lacks() -> None:
    """status.policies present without q (q began selecting the node since the operator last wrote):
    q has no verdict there yet; the reported one is p's, not q's."""
    n1, g1 = drained_node()
    g1["status"]["policies"] = [
        {
            "policy": "p",
            "dryRun": False,
            "health": "Unhealthy",
            "issues": "EccUncorrectable",
            "action": "Drained",
        },
        {"policy": "r", "dryRun": False, "health": "Healthy", "issues": "", "action": "None"},
    ]
    report = views.status_report([policy("p"), policy("q")], [g1, gpunode("n2")], [n1, node("n2")], NOW)
    p, q = report["policies"]
    assert p["health"] == {"Healthy": 1, "Unhealthy": 1}
    assert q["health"] == {"Healthy": 1, "Unknown": 1}


# --- issue 45: repairs shown as cycles, readable history, the fault a node was retired for ---------------

ONE_CYCLE = [
    {
        "time": t(400),
        "cycle": 3,
        "step": "reset",
        "action": "ResetGPU",
        "gpus": ["GPU-a"],
        "result": "Started",
        "message": "Job gpu-health/j created",
        "fault": "EccUncorrectable",
    },
    {
        "time": t(300),
        "cycle": 3,
        "step": "reset",
        "action": "ResetGPU",
        "gpus": ["GPU-a"],
        "result": "NoEffect",
        "message": "the Job succeeded but the agent still reports the fault",
    },
    {
        "time": t(300),
        "cycle": 3,
        "step": "reboot",
        "action": "RebootNode",
        "gpus": ["GPU-a"],
        "result": "Started",
        "message": "Job gpu-health/k created",
        "fault": "EccUncorrectable",
    },
    {
        "time": t(200),
        "cycle": 3,
        "step": "reboot",
        "action": "RebootNode",
        "gpus": ["GPU-a"],
        "result": "Succeeded",
        "message": "the node rebooted",
    },
    {
        "time": t(200),
        "cycle": 3,
        "step": "reboot",
        "action": "Validation",
        "gpus": ["GPU-a"],
        "result": "Started",
        "message": "Job gpu-health/v created",
    },
    {
        "time": t(100),
        "cycle": 3,
        "step": "reboot",
        "action": "Validation",
        "gpus": ["GPU-a"],
        "result": "ValidationFailed",
        "message": "validation Job v failed",
    },
    {
        "time": t(100),
        "cycle": 3,
        "step": "",
        "action": "",
        "gpus": ["GPU-a"],
        "result": "Retired",
        "message": "validation after step reboot failed and no step is left",
        "fault": "EccUncorrectable",
    },
]


def test_status_counts_repair_cycles_not_history_entries() -> None:
    nodes = [node("n1", unschedulable=True, labels={keys.NEEDS_REPAIR_LABEL: "manual"})]
    report = views.status_report(
        [policy("p")], [gpunode("n1", action="Retired", repairs=ONE_CYCLE)], nodes, NOW
    )
    (row,) = report["repairs"]
    assert row["cycles"] == 1, row
    text = views.render_status(report)
    assert "CYCLES" in text and "ATTEMPTS" not in text
    (line,) = [x for x in text.split("REPAIR NODE")[1].splitlines()[1:] if x.startswith("n1")]
    assert line.split()[:4] == ["n1", "Retired", "1", "EccUncorrectable"], line


def test_a_retired_node_shows_the_fault_that_began_its_cycle() -> None:
    nodes = [node("n1", unschedulable=True, labels={keys.NEEDS_REPAIR_LABEL: "manual"})]
    report = views.status_report(
        [policy("p")], [gpunode("n1", action="Retired", repairs=ONE_CYCLE)], nodes, NOW
    )
    (row,) = report["nodes"]
    assert row["retiredFor"] == "EccUncorrectable"
    text = views.render_status(report)
    assert "Healthy  retired for EccUncorrectable  Retired" in text, text
    why = views.why_report(
        "n1",
        nodes[0],
        gpunode("n1", action="Retired", repairs=ONE_CYCLE),
        policy_bodies=[policy("p")],
        events=[],
        now=NOW,
    )
    shown = views.render_why(why, NOW)
    assert "action Retired (retired for EccUncorrectable in repair cycle 3)" in shown, shown


def test_why_renders_the_repair_history_as_lines_not_a_python_repr() -> None:
    why = views.why_report(
        "n1",
        node("n1"),
        gpunode("n1", action="Retired", repairs=ONE_CYCLE),
        policy_bodies=[policy("p")],
        events=[],
        now=NOW,
    )
    shown = views.render_why(why, NOW)
    section = shown.split("Repairs (oldest first):")[1].split("Events")[0]
    assert "{" not in section and "['" not in section and "=" not in section, section
    assert "cycle 3" in section
    assert (
        "reset (ResetGPU) NoEffect on GPU-a: the Job succeeded but the agent still reports the fault"
        in section
    )
    assert "Retired: validation after step reboot failed and no step is left" in section
    assert json.dumps(why)


def test_json_gives_timestamps_and_lists_and_the_table_stays_human() -> None:
    """`-o json` is data for scripts: RFC 3339 times (never "5s" ages) and lists (never comma-joined
    strings); the table keeps ages and the comma-joined words."""
    n1, g1 = drained_node()
    report = views.status_report([policy("p")], [g1, gpunode("n2")], [n1, node("n2")], NOW)
    (row,) = report["nodes"]
    assert row["issues"] == ["EccUncorrectable", "ThermalThrottled"]
    assert row["lastHeartbeatTime"] == t(5) and "heartbeat" not in row
    text = views.render_status(report, NOW)
    assert "EccUncorrectable,ThermalThrottled  Drained  5s" in text

    why = views.why_report("n1", n1, g1, policy_bodies=[policy("p")], events=[], now=NOW)
    assert why["issues"] == ["EccUncorrectable", "ThermalThrottled"]
    assert why["policies"][0]["verdict"]["issues"] == ["EccUncorrectable", "ThermalThrottled"]
    assert "n1: Unhealthy (EccUncorrectable,ThermalThrottled), action Drained" in views.render_why(why, NOW)
    healthy = views.why_report("n2", node("n2"), gpunode("n2"), policy_bodies=[], events=[], now=NOW)
    assert healthy["issues"] == []
    dumped = json.dumps([report, why])
    assert '"5s"' not in dumped and '"2m"' not in dumped
