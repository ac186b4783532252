"""Issue 51: the check step knows which nodes run a pod using GPUs from a watch of pods, not a LIST.

A LIST of every pod of the cluster on every timer pass (about every second) is tens of MB decoded per
second by the operator and the API server on a fleet of 40,000 pods. The check step reads an index fed
by a watch instead, and must still (a) never start a check on a node where a pod uses GPUs, and start it
once the pod is gone and `idleForSeconds` passed; (b) send no LIST of the cluster's pods per pass (the
API server's own request counts say so); (c) see a pod added while its watch was down: the operator is
frozen, the API server restarted (its watch cache no longer holds the history to resume from) and the
pods changed meanwhile. The Lease is long so that the freeze does not end the term (a new term lists
everything again, which would hide the gap).
"""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

import apiserver_requests
import check_jobs
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
TICK_SECONDS = 0.5
IDLE_SECONDS = 4
PASSES = 20
jobs_namespace = check_jobs.jobs_namespace_fixture("checks-pods")


def _resume(process: operator_harness.OperatorProcess) -> None:
    """A test that froze the operator (SIGSTOP) and failed leaves it frozen: thaw it so it can stop."""
    if process.process is not None:
        process.process.signal(signal.SIGCONT)


operator = operator_fixtures.operator_fixture(
    "checks-pods",
    lambda request: [
        f"--tick-seconds={TICK_SECONDS}",
        "--lease-duration-seconds=180",
        "--lease-renew-deadline-seconds=150",
        repair_jobs.templates_flag(request),
    ],
    before_stop=_resume,
)
fleet = operator_fixtures.fleet_fixture("pix")


@pytest.fixture
def core(k8s: client.ApiClient) -> Iterator[client.CoreV1Api]:
    yield client.CoreV1Api(k8s)


def gpu_pod(name: str, node: str) -> dict[str, object]:
    """A pod bound to `node` using one of its GPUs (kwok runs it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


def gone(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Delete a pod at once (no grace: kwok plays no kubelet shutdown) and wait until it is gone."""
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    waiting.wait_until(
        lambda: name not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
        timeout_seconds=TIMEOUT,
        message=f"pod {name} gone",
    )


def never_checked(k8s: client.ApiClient, namespace: str, node: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not check_jobs.jobs(k8s, namespace, node), f"a check Job on node {node}, where a GPU pod runs"
        time.sleep(TICK_SECONDS)


def test_a_busy_node_is_checked_only_once_its_pod_is_gone_and_it_stayed_idle(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    core: client.CoreV1Api,
    jobs_namespace: str,
    namespace: str,
) -> None:
    busy, idle = f"{fleet.label}-busy", f"{fleet.label}-idle"
    fleet.add_node(busy)
    fleet.add_node(idle)
    core.create_namespaced_pod(namespace, gpu_pod("train", busy))
    check_jobs.check_policy(fleet, check_jobs.active_check(idleForSeconds=IDLE_SECONDS))
    check_jobs.wait_job(k8s, jobs_namespace, idle)
    never_checked(k8s, jobs_namespace, busy, 3)

    gone(core, namespace, "train")
    freed = datetime.datetime.now(datetime.UTC)
    job = check_jobs.wait_job(k8s, jobs_namespace, busy)
    created = datetime.datetime.fromisoformat(job["metadata"]["creationTimestamp"])
    # creationTimestamp has whole seconds: a second of slack, never a check before the pod went.
    waited = (created - freed).total_seconds()
    assert waited >= IDLE_SECONDS - 1, f"checked {waited:.1f} s after its GPU pod went"


def test_the_check_step_lists_no_pods_of_the_cluster_per_pass(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name)
    check_jobs.check_policy(fleet)
    check_jobs.wait_job(k8s, jobs_namespace, name)  # passes with a policy that wants checks are running
    before = apiserver_requests.pod_lists(k8s)
    time.sleep(PASSES * TICK_SECONDS)  # the window the count covers, not a wait for something
    lists = apiserver_requests.pod_lists(k8s) - before
    # A (re)list of a watch may fall into the window; a LIST per pass would be ~20.
    assert lists <= 1, f"{lists:g} LISTs of the cluster's pods in {PASSES} timer passes"


def test_a_pod_added_while_the_watch_was_down_is_seen_after_it_resumed(
    crds: local.ControlPlane,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    core: client.CoreV1Api,
    jobs_namespace: str,
    namespace: str,
) -> None:
    control, busy = f"{fleet.label}-ctl", f"{fleet.label}-busy"
    fleet.add_node(control)
    fleet.add_node(busy)
    core.create_namespaced_pod(namespace, gpu_pod("ctl-train", control))
    core.create_namespaced_pod(namespace, gpu_pod("first", busy))
    check_jobs.check_policy(fleet, check_jobs.active_check(idleForSeconds=1))
    never_checked(k8s, jobs_namespace, control, 3)  # the watch runs and shows both nodes busy

    assert operator.process is not None
    operator.process.signal(signal.SIGSTOP)
    try:
        crds.stop_apiserver()
        crds.start_apiserver()
        # Unseen by the frozen operator: the control node's pod goes, the busy node's pod is replaced.
        core.delete_namespaced_pod("ctl-train", namespace, grace_period_seconds=0)
        core.delete_namespaced_pod("first", namespace, grace_period_seconds=0)
        core.create_namespaced_pod(namespace, gpu_pod("second", busy))
    finally:
        operator.process.signal(signal.SIGCONT)

    check_jobs.wait_job(k8s, jobs_namespace, control)  # the deletion was seen after the watch resumed
    never_checked(k8s, jobs_namespace, busy, 3)  # and so was the pod added meanwhile
    gone(core, namespace, "second")
    check_jobs.wait_job(k8s, jobs_namespace, busy)
    log = operator.log()
    assert "watch of /api/v1/pods" in log, "the pods' watch saw the gap (else nothing is tested here)"
    assert operator.is_leading(), "the same term went on across the gap"
    assert "campaigning again" not in log
