"""Issue 51: a restarted leader adopts the check in flight: the operator is killed (SIGKILL) mid-check,
the next one (same Lease) lists the check Jobs before it plans, starts no second Job on the node, and
records the run when it ends. ActiveCheckFailed, derived from the stored history, survives the restart.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from kubernetes import client

import check_jobs
import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

jobs_namespace = check_jobs.jobs_namespace_fixture("checks-restart")


fleet = check_jobs.restart_fleet_fixture("chkrestart")


def start(
    crds: local.ControlPlane, log: Path, lease: str, jobs_namespace: str
) -> operator_harness.OperatorProcess:
    return check_jobs.start_leader(Path(crds.kubeconfig), log, lease, jobs_namespace)


def test_a_check_in_flight_is_adopted_after_a_kill_and_its_result_recorded_once(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    jobs_namespace: str,
    tmp_path: Path,
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-chkrestart-{secrets.token_hex(2)}"
    name = f"{fleet.label}-n"
    fleet.add_node(name)
    check_jobs.check_policy(
        fleet, rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Label"}]
    )
    first = start(crds, tmp_path / "first.log", lease, jobs_namespace)
    try:
        job = check_jobs.wait_job(k8s, jobs_namespace, name)
        check_jobs.bound_pod(k8s, jobs_namespace, job)
    finally:
        first.kill()
        print(first.log()[-5000:])
    second = start(crds, tmp_path / "second.log", lease, jobs_namespace)
    try:
        deadline = time.monotonic() + 3  # several passes of the new leader: the same Job, no second
        while time.monotonic() < deadline:
            (found,) = check_jobs.jobs(k8s, jobs_namespace, name)
            assert found["metadata"]["uid"] == job["metadata"]["uid"]
            time.sleep(0.5)
        check_jobs.end(k8s, jobs_namespace, job, ok=False, message="diag failed")
        (run,) = check_jobs.wait_run(fleet, name, "Failed")
        assert run["message"] == "diag failed"
        assert len(fleet.messages(name, "CheckFailed")) == 1
    finally:
        second.kill()
        print(second.log()[-5000:])
    # The condition is the stored history's: a third leader judges it True again, from the cluster.
    third = start(crds, tmp_path / "third.log", lease, jobs_namespace)
    try:
        waiting.wait_until(
            lambda: (
                [
                    c["status"]
                    for c in (fleet.gpunode(name).get("status") or {}).get("conditions") or []
                    if c["type"] == "ActiveCheckFailed"
                ]
                == ["True"]
            ),
            timeout_seconds=30,
            message="ActiveCheckFailed True under the third leader (the second may die before writing it)",
        )
        deadline = time.monotonic() + 3  # its passes judge the node from the stored history: it stays True
        while time.monotonic() < deadline:
            conditions = (fleet.gpunode(name).get("status") or {}).get("conditions") or []
            assert [c["status"] for c in conditions if c["type"] == "ActiveCheckFailed"] == ["True"]
            time.sleep(0.5)
        assert len(check_jobs.runs(fleet, name)) == 1, "the run recorded once"
    finally:
        third.stop()
        print(third.log()[-5000:])
