"""Agent-supplied strings against the real API server: bounded condition messages, escaped Events.

The agent's status is input the operator does not control. A GPUNode whose
64 GPUs each carry a long, newline-laden `recoveryAction` would make the
RecoveryRequired condition message about 45 KB, past the CRD's 32768
characters: every status write would fail, forever. The operator cuts such
messages to docs/conditions.md's sizes and escapes control characters.
"""

from __future__ import annotations

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_operator.decisions import text
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
GPUS = 64


operator = operator_fixtures.operator_fixture("input-it")
fleet = operator_fixtures.fleet_fixture("input")


def test_a_36kb_condition_message_is_cut_and_escaped(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    name = f"{fleet.label}-huge"
    fleet.add_node(name, gpus=GPUS)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "rules": [{"name": "recovery", "condition": "RecoveryRequired", "action": "Label"}],
        },
    )
    forged = "GpuReset\nI1123 12:00:00 node other: NodeDrained\x1b[2K" + "x" * 600
    status = gpunode_facts.agent_status(
        gpus=GPUS, overrides={i: {"recoveryAction": forged} for i in range(GPUS)}
    )
    assert sum(len(g["recoveryAction"]) for g in status["gpus"]) > 36_000
    fleet.report(name, status)

    condition = waiting.wait_until(
        lambda: next(
            (
                c
                for c in (fleet.gpunode(name).get("status") or {}).get("conditions") or []
                if c["type"] == "RecoveryRequired" and c["status"] == "True"
            ),
            None,
        ),
        timeout_seconds=TIMEOUT,
        message="condition RecoveryRequired True on the GPUNode",
    )
    message = condition["message"]
    assert len(message) <= text.CONDITION_MESSAGE_MAX
    assert message.endswith(text.TRUNCATED)
    assert "\n" not in message and "\x1b" not in message
    assert "GpuReset\\nI1123" in message
    waiting.wait_until(
        lambda: (fleet.node(name)["metadata"].get("labels") or {}).get(keys.HEALTH_LABEL) == "unhealthy",
        timeout_seconds=TIMEOUT,
        message="unhealthy label on the Node",
    )

    events = waiting.wait_until(
        lambda: fleet.events(name, "RecoveryRequired"),
        timeout_seconds=TIMEOUT,
        message="RecoveryRequired Event",
    )
    assert len(events[0]["message"]) <= text.EVENT_MESSAGE_MAX
    assert "\n" not in events[0]["message"] and "\x1b" not in events[0]["message"]
    node_condition = waiting.wait_until(
        lambda: next(
            (
                c
                for c in fleet.node(name)["status"].get("conditions") or []
                if c["type"] == keys.NODE_CONDITION_TYPE and c["reason"] == "RecoveryRequired"
            ),
            None,
        ),
        timeout_seconds=TIMEOUT,
        message="the Node's GPU condition names RecoveryRequired",
    )
    assert "\n" not in node_condition["message"]
    assert len(node_condition["message"]) <= text.NODE_CONDITION_MESSAGE_MAX
    log = operator.log()
    assert "\nI1123 12:00:00 node other: NodeDrained" not in log


def test_a_gpu_uuid_not_of_nvmls_form_is_refused_by_the_api_server(fleet: operator_harness.Fleet) -> None:
    """Issue 45, item 9: `status.gpus[].uuid` reaches a privileged repair Job's environment; an agent
    writing shell text there is refused whole (its node goes stale: Unknown, no disruptive action)."""
    name = f"{fleet.label}-uuid"
    fleet.add_node(name, report=False)
    forged = gpunode_facts.agent_status(overrides={0: {"uuid": "GPU-1;nsenter -t 1 -m -u -i -n -p -- sh"}})
    with pytest.raises(client.ApiException) as refused:
        fleet.report(name, forged)
    assert refused.value.status == 422, refused.value
    assert "status.gpus[0].uuid" in str(refused.value.body), refused.value.body
    fleet.report(name, gpunode_facts.agent_status())  # NVML's form is accepted
