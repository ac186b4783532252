"""Kubelet's own Node conditions in `nodeCondition` rules are an explicit grant (issue 45 item 11).

`Ready`, `MemoryPressure`, `DiskPressure`, `PIDPressure` and `NetworkUnavailable` are kubelet's: a rule on
them (a whole fleet NotReady during an API server or network blip) can take every selected node out at
once, so a rule names one only with `allowKubeletCondition: true`. The CRD refuses it without the opt-in;
the operator refuses it too, in case the CRD in the cluster is an older one (or admission is off), and says
so on the policy's status instead of acting on it.
"""

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

import gpunode_facts
from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import policies
from memory_fleet import MemoryFleet

ROOT = Path(__file__).resolve().parents[4]
KUBELET = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]


def rule(node_condition: dict[str, Any], action: str = "Drain") -> dict[str, Any]:
    return {"name": "kubelet", "nodeCondition": node_condition, "action": action}


@pytest.mark.parametrize("kind", KUBELET)
def test_a_kubelet_condition_without_the_opt_in_is_refused_naming_it(kind: str) -> None:
    with pytest.raises(ValueError) as refused:
        policies.parse_policy("p", 1, {"rules": [rule({"type": kind, "status": "False"})]})
    message = str(refused.value)
    assert message.startswith("spec.rules[0].nodeCondition.type:"), message
    assert kind in message and "allowKubeletCondition: true" in message, message


@pytest.mark.parametrize("kind", KUBELET)
def test_with_the_opt_in_it_is_a_rule_like_any_other(kind: str) -> None:
    spec = {"rules": [rule({"type": kind, "status": "Unknown", "allowKubeletCondition": True})]}
    (parsed,) = policies.parse_policy("p", 1, spec).rules
    assert parsed.condition == vocabulary.node_condition(kind, "Unknown")


def test_the_opt_in_must_be_a_boolean_and_is_not_needed_for_another_tools_condition() -> None:
    with pytest.raises(ValueError, match=re.escape("spec.rules[0].nodeCondition.allowKubeletCondition")):
        policies.parse_policy("p", 1, {"rules": [rule({"type": "Ready", "allowKubeletCondition": "yes"})]})
    (parsed,) = policies.parse_policy("p", 1, {"rules": [rule({"type": "KernelDeadlock"})]}).rules
    assert parsed.condition == vocabulary.node_condition("KernelDeadlock")


def not_ready(node: dict[str, Any]) -> None:
    node.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "False", "reason": "Blip"}]


def test_the_operator_refuses_a_kubelet_condition_policy_and_says_so_on_its_status() -> None:
    """A policy the API server let through (an older CRD): its status says why, no node is touched."""

    async def scenario() -> None:
        fleet = MemoryFleet([rule({"type": "Ready", "status": "False"})])
        await fleet.start(["n"])
        await fleet.deliver("n", gpunode_facts.agent_status())
        await fleet.edit_node("n", not_ready)
        await fleet.tick(30)
        assert not fleet.cordoned("n")
        status = fleet.cluster.policies["p"]["status"]
        (ready,) = [c for c in status["conditions"] if c["type"] == vocabulary.PolicyConditionType.READY]
        assert ready["status"] == "False"
        assert ready["reason"] == vocabulary.PolicyConditionReason.INVALID_SPEC
        assert "allowKubeletCondition: true" in ready["message"], ready["message"]

    asyncio.run(scenario())


def test_with_the_opt_in_the_operator_acts_on_it() -> None:
    async def scenario() -> None:
        fleet = MemoryFleet([rule({"type": "Ready", "status": "False", "allowKubeletCondition": True})])
        await fleet.start(["n"])
        await fleet.deliver("n", gpunode_facts.agent_status())
        await fleet.edit_node("n", not_ready)
        await fleet.tick(30)
        assert fleet.cordoned("n")

    asyncio.run(scenario())


def test_the_crd_and_the_chart_name_the_same_kubelet_conditions() -> None:
    # CEL holds the list as a literal in two places: the CRD's rule and the chart's admission policy.
    literal = "[" + ", ".join(f"'{kind}'" for kind in vocabulary.KUBELET_NODE_CONDITIONS) + "]"
    assert tuple(KUBELET) == vocabulary.KUBELET_NODE_CONDITIONS
    for path in (
        ROOT / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml",
        ROOT / "charts" / "gpu-health" / "templates" / "privileged-policies.yaml",
    ):
        assert literal in path.read_text(), path
