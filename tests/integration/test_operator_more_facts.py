"""NvLinkDegraded, FabricUnhealthy, NicDegraded, PcieErrors, MemoryDegrading and rules on other tools' Node
conditions, from a GPUNode status (or a Node condition) to the Node, against a real API server (issue 27).

A trend needs two reports the operator has seen in order: the first carries a heartbeat period of its
own, and the test waits until the operator's AgentStale condition quotes it (`the agent reports every
61s`) before it writes the second.
"""

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
NVLINK = {"linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}
NIC = {
    "name": "mlx5_0",
    "port": 1,
    "state": "ACTIVE",
    "physState": "LinkUp",
    "rateGbps": 400.0,
    "linkDowned": 0,
    "symbolErrors": 0,
    "rcvErrors": 0,
}
RULES = [
    {"name": "nvlink", "condition": "NvLinkDegraded", "action": "Taint"},
    {"name": "fabric", "condition": "FabricUnhealthy", "action": "Cordon"},
    {"name": "nic", "condition": "NicDegraded", "action": "Taint", "threshold": 50},
    {"name": "pcie-aer", "condition": "PcieErrors", "action": "Cordon"},
    {"name": "memory", "condition": "MemoryDegrading", "action": "Label"},
    {"name": "deadlock", "nodeCondition": {"type": "KernelDeadlock"}, "action": "Taint"},
]


operator = operator_fixtures.operator_fixture("more-facts-it")


@pytest.fixture
def fleet(
    k8s: client.ApiClient, operator: operator_harness.OperatorProcess
) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"facts-{secrets.token_hex(3)}") as nodes:
        nodes.policy(nodes.label, {"maxUnavailable": "100%", "rules": RULES})
        yield nodes


def facts(
    gpu0: dict[str, Any] | None = None, nics: list[dict[str, Any]] | None = None, period: int = 60
) -> Any:
    status = gpunode_facts.agent_status(overrides={0: gpu0 or {}}, heartbeat_seconds=period)
    if nics is not None:
        status["nics"] = nics
    return status


def operator_saw(fleet: operator_harness.Fleet, name: str, period: int) -> None:
    """Wait until the operator has judged the report that said `heartbeatSeconds: period`."""

    def seen() -> bool:
        conditions = fleet.gpunode(name).get("status", {}).get("conditions") or []
        stale = next((c for c in conditions if c.get("type") == "AgentStale"), {})
        return stale.get("message") == f"the agent reports every {period}s"

    waiting.wait_until(
        seen, timeout_seconds=TIMEOUT, message=f"{name}: the operator judged the {period}s report"
    )


def two_reports(fleet: operator_harness.Fleet, name: str, first: Any, second: Any) -> None:
    fleet.add_node(name, report=False)
    fleet.report(name, first)
    operator_saw(fleet, name, first["agent"]["heartbeatSeconds"])
    fleet.report(name, second)


def taint(fleet: operator_harness.Fleet, name: str) -> str | None:
    taints = fleet.node(name).get("spec", {}).get("taints") or []
    return next((t.get("value") for t in taints if t.get("key") == keys.UNHEALTHY_TAINT), None)


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return fleet.node(name).get("spec", {}).get("unschedulable") is True


def issues(fleet: operator_harness.Fleet, name: str) -> str:
    return str(fleet.gpunode(name).get("status", {}).get("issues", ""))


def wait_for(fleet: operator_harness.Fleet, name: str, what: str, check: Any) -> None:
    waiting.wait_until(check, timeout_seconds=TIMEOUT, message=f"{name}: {what}")


def said(fleet: operator_harness.Fleet, name: str, reason: str, message: str) -> None:
    """Wait for the Event (the operator writes the Node, then its Events and the GPUNode status)."""
    wait_for(fleet, name, f"Event {reason}", lambda: fleet.messages(name, reason) == [message])


def test_an_nvlink_down_that_was_up_taints_and_a_board_without_nvlink_is_left_alone(
    fleet: operator_harness.Fleet,
) -> None:
    name, bare = f"{fleet.label}-nvlink", f"{fleet.label}-bare"
    down = {**NVLINK, "linksUp": 16, "linksDown": 2}
    two_reports(fleet, name, facts({"nvlink": NVLINK}, period=61), facts({"nvlink": down}, period=62))
    # A PCIe board: no nvlink, no fabric, no AER, no NICs; and links down it never had up are no fault.
    two_reports(fleet, bare, facts(period=61), facts({"nvlink": down}, period=62))
    wait_for(fleet, name, "tainted NvLinkDegraded", lambda: taint(fleet, name) == "NvLinkDegraded")
    said(fleet, name, "NvLinkDegraded", "GPU 0 (GPU-00000000…): 2 links down (16 of 18 up)")
    wait_for(fleet, name, "issues", lambda: "NvLinkDegraded" in issues(fleet, name))
    operator_saw(fleet, bare, 62)
    assert taint(fleet, bare) is None and not cordoned(fleet, bare)
    assert fleet.gpunode(bare)["status"]["health"] == "Healthy"


def test_nvlink_errors_growing_faster_than_the_threshold_taint(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-crc"
    two_reports(
        fleet,
        name,
        facts({"nvlink": NVLINK}, period=61),
        facts({"nvlink": {**NVLINK, "crcErrors": 500}}, period=62),
    )
    wait_for(fleet, name, "tainted NvLinkDegraded", lambda: taint(fleet, name) == "NvLinkDegraded")
    said(fleet, name, "NvLinkDegraded", "GPU 0 (GPU-00000000…): crcErrors +500/h (over 100/h)")


def test_a_failed_fabric_registration_cordons(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-fabric"
    fleet.add_node(name, report=False)
    fleet.report(name, facts({"fabric": {"state": "Completed", "status": "Timeout", "cliqueId": 3}}))
    wait_for(fleet, name, "cordoned", lambda: cordoned(fleet, name))
    assert fleet.node(name)["metadata"]["labels"][keys.HEALTH_LABEL] == "unhealthy"
    said(fleet, name, "FabricUnhealthy", "GPU 0 (GPU-00000000…): fabric registration failed (Timeout)")


def test_a_nic_port_down_not_disabled_taints(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-nic"
    down = {**NIC, "state": "DOWN", "physState": "Polling"}
    two_reports(fleet, name, facts(nics=[NIC], period=61), facts(nics=[down], period=62))
    wait_for(fleet, name, "tainted NicDegraded", lambda: taint(fleet, name) == "NicDegraded")
    said(fleet, name, "NicDegraded", "mlx5_0/1: DOWN (physState Polling)")  # issue 45, item 7


def test_a_fatal_pcie_aer_error_cordons(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-aer"
    fleet.add_node(name, report=False)
    fleet.report(name, facts({"pcie": {"aer": {"fatal": 1, "nonFatal": 0, "correctable": 12}}}))
    wait_for(fleet, name, "cordoned", lambda: cordoned(fleet, name))
    said(fleet, name, "PcieErrors", "GPU 0 (GPU-00000000…): 1 fatal AER error")
    wait_for(fleet, name, "issues", lambda: "PcieErrors" in issues(fleet, name))


def test_corrected_memory_errors_growing_label_the_node_degraded(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-memory"
    grown = {"ecc": {"correctedVolatile": 40, "correctedAggregate": 40}}
    two_reports(fleet, name, facts(period=61), facts(grown, period=62))
    wait_for(fleet, name, "MemoryDegrading", lambda: "MemoryDegrading" in issues(fleet, name))
    wait_for(
        fleet,
        name,
        "labelled degraded",
        lambda: fleet.node(name)["metadata"]["labels"].get(keys.HEALTH_LABEL) == "degraded",
    )
    wait_for(fleet, name, "action Labeled", lambda: fleet.gpunode(name)["status"].get("action") == "Labeled")
    said(
        fleet,
        name,
        "MemoryDegrading",
        "GPU 0 (GPU-00000000…): correctedVolatile +40/h (over 10/h), correctedAggregate +40/h (over 10/h)",
    )
    assert not cordoned(fleet, name) and taint(fleet, name) is None


def test_another_tools_node_condition_taints_until_it_clears(fleet: operator_harness.Fleet) -> None:
    name = f"{fleet.label}-npd"
    fleet.add_node(name)
    operator_saw(fleet, name, 60)
    deadlock = {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung", "message": "task hung"}
    fleet.core.patch_node_status(name, {"status": {"conditions": [deadlock]}})
    wait_for(fleet, name, "tainted Node.KernelDeadlock", lambda: taint(fleet, name) == "Node.KernelDeadlock")
    said(fleet, name, "Node:KernelDeadlock", "the Node's KernelDeadlock condition is True")
    wait_for(fleet, name, "issues", lambda: issues(fleet, name) == "Node:KernelDeadlock")
    assert fleet.node(name)["metadata"]["labels"][keys.HEALTH_LABEL] == "degraded"
    fleet.core.patch_node_status(name, {"status": {"conditions": [{**deadlock, "status": "False"}]}})
    wait_for(fleet, name, "untainted", lambda: taint(fleet, name) is None)
    wait_for(fleet, name, "issues cleared", lambda: "KernelDeadlock" not in issues(fleet, name))
