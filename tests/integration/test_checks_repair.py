"""Issue 51 follow-up: a node drained for ActiveCheckFailed is repaired and comes back, against a real
API server, kube-scheduler, kube-controller-manager and kwok.

A failed check drains the node; the repair's ResetGPU step is judged without ActiveCheckFailed (its
evidence is a run, which never happens on a cordoned node); the validation Job passing clears the
condition (it is the node's check too), and the node returns and stays schedulable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

import check_jobs
import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from check_jobs import condition
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
jobs_namespace = check_jobs.jobs_namespace_fixture("checks-repair")
operator = operator_fixtures.operator_fixture(
    "checks-repair", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("chr")


def repair_job(
    k8s: client.ApiClient, namespace: str, node: str, action: str, agent: Callable[[], None] = lambda: None
) -> dict[str, object]:
    """The node's repair Job of `action` once it exists; `agent` reports meanwhile."""

    def found() -> dict[str, object] | None:
        agent()
        return next(
            (
                j
                for j in repair_jobs.jobs(k8s, namespace, node)
                if j["metadata"]["labels"].get(keys.REPAIR_ACTION_LABEL) == action
            ),
            None,
        )

    job: dict[str, object] = waiting.wait_until(
        found, timeout_seconds=TIMEOUT, message=f"{node}: a {action} Job"
    )
    return job


def heartbeat(fleet: operator_harness.Fleet, name: str) -> Callable[[], None]:
    """The agent reporting healthy facts every second, as a real one does: a step's effect is judged only
    from a report seen after the step's Job finished."""
    last = [0.0]

    def beat() -> None:
        if time.monotonic() - last[0] >= 1.0:
            fleet.report(name, gpunode_facts.agent_status())
            last[0] = time.monotonic()

    return beat


def test_a_node_drained_for_a_failed_check_is_repaired_validated_and_returned(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name)
    check_jobs.check_policy(
        fleet,
        rules=[{"name": "diag", "condition": "ActiveCheckFailed", "action": "Drain"}],
        drain={"timeoutSeconds": 30, "force": True},
        recovery={"uncordon": True, "healthyForSeconds": 3600},  # a validated node returns at once
        repair={
            "steps": [{"name": "reset", "action": "ResetGPU", "timeoutSeconds": 120}],
            "validation": {"timeoutSeconds": 120},
            "maxConcurrent": 1,
        },
    )
    check = check_jobs.wait_job(k8s, jobs_namespace, name)
    check_jobs.end(k8s, jobs_namespace, check, ok=False, message="diag: GPU 0 memory test failed")
    check_jobs.wait_run(fleet, name, "Failed")
    waiting.wait_until(
        lambda: fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordoned"
    )

    reset = repair_job(k8s, jobs_namespace, name, "ResetGPU")
    repair_jobs.end(k8s, jobs_namespace, reset, ok=True)
    # The step had its effect: the agent reports no fault (ActiveCheckFailed is a run's, not a report's).
    validation = repair_job(k8s, jobs_namespace, name, "Validation", heartbeat(fleet, name))
    repair_jobs.end(k8s, jobs_namespace, validation, ok=True)

    waiting.wait_until(
        lambda: not fleet.node(name)["spec"].get("unschedulable"),
        timeout_seconds=TIMEOUT,
        message="the validated node schedulable again",
    )
    waiting.wait_until(
        lambda: (c := condition(fleet, name, "ActiveCheckFailed")) is not None and c["status"] == "False",
        timeout_seconds=TIMEOUT,
        message="ActiveCheckFailed False",
    )
    # Never cordoned again by the old failure (a pass judging it before the validation's record).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        node = fleet.node(name)
        assert not node["spec"].get("unschedulable"), "cordoned again after the validated return"
        assert keys.NEEDS_REPAIR_LABEL not in (node["metadata"].get("labels") or {}), "retired"
        time.sleep(0.5)
    results = [e["result"] for e in (fleet.gpunode(name).get("status") or {}).get("repairs") or []]
    assert "ValidationPassed" in results and "Retired" not in results, results
    assert fleet.said(name, "RepairSucceeded", "succeeded")
