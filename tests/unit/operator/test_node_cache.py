"""What the operator keeps of a Node, and that an older watch event never overwrites a newer write."""

from gpuhealth_api import keys
from gpuhealth_operator import cache
from gpuhealth_operator.decisions import policies


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


def node(
    name: str, version: int, *, pool: str = "a", unschedulable: bool = False, by: str | None = None
) -> dict:
    annotations = {keys.CORDONED_BY_ANNOTATION: by} if by else {}
    return {
        "metadata": {
            "name": name,
            "resourceVersion": str(version),
            "labels": {"pool": pool},
            "annotations": annotations,
        },
        "spec": {"unschedulable": unschedulable},
    }


def test_a_policys_selection_follows_node_changes_without_a_fleet_pass() -> None:
    clusters = cache.ClusterCache()
    for i, pool in enumerate(["a", "a", "b"]):
        clusters.put_node(node(f"n{i}", 1, pool=pool))
    policy = policies.parse_policy("p", 1, {"nodeSelector": {"matchLabels": {"pool": "a"}}, "rules": []})
    clusters.put_policy(policy)
    selection = clusters.selection(policy)
    assert (selection.selected, selection.unavailable) == ({"n0", "n1"}, set())

    clusters.put_node(node("n0", 2, unschedulable=True))  # a human cordon counts too
    clusters.put_node(node("n1", 2, unschedulable=True, by="p"))
    clusters.put_node(node("n2", 2, pool="b", unschedulable=True))  # not selected: never counts
    assert selection.unavailable == {"n0", "n1"}
    clusters.put_node(node("n0", 1, pool="a"))  # an older event: ignored
    assert "n0" in selection.unavailable
    clusters.put_node(node("n0", 3, pool="b"))  # relabelled out of the policy
    clusters.remove_node("n1")
    assert (selection.selected, selection.unavailable) == (set(), set())

    changed = policies.parse_policy("p", 2, {"nodeSelector": {"matchLabels": {"pool": "b"}}, "rules": []})
    clusters.put_policy(changed)
    rebuilt = clusters.selection(changed)
    assert (rebuilt.selected, rebuilt.unavailable) == ({"n0", "n2"}, {"n2"})


def shared(labels: dict[str, str], capacity: str) -> dict:
    node = body("5")
    node["metadata"]["labels"] = labels
    node["status"]["capacity"] = {keys.GPU_RESOURCE: capacity}
    return node


def test_time_sliced_capacity_counts_physical_gpus_not_replicas() -> None:
    """8 GPUs shared 4 ways advertise nvidia.com/gpu: 32; that is 8 GPUs, not 24 lost ones."""
    record = cache.node_record(shared({"nvidia.com/gpu.replicas": "4"}, "32"))
    assert record.view.gpu_capacity == 8


def test_mig_capacity_is_not_a_gpu_count() -> None:
    """In MIG mode nvidia.com/gpu counts MIG devices (or is absent): it says nothing of lost GPUs."""
    record = cache.node_record(shared({"nvidia.com/mig.strategy": "single"}, "56"))
    assert record.view.gpu_capacity is None
