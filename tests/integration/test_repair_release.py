"""Issue 48, Deliver 1 and 6 against a real API server: the agent releases the GPU before a reset.

The operator runs with the repair templates of `repair_jobs` (kwok leaves their pods alone; the test
ends them). The agent is played by the test (its reports under the agent's field manager, with
`canRelease: true`), or is the agent's own watch (`release.GPUNodeWatch`) on the real API server.
What a user sees: the GPUNode annotation `gpuhealth.io/release-gpus` before any ResetGPU Job; no
ResetGPU Job before `status.agent.released` answers it; the annotation gone after the Job ended; an
agent that never answers fails the step after its deadline and the cycle moves on, never AgentStale.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_agent import release
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
STEP_SECONDS = 15
jobs_namespace = repair_jobs.jobs_namespace_fixture("release-it")
operator = operator_fixtures.operator_fixture(
    "release", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("rel")


def asked(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name)["metadata"].get("annotations") or {}).get(keys.RELEASE_GPUS_ANNOTATION)


def report(fleet: operator_harness.Fleet, name: str, *, faulty: bool, released: str | None = None) -> None:
    overrides = {0: {"ecc": {"uncorrectedVolatile": 2}}} if faulty else {}
    facts: dict[str, Any] = gpunode_facts.agent_status(overrides=overrides)
    facts["agent"]["bootId"] = "boot-1"
    facts["agent"]["canRelease"] = True
    if released is not None:
        facts["agent"]["released"] = released
    fleet.report(name, facts)


def start(fleet: operator_harness.Fleet, name: str) -> None:
    fleet.add_node(name, report=False)
    report(fleet, name, faulty=False)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 3600},
            "repair": {
                "steps": [
                    {"name": "reset", "action": "ResetGPU", "timeoutSeconds": STEP_SECONDS},
                    {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120},
                ],
                "validation": {"timeoutSeconds": 120},
                "maxConcurrent": 1,
            },
        },
    )
    report(fleet, name, faulty=True)


def jobs_of(k8s: client.ApiClient, namespace: str, node: str, action: str) -> list[dict[str, Any]]:
    return [
        j
        for j in repair_jobs.jobs(k8s, namespace, node)
        if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == action
    ]


def test_no_reset_job_before_the_agent_released_and_the_ask_goes_after_it(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    start(fleet, name)
    waiting.wait_until(lambda: asked(fleet, name), timeout_seconds=TIMEOUT, message="the release ask")
    stamp = asked(fleet, name)
    assert stamp is not None
    deadline = time.monotonic() + 3.0  # the operator's timer ticks meanwhile: still no reset
    while time.monotonic() < deadline:
        assert jobs_of(k8s, jobs_namespace, name, "ResetGPU") == [], "a reset before the agent let go"
        time.sleep(0.2)
    report(fleet, name, faulty=True, released=stamp)  # the agent shut NVML down
    waiting.wait_until(
        lambda: jobs_of(k8s, jobs_namespace, name, "ResetGPU"),
        timeout_seconds=TIMEOUT,
        message="the reset Job",
    )
    assert asked(fleet, name) == stamp, "the ask went while the reset runs"
    (job,) = jobs_of(k8s, jobs_namespace, name, "ResetGPU")
    repair_jobs.end(k8s, jobs_namespace, job, ok=True)
    waiting.wait_until(lambda: asked(fleet, name) is None, timeout_seconds=TIMEOUT, message="the ask removed")

    def validating() -> bool:
        report(fleet, name, faulty=False)  # NVML back: the fault gone
        return bool(jobs_of(k8s, jobs_namespace, name, "Validation"))

    waiting.wait_until(validating, timeout_seconds=TIMEOUT, message="the validation Job")
    assert not fleet.events(name, "AgentStale")


def test_an_agent_that_never_confirms_fails_the_step_after_its_deadline(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-b"
    start(fleet, name)
    waiting.wait_until(lambda: asked(fleet, name), timeout_seconds=TIMEOUT, message="the release ask")

    def moved_on() -> bool:
        report(fleet, name, faulty=True)  # heartbeats, never released
        return bool(fleet.events(name, "RepairFailed"))

    waiting.wait_until(
        moved_on, timeout_seconds=STEP_SECONDS + TIMEOUT, message="RepairFailed at the deadline"
    )
    (failed,) = fleet.messages(name, "RepairFailed")
    assert "did not release the GPUs" in failed, failed
    assert jobs_of(k8s, jobs_namespace, name, "ResetGPU") == [], "a reset although the agent held the GPUs"
    waiting.wait_until(
        lambda: jobs_of(k8s, jobs_namespace, name, "RebootNode"), timeout_seconds=TIMEOUT, message="next step"
    )
    assert asked(fleet, name) is None, "the ask outlived its step"
    assert not fleet.events(name, "AgentStale")
    assert fleet.node(name)["spec"].get("unschedulable") is True


def test_the_agents_watch_sees_the_ask_come_and_go(
    fleet: operator_harness.Fleet, k8s: client.ApiClient
) -> None:
    name = f"{fleet.label}-w"
    fleet.add_node(name)
    stop = threading.Event()
    woken = threading.Event()
    watch = release.GPUNodeWatch(k8s, name, wake=woken.set, stop=stop)
    watch.start()
    try:
        fleet.annotate_gpunode(name, {keys.RELEASE_GPUS_ANNOTATION: "stamp-1"})
        waiting.wait_until(
            lambda: watch.wanted() == "stamp-1", timeout_seconds=TIMEOUT, message="the ask seen"
        )
        assert woken.is_set(), "the agent's loop was not woken"
        fleet.annotate_gpunode(name, {keys.RELEASE_GPUS_ANNOTATION: None})
        waiting.wait_until(lambda: watch.wanted() is None, timeout_seconds=TIMEOUT, message="the ask gone")
    finally:
        stop.set()
