"""Issue 51 on a DRA node: a restarted leader adopts the DRA check in flight (killed with SIGKILL) and
neither doubles nor leaks its claim: one Job, one ResourceClaimTemplate (the Job's), the run recorded
once, and the template and the claim gone with the Job.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from kubernetes import client

import check_jobs
import dra_checks
import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

jobs_namespace = check_jobs.jobs_namespace_fixture("checks-dra-restart")


fleet = check_jobs.restart_fleet_fixture("dradopt")


def test_a_dra_check_in_flight_is_adopted_with_its_one_claim_template_and_nothing_is_left(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    fleet: operator_harness.Fleet,
    jobs_namespace: str,
    tmp_path: Path,
) -> None:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    lease = f"gpu-health-operator-dradopt-{secrets.token_hex(2)}"
    name = f"{fleet.label}-n"
    dra_checks.add_node(fleet, k8s, name)
    check_jobs.check_policy(fleet)
    first = check_jobs.start_leader(Path(crds.kubeconfig), tmp_path / "first.log", lease, jobs_namespace)
    try:
        job = check_jobs.wait_job(k8s, jobs_namespace, name)
        pod = check_jobs.bound_pod(k8s, jobs_namespace, job)
        waiting.wait_until(
            lambda: dra_checks.allocated(k8s, jobs_namespace, pod["metadata"]["name"]),
            timeout_seconds=30,
            message="the check's claim allocated",
        )
        (template,) = dra_checks.templates(k8s, jobs_namespace)
    finally:
        first.kill()
        print(first.log()[-5000:])
    second = check_jobs.start_leader(Path(crds.kubeconfig), tmp_path / "second.log", lease, jobs_namespace)
    try:
        deadline = time.monotonic() + 3  # several passes of the new leader: the same Job and template
        while time.monotonic() < deadline:
            (found,) = check_jobs.jobs(k8s, jobs_namespace, name)
            assert found["metadata"]["uid"] == job["metadata"]["uid"]
            (still,) = dra_checks.templates(k8s, jobs_namespace)
            assert still["metadata"]["uid"] == template["metadata"]["uid"]
            assert len(dra_checks.claims(k8s, jobs_namespace)) == 1
            time.sleep(0.5)
        check_jobs.end(k8s, jobs_namespace, job, ok=True, message='{"durationSeconds": 1}')
        (run,) = check_jobs.wait_run(fleet, name, "Passed")
        assert run["figures"] == {"durationSeconds": 1}
        waiting.wait_until(
            lambda: (
                not check_jobs.jobs(k8s, jobs_namespace, name)
                and not dra_checks.templates(k8s, jobs_namespace)
                and not dra_checks.claims(k8s, jobs_namespace)
            ),
            timeout_seconds=30,
            message="the Job, its claim template and its claim deleted",
        )
        assert len(check_jobs.runs(fleet, name)) == 1, "the run recorded once"
    finally:
        second.stop()
        print(second.log()[-5000:])
