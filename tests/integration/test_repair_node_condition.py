"""A reboot that fixed another tool's Node condition, against a real API server (issue 45, item 5).

node-problem-detector's condition is written by another writer than us, and the kubelet (here the API
server: kwok keeps the Nodes) holds the version written before the reboot until that tool writes
again. The RebootNode step must not be judged NoEffect on that version: it waits for one written after
the boot the agent reports (`status.agent.bootTime`), then validates and returns the node.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
import repair_jobs
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
jobs_namespace = repair_jobs.jobs_namespace_fixture("repair-nc")
operator = operator_fixtures.operator_fixture(
    "repair-nc", lambda request: [*operator_harness.QUICK_TIMER, repair_jobs.templates_flag(request)]
)
fleet = operator_fixtures.fleet_fixture("rnc")


def stamp(seconds_ago: float) -> str:
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def report(fleet: operator_harness.Fleet, name: str, boot: str, boot_time: str) -> None:
    facts = gpunode_facts.agent_status()
    facts["agent"]["bootId"] = boot
    facts["agent"]["bootTime"] = boot_time
    fleet.report(name, facts)


def deadlock(fleet: operator_harness.Fleet, name: str, status: str, written: str) -> None:
    """node-problem-detector writes its KernelDeadlock condition."""
    condition = {
        "type": "KernelDeadlock",
        "status": status,
        "reason": "DockerHung" if status == "True" else "KernelHasNoDeadlock",
        "message": "task docker:1234 blocked for more than 120 seconds" if status == "True" else "ok",
        "lastHeartbeatTime": written,
        "lastTransitionTime": written,
    }
    fleet.core.patch_node_status(name, {"status": {"conditions": [condition]}})


def gpunode_status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def results(fleet: operator_harness.Fleet, name: str) -> list[tuple[str, str]]:
    return [(e.get("action", ""), e["result"]) for e in gpunode_status(fleet, name).get("repairs") or []]


def job_of(k8s: Any, namespace: str, name: str, action: str) -> dict[str, Any] | None:
    return next(
        (
            j
            for j in repair_jobs.jobs(k8s, namespace, name)
            if j["metadata"]["labels"][keys.REPAIR_ACTION_LABEL] == action
        ),
        None,
    )


def test_a_reboot_that_fixed_a_node_condition_is_judged_on_the_fresh_version(
    fleet: operator_harness.Fleet, k8s: Any, jobs_namespace: str
) -> None:
    name = f"{fleet.label}-a"
    fleet.add_node(name, report=False)
    report(fleet, name, "boot-1", stamp(86400))
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": "100%",
            "rules": [{"name": "kd", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Drain"}],
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 3600},
            "repair": {
                "steps": [{"name": "reboot", "action": "RebootNode", "timeoutSeconds": 120}],
                "validation": {"timeoutSeconds": 120},
                "maxConcurrent": 1,
            },
        },
    )
    deadlock(fleet, name, "True", stamp(60))  # written a minute before the reboot below
    waiting.wait_until(
        lambda: job_of(k8s, jobs_namespace, name, "RebootNode"), timeout_seconds=TIMEOUT, message="reboot Job"
    )
    # The node rebooted 5 s ago: the agent reports the new boot; the Node still holds the old condition.
    boot_time = stamp(5)
    last = [0.0]

    def agent_reports_and_no_verdict_yet() -> bool:
        if time.monotonic() - last[0] >= 1.0:
            report(fleet, name, "boot-2", boot_time)
            last[0] = time.monotonic()
        return not fleet.messages(name, "RepairFailed") and not fleet.messages(name, "NodeRetired")

    waiting.holds(
        agent_reports_and_no_verdict_yet,
        seconds=5,
        message="no NoEffect on the condition from before the boot",
    )
    assert gpunode_status(fleet, name).get("action") == "Repairing"
    deadlock(fleet, name, "False", stamp(0))  # NPD started again after the boot: no deadlock
    waiting.wait_until(
        lambda: job_of(k8s, jobs_namespace, name, "Validation"), timeout_seconds=TIMEOUT, message="validation"
    )
    validation = job_of(k8s, jobs_namespace, name, "Validation")
    assert validation is not None
    repair_jobs.end(k8s, jobs_namespace, validation, ok=True)
    waiting.wait_until(
        lambda: not fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="returned"
    )
    assert ("RebootNode", "Succeeded") in results(fleet, name)
    assert ("RebootNode", "NoEffect") not in results(fleet, name)
    assert keys.NEEDS_REPAIR_LABEL not in fleet.node(name)["metadata"].get("labels", {})
