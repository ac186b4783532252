"""What the operator keeps of a Node, and that an older watch event never overwrites a newer write."""

import datetime

from gpuhealth_api import keys
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.state import cache

NOW = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)


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


def gpunode(name: str, version: int = 1) -> dict:
    return {"metadata": {"name": name, "resourceVersion": str(version)}, "status": {}}


def test_a_policys_selection_follows_node_changes_without_a_fleet_pass() -> None:
    clusters = cache.ClusterCache()
    for i, pool in enumerate(["a", "a", "b"]):
        clusters.put_node(node(f"n{i}", 1, pool=pool))
        clusters.put_gpunode(gpunode(f"n{i}"), NOW)
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


def test_a_policys_selection_holds_the_nodes_with_an_agent_and_follows_gpunodes() -> None:
    """Budgets count GPU nodes: a Node the selector matches but no agent reports on is not selected."""
    clusters = cache.ClusterCache()
    clusters.put_node(node("cpu", 1, unschedulable=True))
    clusters.put_node(node("gpu", 1))
    clusters.put_gpunode(gpunode("gpu"), NOW)
    everything = policies.parse_policy("all", 1, {"rules": []})  # an empty selector: every node with an agent
    clusters.put_policy(everything)
    selection = clusters.selection(everything)
    assert (selection.selected, selection.unavailable) == ({"gpu"}, set())

    clusters.put_gpunode(gpunode("cpu"), NOW)  # an agent starts on the cordoned node: it counts now
    assert (selection.selected, selection.unavailable) == ({"gpu", "cpu"}, {"cpu"})
    clusters.put_gpunode(gpunode("cpu", 2), NOW)  # a status update changes nothing
    assert (selection.selected, selection.unavailable) == ({"gpu", "cpu"}, {"cpu"})
    clusters.remove_gpunode("cpu")  # and its GPUNode goes away again
    assert (selection.selected, selection.unavailable) == ({"gpu"}, set())
    clusters.put_gpunode(gpunode("ghost"), NOW)  # a GPUNode whose Node is not (yet) seen selects nothing
    assert selection.selected == {"gpu"}
    clusters.put_node(node("ghost", 1))
    assert selection.selected == {"gpu", "ghost"}


def test_the_gpunodes_listing_isolated_gpus_follow_every_write_and_deletion() -> None:
    def gpunode(name: str, version: str, isolated: list[dict]) -> dict:
        status: dict = {"gpus": [{"index": 0}]}
        if isolated:
            status["isolatedGPUs"] = isolated
        return {"metadata": {"name": name, "uid": name, "resourceVersion": version}, "status": status}

    clustered = cache.ClusterCache()
    clustered.put_gpunode(gpunode("a", "1", []), NOW)
    clustered.put_gpunode(gpunode("b", "2", [{"index": 0, "policy": "p"}]), NOW)
    assert set(clustered.listing_isolated) == {"b"}
    clustered.put_gpunode(gpunode("a", "3", [{"index": 0, "policy": "p"}]), NOW)
    clustered.put_gpunode(gpunode("b", "1", []), NOW)  # an older event changes nothing
    assert set(clustered.listing_isolated) == {"a", "b"}
    clustered.put_gpunode(gpunode("b", "4", []), NOW)  # restored
    clustered.remove_gpunode("a")
    assert not clustered.listing_isolated


def test_the_gpunodes_with_a_check_request_follow_every_write_and_deletion() -> None:
    """`check_requests.take` visits these each timer pass, not every GPUNode of the fleet."""

    def gpunode(name: str, version: str, requested: bool) -> dict:
        annotations = {keys.CHECK_NOW_ANNOTATION: '{"id": "t"}'} if requested else {}
        return {"metadata": {"name": name, "resourceVersion": version, "annotations": annotations}}

    clustered = cache.ClusterCache()
    for name in ("a", "b", "c"):
        clustered.put_gpunode(gpunode(name, "2", name == "b"), NOW)
    assert set(clustered.check_requested) == {"b"}
    clustered.put_gpunode(gpunode("a", "3", True), NOW)
    clustered.put_gpunode(gpunode("b", "1", False), NOW)  # an older event changes nothing
    assert set(clustered.check_requested) == {"a", "b"}
    clustered.refresh_gpunode(gpunode("b", "4", False), NOW)  # our removal of the request, answered
    clustered.remove_gpunode("a")
    assert not clustered.check_requested
