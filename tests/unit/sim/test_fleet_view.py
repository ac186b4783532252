"""The demo's view and summary: 80 columns, kubectl's columns, and times taken from the cluster."""

import datetime
import io

from gpuhealth_api import keys
from gpuhealth_sim.demo import live, record, summary, view

T0 = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


def stamp(at: float) -> str:
    return (
        datetime.datetime.fromtimestamp(at, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def gpunode(name: str, *, observed: float, health: str = "", issues: str = "", action: str = "") -> dict:
    status = {
        "summary": {"gpuCount": 8, "model": H100, "maxTemperatureCelsius": 47},
        "gpus": [
            {"index": 0, "observedTime": stamp(observed - 5)},
            {"index": 1, "observedTime": stamp(observed)},
        ],
    }
    status.update({k: v for k, v in {"health": health, "issues": issues, "action": action}.items() if v})
    return {"metadata": {"name": name, "creationTimestamp": stamp(T0 - 30)}, "status": status}


def node(
    name: str,
    *,
    cordoned: bool = False,
    labels: dict | None = None,
    annotations: dict | None = None,
    taints: list | None = None,
) -> dict:
    spec: dict = {"unschedulable": True} if cordoned else {}
    if taints:
        spec["taints"] = taints
    metadata = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    return {"metadata": metadata, "spec": spec}


def event(uid: str, reason: str, name: str, message: str, kind: str = "Node") -> dict:
    return {
        "metadata": {"uid": uid},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "involvedObject": {"kind": kind, "name": name},
    }


def test_the_table_fits_80_columns_with_kubectls_headers() -> None:
    rows = [
        record.Row(f"gpu-node-{i}", "8", H100, "Unhealthy", "XidCritical,GPULost", "Draining", "91", T0)
        for i in range(12)
    ]
    lines = view.table(rows, T0 + 75, width=80)
    assert lines[0].split() == list(view.HEADERS)
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("gpu-node-0 ") and "Draining" in lines[1] and "75s" in lines[1]
    wide = view.table(rows, T0 + 75, width=200)
    assert H100 in wide[1] and "XidCritical,GPULost" in wide[1]


def test_kubectl_style_ages() -> None:
    assert [view.age(T0, T0 + s) for s in (5, 200, 3000, 20_000, 400_000)] == [
        "5s",
        "3m20s",
        "50m",
        "5h",
        "4d",
    ]


def test_event_lines_are_shortened_to_the_width() -> None:
    line = record.EventLine(T0 + 17.25, "NodeCordoned", "gpu-node-3", "x" * 200, True)
    text = view.event_line(line, T0, width=80)
    assert text.startswith("+ 17.2s NodeCordoned") and len(text) == 80 and text.endswith(view.ELLIPSIS)


def test_record_and_summary_tell_what_was_detected_and_done_and_how_fast() -> None:
    seen = record.Record(started_at=T0)
    for i in (3, 5, 11):
        seen.on_node("ADDED", node(f"gpu-node-{i}", cordoned=i == 11), T0)
        seen.on_gpunode("ADDED", gpunode(f"gpu-node-{i}", observed=T0 + 1, health="Healthy"), T0 + 1.2)
    # ECC on gpu-node-3 read by the agent at +15.0, cordoned at +15.4, drained at +17.
    seen.on_gpunode("MODIFIED", gpunode("gpu-node-3", observed=T0 + 15, health="Healthy"), T0 + 15.1)
    seen.on_gpunode(
        "MODIFIED",
        gpunode(
            "gpu-node-3", observed=T0 + 15, health="Unhealthy", issues="EccUncorrectable", action="Draining"
        ),
        T0 + 15.3,
    )
    annotations = {keys.CORDONED_BY_ANNOTATION: "demo"}
    seen.on_node("MODIFIED", node("gpu-node-3", cordoned=True, annotations=annotations), T0 + 15.4)
    assert seen.on_event("ADDED", event("e1", "EccUncorrectable", "gpu-node-3", "GPU 3: DBE"), T0 + 15.4)
    assert seen.on_event("MODIFIED", event("e1", "EccUncorrectable", "gpu-node-3", "again"), T0 + 16) is None
    seen.on_event("ADDED", event("e2", "NodeDrained", "gpu-node-3", "evicted 1 pod"), T0 + 17)
    seen.on_event("ADDED", event("e3", "Scheduled", "gpu-node-3", "not ours"), T0 + 17)
    # Thermal on gpu-node-5: label set, then removed after cooling.
    seen.on_gpunode("MODIFIED", gpunode("gpu-node-5", observed=T0 + 10, health="Degraded"), T0 + 10.2)
    seen.on_node("MODIFIED", node("gpu-node-5", labels={keys.THERMAL_LABEL: "true"}), T0 + 15.5)
    seen.on_gpunode("MODIFIED", gpunode("gpu-node-5", observed=T0 + 45, health="Healthy"), T0 + 45.1)
    seen.on_node("MODIFIED", node("gpu-node-5"), T0 + 61)

    result = summary.build(seen, T0 + 80, human_cordoned={"gpu-node-11"})
    ecc = result.node("gpu-node-3")
    assert ecc.detected == ("EccUncorrectable",)
    assert [a.what for a in ecc.actions] == ["cordoned", "drained"]
    assert abs(ecc.actions[0].detection_to_action_seconds - 0.4) < 1e-6
    assert ecc.actions[0].detail == "by policy demo"
    assert ecc.unschedulable and ecc.cordoned_by == "demo"
    thermal = result.node("gpu-node-5")
    assert [(a.what, round(a.detection_to_action_seconds, 1)) for a in thermal.actions] == [
        ("thermal-throttled set", 5.5),
        ("thermal-throttled removed", 16.0),
    ]
    human = result.node("gpu-node-11")
    assert human.human_cordoned and human.unschedulable and human.cordoned_by is None and not human.actions
    lines = summary.render(result)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "gpu-node-11: cordoned by a human: still cordoned, no gpu-health annotation" in text
    assert "cordoned" in text and "0.40s" in text
    as_json = result.to_json()
    assert as_json["nodes"]["gpu-node-3"]["actions"][1]["what"] == "drained"


def test_a_taint_rule_shows_in_the_summary_as_an_action_on_the_node() -> None:
    seen = record.Record(started_at=T0)
    seen.on_node("ADDED", node("gpu-node-5"), T0)
    seen.on_gpunode("MODIFIED", gpunode("gpu-node-5", observed=T0 + 4, health="Degraded"), T0 + 4.1)
    ours = {"key": keys.UNHEALTHY_TAINT, "value": "PowerThrottled", "effect": "NoSchedule"}
    seen.on_node("MODIFIED", node("gpu-node-5", taints=[ours]), T0 + 7)
    seen.on_node("MODIFIED", node("gpu-node-5", taints=[ours, {"key": "x", "effect": "NoSchedule"}]), T0 + 8)
    seen.on_node("MODIFIED", node("gpu-node-5"), T0 + 30)

    tainted = summary.build(seen, T0 + 40).node("gpu-node-5")
    assert [(a.what, a.at_seconds) for a in tainted.actions] == [
        ("taint unhealthy set", 7.0),
        ("taint unhealthy removed", 30.0),
    ]


def test_plain_progress_prints_each_new_thing_once() -> None:
    seen = record.Record(started_at=T0)
    out = io.StringIO()
    shown = live.Live(seen, out, tty=False, width=80)
    seen.on_node("ADDED", node("gpu-node-1"), T0)
    seen.on_node("MODIFIED", node("gpu-node-1", labels={keys.STRAGGLER_LABEL: "true"}), T0 + 20)
    seen.on_event("ADDED", event("e1", "Straggler", "gpu-node-1", "score far below peers"), T0 + 20.1)
    shown.refresh("", "")
    shown.refresh("", "")
    lines = out.getvalue().splitlines()
    assert lines == [
        "+ 20.0s gpu-node-1: straggler set",
        "+ 20.1s Straggler          gpu-node-1   score far below peers",
    ]


def test_a_terminal_gets_the_screen_redrawn_in_place() -> None:
    seen = record.Record(started_at=T0)
    seen.on_gpunode("ADDED", gpunode("gpu-node-1", observed=T0 + 1, health="Healthy"), T0 + 1)
    out = io.StringIO()
    shown = live.Live(seen, out, tty=True, width=80)
    shown.refresh("title", "t=1s")
    shown.refresh("title", "t=2s")
    first, second = out.getvalue().split(live.CLEAR_BELOW)[:2]
    assert first.startswith(live.CLEAR_SCREEN + live.HOME) and second.startswith(live.HOME)
    lines = [line.removesuffix(live.CLEAR_LINE) for line in second.removeprefix(live.HOME).splitlines()]
    assert lines[:4] == ["title", "t=2s", "", "$ kubectl get gpunodes"]
    assert lines[4].split() == list(view.HEADERS)
    assert lines[5].startswith("gpu-node-1") and all(len(line) <= 80 for line in lines)


def test_a_verdict_before_the_agents_first_report_is_not_a_detection() -> None:
    seen = record.Record(started_at=T0)
    empty = {"metadata": {"name": "gpu-node-1"}, "status": {"health": "Unknown", "issues": "AgentStale"}}
    seen.on_gpunode("ADDED", empty, T0 + 0.5)
    seen.on_gpunode("MODIFIED", gpunode("gpu-node-1", observed=T0 + 1, health="Healthy"), T0 + 1)
    out = io.StringIO()
    live.Live(seen, out, tty=False).refresh("", "")
    assert out.getvalue() == ""
    assert summary.build(seen, T0 + 10).nodes == ()


def test_a_passing_agent_stale_verdict_is_one_line_in_the_summary() -> None:
    seen = record.Record(started_at=T0)
    for name in ("gpu-node-1", "gpu-node-2"):
        seen.on_gpunode("ADDED", gpunode(name, observed=T0, health="Unknown", issues="AgentStale"), T0 + 0.5)
        seen.on_gpunode("MODIFIED", gpunode(name, observed=T0, health="Healthy"), T0 + 1)
    straggling = gpunode("gpu-node-2", observed=T0, health="Degraded", issues="Straggler", action="Labeled")
    seen.on_gpunode("MODIFIED", straggling, T0 + 20)
    lines = summary.render(summary.build(seen, T0 + 30))
    assert "briefly Unknown (AgentStale), no action: gpu-node-1, gpu-node-2" in lines
    assert not any(line.startswith("gpu-node-1:") for line in lines)
    assert "gpu-node-2: Straggler  →  now Degraded, Labeled" in lines


def test_the_summary_counts_gpu_hours_isolation_kept_in_service() -> None:
    seen = record.Record(started_at=T0)
    seen.on_gpunode("ADDED", gpunode("gpu-node-12", observed=T0), T0)
    seen.on_node("ADDED", node("gpu-node-12"), T0)
    message = (
        "GPU 3 (GPU-abc) isolated by policy demo (EccUncorrectable): DeviceTaintRule r taints device gpu-3"
    )
    seen.on_event("ADDED", event("e1", "GPUIsolated", "gpu-node-12", message), T0 + 15)

    result = summary.build(seen, T0 + 15 + 3600, gpus={"gpu-node-12": 8})
    (isolated,) = result.isolations
    assert (isolated.node, isolated.gpus, isolated.isolated) == ("gpu-node-12", 8, 1)
    assert abs(isolated.kept_gpu_hours - 7.0) < 1e-9, "7 GPUs kept serving for an hour"
    assert [(a.what, a.detail) for a in result.node("gpu-node-12").actions] == [("GPU isolated", "GPU 3")]
    lines = summary.render(result)
    assert all(len(line) <= 80 for line in lines)
    assert "gpu-node-12: 7 of 8 GPUs kept in service (IsolateGPU)" in lines
    assert "  7.000 GPU-hours saved against a whole-node drain (7 per hour)" in lines
    assert result.to_json()["isolations"][0]["gpuHoursSavedVsDrain"] == 7.0
