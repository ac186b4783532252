"""Issue 45 item 2: which pods make a node busy (`decisions.workload_pods`), whatever the drain evicts."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuhealth_api import keys
from gpuhealth_operator.decisions import workload_pods

REPAIR_NS = "gpu-health"
T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def pod(
    name: str = "p",
    *,
    namespace: str = "team",
    owner: str | None = "ReplicaSet",
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "controller": True}]
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": "n", **spec}, "status": {"phase": phase}}


@pytest.mark.parametrize(
    "busy",
    [
        pod(owner=None),  # no controller: the drain leaves it without force
        pod(volumes=[{"name": "d", "emptyDir": {}}]),  # emptyDir data the drain may keep
        pod(namespace="excluded"),  # a namespace the drain excludes
        pod(phase="Pending"),
        pod(owner="Job"),  # someone else's Job
        pod(namespace=REPAIR_NS, owner="Job"),  # in our namespace but without our label
        pod(labels={keys.REPAIR_ACTION_LABEL: "ResetGPU"}, owner="Job"),  # our label, another namespace
        pod(namespace=REPAIR_NS, owner=None, labels={keys.REPAIR_ACTION_LABEL: "ResetGPU"}),  # no Job
        {**pod(), "metadata": {**pod()["metadata"], "deletionTimestamp": "2026-01-01T12:00:00Z"}},
    ],
    ids=[
        "bare",
        "emptyDir",
        "excluded-namespace",
        "pending",
        "other-job",
        "our-namespace-no-label",
        "our-label-elsewhere",
        "our-label-no-job",
        "terminating",
    ],
)
def test_a_workload_pod_makes_the_node_busy(busy: dict[str, Any]) -> None:
    assert workload_pods.busy([busy], REPAIR_NS) == [busy]


@pytest.mark.parametrize(
    "idle",
    [
        pod(phase="Succeeded"),
        pod(phase="Failed", owner=None),
        pod(owner="DaemonSet"),
        pod(owner=None, annotations={workload_pods.MIRROR_ANNOTATION: "x"}),
        pod(namespace=REPAIR_NS, owner="Job", labels={keys.REPAIR_ACTION_LABEL: "Validation"}),
    ],
    ids=["succeeded", "failed", "daemonset", "mirror", "repairs-own"],
)
def test_finished_daemonset_mirror_and_repairs_own_pods_do_not(idle: dict[str, Any]) -> None:
    assert workload_pods.busy([idle], REPAIR_NS) == []


def test_words_name_the_first_pods() -> None:
    pods = [pod(f"p{i}") for i in range(7)]
    said = workload_pods.words(pods)
    assert said.startswith("7 workload pod(s) on the node (team/p0, team/p1, team/p2, team/p3, team/p4")
    assert said.endswith("and 2 more)")


def test_a_busy_phase_drains_or_waits_until_its_deadline_then_fails() -> None:
    later = T0 + datetime.timedelta(seconds=299)
    assert workload_pods.while_busy(T0, 300, later, evictable=True) is workload_pods.BusyStep.DRAIN
    assert workload_pods.while_busy(T0, 300, later, evictable=False) is workload_pods.BusyStep.WAIT
    over = T0 + datetime.timedelta(seconds=300)
    for evictable in (True, False):
        assert workload_pods.while_busy(T0, 300, over, evictable=evictable) is workload_pods.BusyStep.FAIL
