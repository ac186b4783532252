"""Issue 51: the index of GPU pods by node the active checks read (`state/gpu_pods.py`): watch events in,
the busy nodes out; a LIST replaces what was known; nothing reads as idle before the first LIST is in."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuhealth_api import keys
from gpuhealth_operator.state import gpu_pods

T0 = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
LATER = T0 + datetime.timedelta(seconds=5)


def pod(
    name: str,
    node: str | None = "n1",
    *,
    gpus: str | None = "1",
    nominated: str | None = None,
    labels: dict[str, str] | None = None,
    claims: bool = False,
) -> dict[str, Any]:
    resources = {"limits": {keys.GPU_RESOURCE: gpus}} if gpus is not None else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if node is not None:
        spec["nodeName"] = node
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "x"}]
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "labels": labels or {}},
        "spec": spec,
        "status": {"phase": "Running"},
    }
    if nominated is not None:
        body["status"]["nominatedNodeName"] = nominated
    return body


def synced(*pods: dict[str, Any]) -> gpu_pods.GpuPods:
    index = gpu_pods.GpuPods()
    index.listing()
    for body in pods:
        index.observe(None, body, T0)
    index.listed(T0)
    return index


@pytest.mark.parametrize(
    ("body", "uses"),
    [
        (pod("limit"), True),
        (pod("none", gpus=None), False),
        (pod("zero", gpus="0"), False),
        (pod("dra", gpus=None, claims=True), True),
        (pod("check", labels={keys.CHECK_LABEL: "quick"}), False),
        (
            {"spec": {"initContainers": [{"resources": {"requests": {keys.GPU_RESOURCE: 2}}}]}},
            True,
        ),
    ],
)
def test_uses_gpus_counts_the_device_plugins_resource_and_dra_claims_but_no_check(
    body: dict[str, Any], uses: bool
) -> None:
    assert gpu_pods.uses_gpus(body) is uses


def test_nothing_is_synced_before_the_first_list_is_in() -> None:
    index = gpu_pods.GpuPods()
    assert not index.synced
    index.listing()
    index.observe(None, pod("a"), T0)
    assert not index.synced and not index.busy, "half a LIST is no answer"
    index.listed(T0)
    assert index.synced and set(index.busy) == {"n1"}


def test_events_move_the_busy_nodes() -> None:
    index = synced()
    index.observe("ADDED", pod("a", None, nominated="n2"), T0)
    assert set(index.busy) == {"n2"}, "nominated: the scheduler preempts for it there"
    index.observe("MODIFIED", pod("a", "n2"), T0)
    index.observe("ADDED", pod("b", "n3"), T0)
    index.observe("ADDED", pod("cpu", "n4", gpus=None), T0)
    assert set(index.busy) == {"n2", "n3"}
    assert len(index) == 2, "only pods using GPUs are kept"
    index.observe("DELETED", pod("b", "n3"), LATER)
    assert set(index.busy) == {"n2"}
    assert index.freed_at == {"n3": LATER}


def test_a_node_stays_busy_until_its_last_gpu_pod_is_gone() -> None:
    index = synced(pod("a"), pod("b"))
    index.observe("DELETED", pod("a"), T0)
    assert set(index.busy) == {"n1"}
    index.observe("DELETED", pod("b"), LATER)
    assert not index.busy and index.freed_at["n1"] == LATER


def test_a_list_replaces_what_was_known() -> None:
    index = synced(pod("gone", "n1"), pod("stays", "n2"))
    index.observe("ADDED", pod("also-gone", "n3"), T0)
    index.listing()
    assert not index.synced
    index.observe(None, pod("stays", "n2"), LATER)
    index.observe(None, pod("new", "n4"), LATER)
    assert set(index.busy) == {"n1", "n2", "n3"}, "what a LIST brings counts once it is complete"
    index.listed(LATER)
    assert index.synced
    assert set(index.busy) == {"n2", "n4"}
    assert index.freed_at == {"n1": LATER, "n3": LATER}


def test_a_deleted_node_is_forgotten_and_clear_forgets_everything() -> None:
    index = synced(pod("a", "n1"), pod("b", "n2", nominated="n1"))
    index.observe("DELETED", pod("a", "n1"), T0)
    assert index.freed_at == {"n1": T0} and "n1" in index.busy, "b is nominated there"
    index.forget_node("n1")
    assert set(index.busy) == {"n2"} and "n1" not in index.freed_at
    index.observe("DELETED", pod("b", "n2"), LATER)
    assert not index.busy and len(index) == 0
    index.clear()
    assert not index.synced and not index.freed_at


def pending_for(name: str, hostname: str) -> dict[str, Any]:
    """A pending DRA workload pinned to a node by its hostname label (not bound yet)."""
    body = pod(name, None, gpus=None, claims=True)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": hostname}
    body["status"] = {"phase": "Pending"}
    return body


def test_the_nodes_pending_gpu_pods_wait_for_come_from_the_same_watch() -> None:
    """A DRA check makes way for a pending pod (kube-scheduler preempts nothing for DRA devices): the
    pending pods arrive on the watch of pods not ended, so no LIST of them is made per pass either."""
    index = synced(pending_for("w1", "gpu-a"), pod("cpu-only", None, gpus=None))
    assert index.waits.hostnames == {"gpu-a"} and not index.waits.names
    index.observe("MODIFIED", {**pending_for("w1", "gpu-a"), "status": {"nominatedNodeName": "n9"}}, LATER)
    assert index.waits.names == {"n9"}
    bound = pending_for("w1", "gpu-a")
    bound["spec"]["nodeName"] = "gpu-a"  # scheduled: it holds the node now, it waits for nothing
    index.observe("MODIFIED", bound, LATER)
    assert not index.waits and "gpu-a" in index.busy
    index.observe(None, pending_for("w2", "gpu-b"), LATER)  # not a LIST under way: an event like any
    index.listing()
    index.observe(None, pending_for("w3", "gpu-c"), LATER)
    index.listed(LATER)  # the LIST replaces: w2 was deleted meanwhile
    assert index.waits.hostnames == {"gpu-c"}
    index.clear()
    assert not index.waits
