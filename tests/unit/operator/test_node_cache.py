"""What the operator keeps of a Node, and that an older watch event never overwrites a newer write."""

from gpuhealth_api import keys
from gpuhealth_operator import cache


def body(resource_version: str, **spec: object) -> dict:
    return {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": resource_version,
            "labels": {"a": "b"},
            "annotations": {keys.CORDONED_BY_ANNOTATION: "p", "unrelated/annotation": "x" * 1000},
        },
        "spec": dict(spec),
        "status": {
            "capacity": {keys.GPU_RESOURCE: "8"},
            "conditions": [
                {"type": keys.NODE_CONDITION_TYPE, "status": "False", "reason": "EccUncorrectable"}
            ],
        },
    }


def test_record_keeps_what_decisions_need_and_drops_the_rest() -> None:
    record = cache.node_record(body("5", unschedulable=True, taints=[{"key": "k", "effect": "NoSchedule"}]))
    assert record.view.cordoned_by == "p"
    assert record.view.unschedulable
    assert record.view.gpu_capacity == 8
    assert record.view.taint_keys == frozenset({"k"})
    assert "unrelated/annotation" not in record.view.annotations
    assert record.condition is not None
    assert record.condition.reason == "EccUncorrectable"


def test_older_resource_version_does_not_replace_newer() -> None:
    nodes = cache.ClusterCache()
    nodes.put_node(body("10", unschedulable=True))
    nodes.put_node(body("9"))
    assert nodes.nodes["n1"].view.unschedulable
    nodes.put_node(body("11"))
    assert not nodes.nodes["n1"].view.unschedulable
