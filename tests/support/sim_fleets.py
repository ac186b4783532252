"""The simulated fleet's integration tests' side: a fleet of simulated agents running on kwok nodes,
and a Job's end as the operator reads it (the tests that play checks and repairs through the fleet)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kubernetes import client

from gpuhealth_sim import waiting
from gpuhealth_sim.fleet import agentpool, fleetfile


@contextlib.contextmanager
def running(k8s: client.ApiClient, fleet: fleetfile.Fleet, *, workers: int) -> Iterator[agentpool.Fleet]:
    """The fleet's nodes created and its agents running; stopped and the nodes deleted on exit."""
    sim = agentpool.Fleet(fleet, k8s, workers=workers)
    sim.create_nodes()
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()
        sim.delete_nodes()


def job_ended(k8s: client.ApiClient, namespace: str, name: str, *, timeout_seconds: float) -> str:
    """ "Succeeded" or "Failed" once the Job controller has said so, as the operator reads it."""

    def ended() -> str | None:
        job = client.BatchV1Api(k8s).read_namespaced_job(name, namespace)
        for condition in job.status.conditions or []:
            if condition.status == "True" and condition.type in ("Complete", "Failed"):
                return "Succeeded" if condition.type == "Complete" else "Failed"
        return None

    return waiting.wait_until(
        ended, timeout_seconds=timeout_seconds, message=f"Job {name} complete or failed"
    )
