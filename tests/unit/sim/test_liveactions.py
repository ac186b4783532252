"""What the live operator did, read off a trace, and how it compares with a replay, per node."""

from gpuhealth_sim.backtest import liveactions, replayer


def act(t: float, what: str, node: str = "n1") -> replayer.Action:
    return replayer.Action(t, node, what, "")


def rule(index: int) -> dict:
    labels = {
        "gpuhealth.io/policy": "p",
        "gpuhealth.io/node": "n1",
        "gpuhealth.io/gpu-index": str(index),
    }
    return {"metadata": {"name": f"gpuhealth-n1-gpu-{index}", "labels": labels}, "spec": {}}


def test_the_policys_rules_in_a_trace_are_its_isolations_and_restorations() -> None:
    other = {
        "metadata": {"name": "x", "labels": {**rule(1)["metadata"]["labels"], "gpuhealth.io/policy": "q"}}
    }
    records = [
        {"kind": "devicetaintrule", "t": 5.0, "object": rule(3)},
        {"kind": "devicetaintrule", "t": 6.0, "object": rule(3)},  # a new version: no new isolation
        {"kind": "devicetaintrule", "t": 7.0, "object": other},
        {"kind": "devicetaintrule", "t": 9.0, "name": "gpuhealth-n1-gpu-3", "deleted": True},
    ]
    found = liveactions.from_trace(records, "p")
    assert [(a.t, a.node, a.action) for a in found] == [
        (5.0, "n1", "Isolate GPU 3"),
        (9.0, "n1", "Restore GPU 3"),
    ]


def test_an_isolation_and_the_health_label_of_one_pass_compare_in_either_order() -> None:
    live = [act(1, "Label health=unhealthy"), act(1.05, "Isolate GPU 3"), act(9, "Label health=healthy")]
    replayed = [act(1, "Isolate GPU 3"), act(1, "Label health=unhealthy"), act(9, "Label health=healthy")]
    assert liveactions.differences(live, replayed) == {}
    later = [act(1, "Label health=unhealthy"), act(30, "Isolate GPU 3"), act(40, "Label health=healthy")]
    assert liveactions.differences(later, replayed) != {}, "not one pass: the order stands"
    first = [act(1, "Label health=healthy"), act(1.2, "Isolate GPU 3")]
    assert liveactions.sequence(first)["n1"] == ["Label health=healthy", "Isolate GPU 3"]


def test_a_node_deleted_and_created_again_starts_afresh() -> None:
    def version(*, cordoned: bool) -> dict:
        annotations = {"gpuhealth.io/cordoned-by": "p"} if cordoned else {}
        return {"metadata": {"name": "n1", "annotations": annotations}, "spec": {"unschedulable": cordoned}}

    records = [
        {"kind": "node", "t": 1.0, "object": version(cordoned=False)},
        {"kind": "node", "t": 2.0, "object": version(cordoned=True)},
        {"kind": "node", "t": 3.0, "name": "n1", "deleted": True},
        {"kind": "node", "t": 4.0, "object": version(cordoned=False)},  # the replacement: never cordoned
    ]
    assert liveactions.sequence(liveactions.from_trace(records, "p")) == {"n1": ["Cordon"]}
