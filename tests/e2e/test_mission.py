"""The mission, end to end, as a user meets it: chart installed, operator and agents running for real.

Each test gives its own kwok GPU nodes a scenario file (DESIGN.md "Simulated
GPUs"), starts one `gpu-health-agent` process per node and a policy selecting
only those nodes, and then watches what a cluster user would see: Node
cordon, labels and annotations, pods evicted or left in place, Events,
GPUNode status and `kubectl get gpunodes`. The operator is one
`gpu-health-operator` process for the module; every process authenticates
with a token of the chart's own service accounts (fixtures in conftest.py),
so these tests also prove the chart's RBAC and admission policy suffice.

Timings are shortened (`forSeconds`, `healthyForSeconds` of a few seconds,
agents collecting every second) so the module runs in minutes; waits poll
with deadlines, never sleep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pytest
import yaml

from gpuhealth_api import keys, vocabulary

pytestmark = pytest.mark.e2e

MODEL: Final = "NVIDIA H100 80GB HBM3"
DRIVER: Final = "570.124.06"
BUSY: Final = {
    "temperatureCelsius": 45,
    "smClockMHz": 1980,
    "maxSmClockMHz": 1980,
    "powerWatts": 520,
    "utilizationPercent": 96,
}
DBE: Final = {"eccUncorrectedVolatile": 1, "eccUncorrectedAggregate": 1, "retiredPagesPending": True}
HOT: Final = {"temperatureCelsius": 91, "clockEventReasons": ["HwThermalSlowdown"], "smClockMHz": 1600}
COOL: Final = {"temperatureCelsius": 50, "clockEventReasons": [], "smClockMHz": 1980}
CRITICAL_XIDS: Final = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120]

ECC_RULE: Final = {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}
XID_RULE: Final = {"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": CRITICAL_XIDS}
LOST_RULE: Final = {"name": "lost", "condition": "GPULost", "action": "Drain"}
THERMAL_RULE: Final = {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 2}
STRAGGLER_RULE: Final = {
    "name": "straggler",
    "condition": "Straggler",
    "action": "Label",
    "forSeconds": 2,
    "threshold": 3.5,
}
DRAIN: Final = {"timeoutSeconds": 120, "force": True}
"""force: the lost node's victim is a bare pod (no controller)."""
NO_RECOVERY: Final = {"uncordon": True, "healthyForSeconds": 600}
QUICK_RECOVERY: Final = {"uncordon": True, "healthyForSeconds": 2}

ACTION_TIMEOUT_SECONDS: Final = 45.0
"""From starting the agents to the operator's action: agent start-up, first report, forSeconds, a drain."""
COOL_AFTER: Final = "20s"
"""When the thermal scenarios cool down: well after the label must have appeared."""
TTL_ANNOTATION: Final = "node.alpha.kubernetes.io/ttl"
"""Set on every new Node by kube-controller-manager's TTL controller, shortly after it is created."""


def scenario(timeline: Sequence[Mapping[str, Any]] = (), *, defaults: Mapping[str, Any] | None = None) -> str:
    """A scenario file for an 8-GPU H100 node under load, with `timeline` entries (`after` strings)."""
    return yaml.safe_dump(
        {
            "gpus": 8,
            "model": MODEL,
            "driverVersion": DRIVER,
            "defaults": {**BUSY, **(defaults or {})},
            "timeline": list(timeline),
        },
        sort_keys=False,
    )


HEALTHY: Final = scenario()


def policy_spec(*rules: Mapping[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "dryRun": spec.pop("dryRun", False),
        "maxUnavailable": spec.pop("maxUnavailable", 1),
        "rules": list(rules),
        "drain": spec.pop("drain", DRAIN),
        "recovery": spec.pop("recovery", NO_RECOVERY),
        "breaker": spec.pop("breaker", {"maxNewUnhealthy": "100%"}),  # these faults are no storm
        **spec,
    }


def node_condition(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The operator's GPUHealthy condition on a Node, for other tools (NHC, autoscalers) to read."""
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == keys.NODE_CONDITION_TYPE:
            found: dict[str, Any] = condition
            return found
    return None


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    return any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])


# -- fatal faults: cordon and drain -------------------------------------------------------------------


def test_double_bit_ecc_error_cordons_and_drains_the_node(mission: Any) -> None:
    sick, spare = mission.add_nodes("sick", "spare")
    workload = mission.place_workload(sick, spares=[spare])
    policy = mission.policy(**policy_spec(ECC_RULE))
    mission.start_agents({sick: scenario([{"after": "2s", "gpu": 3, "set": DBE}]), spare: HEALTHY})

    status = mission.wait(
        lambda: (s := mission.gpunode_status(sick)).get("action") == vocabulary.NodeAction.DRAINED and s,
        "the sick node Drained",
        ACTION_TIMEOUT_SECONDS,
    )
    assert status["health"] == vocabulary.Health.UNHEALTHY
    assert status["issues"] == vocabulary.Condition.ECC_UNCORRECTABLE
    node = mission.node(sick)
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == policy
    assert node["metadata"]["labels"][keys.HEALTH_LABEL] == "unhealthy"

    # The workload moved to the spare node through its PDB; the chart's agent pod stayed.
    pods = mission.wait(
        lambda: (
            (p := mission.workload_pods(workload))
            and all(pod["node"] == spare and pod["phase"] == "Running" for pod in p)
            and p
        ),
        "the workload running again, on the spare node only",
    )
    assert len(pods) == 1
    left = mission.pods_on(sick)
    assert left and all(is_daemonset_pod(pod) for pod in left), [p["metadata"]["name"] for p in left]
    assert any(pod["metadata"]["namespace"] == "gpu-health-e2e-mission" for pod in left)

    expected = {
        vocabulary.EventReason.NODE_CORDONED,
        vocabulary.EventReason.NODE_DRAINED,
        vocabulary.Condition.ECC_UNCORRECTABLE,
    }
    mission.wait(lambda: expected <= mission.reasons(sick), f"Events {sorted(expected)} on the sick node")
    # One Event per transition: `kubectl describe node` is not flooded while the fault persists.
    reasons = [e["reason"] for e in mission.events(sick)]
    assert len(reasons) == len(set(reasons)), sorted(reasons)
    # A pass writes the Node condition after the GPUNode status, and the healthy passes before the
    # fault left GPUHealthy=True: wait for the value itself.
    mission.wait(
        lambda: (
            ((c := node_condition(mission.node(sick)) or {}).get("status"), c.get("reason"))
            == ("False", vocabulary.Condition.ECC_UNCORRECTABLE)
        ),
        "GPUHealthy False (EccUncorrectable) on the drained Node",
    )
    assert not mission.cordoned(spare)
    # The spare's agent is another process, started after the sick node's: its verdict may still come.
    mission.wait(
        lambda: mission.gpunode_status(spare).get("health") == vocabulary.Health.HEALTHY,
        "the spare node judged Healthy",
    )
    assert mission.labels(spare).get(keys.HEALTH_LABEL) == "healthy"


def test_xid_79_gpu_fallen_off_the_bus_drains_the_node(mission: Any) -> None:
    (lost,) = mission.add_nodes("lost")
    victim = mission.bare_pod(lost)
    mission.policy(**policy_spec(XID_RULE, LOST_RULE))
    mission.start_agents({lost: scenario([{"after": "2s", "gpu": 6, "xid": 79}])})

    status = mission.wait(
        lambda: (s := mission.gpunode_status(lost)).get("action") == vocabulary.NodeAction.DRAINED and s,
        "the node with a lost GPU Drained",
        ACTION_TIMEOUT_SECONDS,
    )
    issues = set(status["issues"].split(","))
    assert {vocabulary.Condition.XID_CRITICAL, vocabulary.Condition.GPU_LOST} <= issues, status["issues"]
    assert status["health"] == vocabulary.Health.UNHEALTHY
    gpu6 = next(g for g in status["gpus"] if g["index"] == 6)
    assert gpu6["lost"] is True
    assert 79 in {x["code"] for x in gpu6["xids"]}
    assert mission.cordoned(lost)
    mission.wait(lambda: not mission.pod_exists(victim), "the pod on the node evicted")
    expected = {
        vocabulary.Condition.XID_CRITICAL,
        vocabulary.Condition.GPU_LOST,
        vocabulary.EventReason.NODE_CORDONED,
        vocabulary.EventReason.NODE_DRAINED,
    }
    mission.wait(lambda: expected <= mission.reasons(lost), f"Events {sorted(expected)}")


# -- sustained conditions: labels -------------------------------------------------------------------


def test_thermal_throttling_labels_the_node_until_it_cools_down(mission: Any) -> None:
    hot, cool = mission.add_nodes("hot", "cool")
    mission.policy(**policy_spec(THERMAL_RULE, recovery=QUICK_RECOVERY))
    mission.start_agents(
        {
            hot: scenario(
                [{"after": "1s", "gpu": 2, "set": HOT}, {"after": COOL_AFTER, "gpu": 2, "set": COOL}]
            ),
            cool: HEALTHY,
        }
    )

    mission.wait(
        lambda: mission.labels(hot).get(keys.THERMAL_LABEL) == "true",
        "the thermal-throttled label on the hot node",
        ACTION_TIMEOUT_SECONDS,
    )
    # The operator writes the Node before GPUNode status: the verdict may trail the label a moment.
    status = mission.wait(
        lambda: (s := mission.gpunode_status(hot)).get("action") == vocabulary.NodeAction.LABELED and s,
        "GPUNode action Labeled",
    )
    assert status["health"] == vocabulary.Health.DEGRADED
    assert vocabulary.Condition.THERMAL_THROTTLED in status["issues"].split(",")
    assert not mission.cordoned(hot)
    assert mission.labels(hot).get(keys.HEALTH_LABEL) == "degraded"
    assert keys.THERMAL_LABEL not in mission.labels(cool)
    assert vocabulary.Condition.THERMAL_THROTTLED in mission.reasons(hot)

    # After the scenario cools GPU 2 down, the label goes (no one removes it by hand).
    mission.wait(
        lambda: keys.THERMAL_LABEL not in mission.labels(hot),
        "the thermal-throttled label removed after cooling",
        ACTION_TIMEOUT_SECONDS,
    )
    mission.wait(
        lambda: mission.gpunode_status(hot).get("health") == vocabulary.Health.HEALTHY,
        "the cooled node Healthy again",
    )
    mission.wait(
        lambda: mission.labels(hot).get(keys.HEALTH_LABEL) == "healthy", "health label healthy again"
    )
    assert not mission.cordoned(hot)


def test_straggler_among_five_nodes_is_labelled(mission: Any) -> None:
    slow, *peers = mission.add_nodes("slow", "peer-0", "peer-1", "peer-2", "peer-3")
    mission.policy(**policy_spec(STRAGGLER_RULE))
    # Healthy peers spread a little, as real boards do; the straggler is capped at 1410 MHz under load.
    scenarios = {peer: scenario(defaults={"smClockMHz": 1980 - 15 * i}) for i, peer in enumerate(peers)}
    scenarios[slow] = scenario(defaults={"smClockMHz": 1410, "clockEventReasons": ["SwPowerCap"]})
    mission.start_agents(scenarios)

    mission.wait(
        lambda: mission.labels(slow).get(keys.STRAGGLER_LABEL) == "true",
        "the straggler label on the slow node",
        ACTION_TIMEOUT_SECONDS,
    )
    # The label is patched before the GPUNode status is written in the same pass: wait for the verdict.
    status = mission.wait(
        lambda: (
            vocabulary.Condition.STRAGGLER in ((s := mission.gpunode_status(slow)).get("issues") or "") and s
        ),
        "Straggler in the slow node's GPUNode issues",
    )
    straggler = status["straggler"]
    assert straggler["peers"] == 4
    assert straggler["zScore"] < -3.5
    for peer in peers:
        assert keys.STRAGGLER_LABEL not in mission.labels(peer), peer
        # Each peer's score lands with its own pass, which may trail the slow node's.
        score = mission.wait(
            lambda peer=peer: mission.gpunode_status(peer).get("straggler"), f"a straggler score on {peer}"
        )
        assert score["zScore"] > -3.5, peer
    assert not mission.cordoned(slow)
    mission.wait(
        lambda: vocabulary.Condition.STRAGGLER in mission.reasons(slow), "a Straggler Event on the slow node"
    )


# -- safety rails -------------------------------------------------------------------------------------


def test_disruption_budget_holds_with_three_failing_nodes(mission: Any) -> None:
    nodes = mission.add_nodes("a", "b", "c")
    policy = mission.policy(**policy_spec(ECC_RULE, maxUnavailable=1))
    mission.start_agents({node: scenario([{"after": "1s", "gpu": 0, "set": DBE}]) for node in nodes})
    seen_cordoned: set[int] = set()

    def settled() -> tuple[list[str], list[str]] | None:
        cordoned = [n for n in nodes if mission.cordoned(n)]
        seen_cordoned.add(len(cordoned))
        actions = {n: mission.gpunode_status(n).get("action") for n in nodes}
        pending = [n for n, a in actions.items() if a == vocabulary.NodeAction.PENDING]
        if len(cordoned) == 1 and actions[cordoned[0]] == vocabulary.NodeAction.DRAINED and len(pending) == 2:
            return cordoned, pending
        return None

    cordoned, pending = mission.wait(settled, "one node drained and two Pending", ACTION_TIMEOUT_SECONDS)
    assert max(seen_cordoned) <= 1, f"more than maxUnavailable=1 cordoned at some point: {seen_cordoned}"
    for node in pending:
        mission.wait(
            lambda node=node: vocabulary.EventReason.BUDGET_EXCEEDED in mission.reasons(node),
            f"a DisruptionBudgetExceeded Event on {node}",
        )
        assert not mission.cordoned(node)
        assert mission.gpunode_status(node)["health"] == vocabulary.Health.UNHEALTHY
    assert [n for n in nodes if mission.cordoned(n)] == cordoned
    # Events record every cordon, also one too brief for the polling above to see.
    ever_cordoned = [n for n in nodes if vocabulary.EventReason.NODE_CORDONED in mission.reasons(n)]
    assert ever_cordoned == cordoned
    counts = {"selectedNodes": 3, "unhealthyNodes": 3, "cordonedNodes": 1, "pendingNodes": 2}
    mission.wait(
        lambda: (s := mission.policy_status(policy)) and {k: s.get(k) for k in counts} == counts and s,
        f"policy status counts {counts}",
    )


def test_dry_run_changes_nothing_on_the_node(mission: Any) -> None:
    (sick,) = mission.add_nodes("sick")
    # Kubernetes' TTL controller annotates a new Node shortly after creation: snapshot after that.
    before = mission.wait(
        lambda: TTL_ANNOTATION in ((n := mission.node(sick))["metadata"].get("annotations") or {}) and n,
        f"{TTL_ANNOTATION} on the new Node",
    )
    mission.policy(**policy_spec(ECC_RULE, dryRun=True))
    mission.start_agents({sick: scenario([{"after": "1s", "gpu": 1, "set": DBE}])})

    status = mission.wait(
        lambda: (s := mission.gpunode_status(sick)).get("action") == vocabulary.NodeAction.DRY_RUN and s,
        "GPUNode action DryRun",
        ACTION_TIMEOUT_SECONDS,
    )
    assert status["health"] == vocabulary.Health.UNHEALTHY
    assert status["issues"] == vocabulary.Condition.ECC_UNCORRECTABLE
    dry_run = mission.wait(
        lambda: [e for e in mission.events(sick) if e["reason"] == vocabulary.EventReason.DRY_RUN],
        "a DryRun Event on the node",
    )
    assert "cordon" in dry_run[0]["message"].lower(), dry_run[0]["message"]
    after = mission.node(sick)
    assert after["metadata"].get("labels") == before["metadata"].get("labels")
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["spec"] == before["spec"]
    conditions = {c["type"] for c in after["status"].get("conditions") or []}
    assert keys.NODE_CONDITION_TYPE not in conditions


def test_recovery_uncordons_only_the_node_the_operator_cordoned(mission: Any) -> None:
    ours, humans = mission.add_nodes("ours", "humans")
    mission.cp.kubectl("cordon", humans)  # an administrator's maintenance, before gpu-health saw anything
    policy = mission.policy(**policy_spec(ECC_RULE, maxUnavailable=2, recovery=QUICK_RECOVERY))
    # Both get a DBE that a GPU reset clears; the human's node recovers first, so by the time ours
    # is uncordoned it has been healthy for longer than healthyForSeconds.
    mission.start_agents(
        {
            ours: scenario(
                [{"after": "1s", "gpu": 4, "set": DBE}, {"after": "14s", "gpu": 4, "reset": True}]
            ),
            humans: scenario(
                [{"after": "1s", "gpu": 4, "set": DBE}, {"after": "8s", "gpu": 4, "reset": True}]
            ),
        }
    )

    mission.wait(
        lambda: (
            mission.node(ours)["metadata"].get("annotations", {}).get(keys.CORDONED_BY_ANNOTATION) == policy
            and mission.cordoned(ours)
        ),
        "our node cordoned by the policy",
        ACTION_TIMEOUT_SECONDS,
    )
    mission.wait(
        lambda: not mission.cordoned(ours), "our node uncordoned after the reset", ACTION_TIMEOUT_SECONDS
    )
    mission.wait(
        lambda: vocabulary.EventReason.NODE_UNCORDONED in mission.reasons(ours),
        "a NodeUncordoned Event on our node",
    )
    assert keys.CORDONED_BY_ANNOTATION not in (mission.node(ours)["metadata"].get("annotations") or {})
    status = mission.wait(
        lambda: (s := mission.gpunode_status(ours)).get("action") == vocabulary.NodeAction.NONE and s,
        "GPUNode action back to None",
    )
    assert status["health"] == vocabulary.Health.HEALTHY
    assert mission.labels(ours).get(keys.HEALTH_LABEL) == "healthy"
    assert mission.gpunode_status(humans)["health"] == vocabulary.Health.HEALTHY
    human_node = mission.node(humans)
    assert human_node["spec"].get("unschedulable") is True, "a node a human cordoned must stay cordoned"
    assert keys.CORDONED_BY_ANNOTATION not in (human_node["metadata"].get("annotations") or {})
    assert vocabulary.EventReason.NODE_UNCORDONED not in mission.reasons(humans)


# -- what `kubectl get gpunodes` shows ----------------------------------------------------------------

COLUMNS: Final = ["NAME", "GPUS", "MODEL", "HEALTH", "ISSUES", "ACTION", "MAXTEMP", "AGE"]


def table(text: str) -> list[list[str]]:
    """kubectl's columns are separated by two or more spaces (a model name holds single spaces)."""
    return [re.split(r" {2,}", line.strip()) for line in text.strip().splitlines()]


def test_kubectl_get_gpunodes_shows_the_documented_columns(mission: Any) -> None:
    sick, hot = mission.add_nodes("sick", "hot")
    mission.policy(**policy_spec(ECC_RULE, {**THERMAL_RULE, "forSeconds": 1}))
    mission.start_agents(
        {
            sick: scenario([{"after": "1s", "gpu": 3, "set": DBE}]),
            hot: scenario([{"after": "1s", "gpu": 1, "set": HOT}]),
        }
    )

    def rows() -> dict[str, list[str]] | None:
        result = mission.cp.kubectl("get", "gpunodes", sick, hot, check=False)
        if result.returncode != 0:  # the agents have not created both GPUNodes yet
            return None
        lines = table(result.stdout)
        assert lines[0] == COLUMNS, lines[0]
        # A row with an empty column (no ISSUES yet) splits short: not done, whatever it holds.
        by_name = {line[0]: line for line in lines[1:] if len(line) == len(COLUMNS)}
        done = by_name.get(sick, [""] * 6)[5] == "Drained" and by_name.get(hot, [""] * 6)[5] == "Labeled"
        return by_name if done else None

    by_name = mission.wait(rows, "kubectl get gpunodes shows Drained and Labeled", ACTION_TIMEOUT_SECONDS)
    assert by_name[sick][:7] == [sick, "8", MODEL, "Unhealthy", "EccUncorrectable", "Drained", "45"]
    assert by_name[hot][:7] == [hot, "8", MODEL, "Degraded", "ThermalThrottled", "Labeled", "91"]
    for row in by_name.values():
        assert re.fullmatch(r"\d+s", row[7]), row
    # The short name works too, and -o json carries the same verdicts.
    short = json.loads(mission.cp.kubectl("get", "gn", sick, "-o", "json").stdout)
    assert short["status"]["action"] == "Drained"


def test_nvlink_aer_and_nic_faults_reach_the_node_through_the_real_agent(mission: Any) -> None:
    """Issue 27's facts end to end: the real agent (sim backend: pynvml's NVLink and fabric calls, a
    sysfs tree the production reader reads) reports them, and the chart's operator acts on the Node."""
    links, aer, nic, board = mission.add_nodes("links", "aer", "nic", "pcie-board")
    mission.policy(
        **policy_spec(
            {"name": "nvlink", "condition": "NvLinkDegraded", "action": "Taint"},
            {"name": "aer", "condition": "PcieErrors", "action": "Cordon"},
            {"name": "nic", "condition": "NicDegraded", "action": "Label"},
            maxUnavailable=4,
        )
    )
    nics = [{"name": f"mlx5_{i}", "rateGbps": 400} for i in range(2)]
    mission.start_agents(
        {
            links: scenario([{"after": "2s", "gpu": 4, "set": {"nvlinkLinksDown": 2}}]),
            aer: scenario([{"after": "2s", "gpu": 6, "set": {"pcieAerFatal": 1}}]),
            nic: yaml.safe_dump(
                {
                    **yaml.safe_load(HEALTHY),
                    "nics": nics,
                    "timeline": [{"after": "2s", "nic": "mlx5_1", "set": {"state": "DOWN", "linkDowned": 1}}],
                },
                sort_keys=False,
            ),
            board: scenario(defaults={"nvlinks": 0}),  # a PCIe board: no NVLink, no fabric
        }
    )

    def tainted(name: str) -> str | None:
        taints = mission.node(name)["spec"].get("taints") or []
        return next((t.get("value") for t in taints if t["key"] == keys.UNHEALTHY_TAINT), None)

    mission.wait(lambda: tainted(links) == "NvLinkDegraded", "NvLinkDegraded taint", ACTION_TIMEOUT_SECONDS)
    mission.wait(lambda: mission.cordoned(aer), "the AER node cordoned", ACTION_TIMEOUT_SECONDS)
    mission.wait(
        lambda: "NicDegraded" in (mission.gpunode_status(nic).get("issues") or "").split(","),
        "NicDegraded on the NIC node",
        ACTION_TIMEOUT_SECONDS,
    )
    # The operator writes the Node before the GPUNode status and the Events: those may trail a moment.
    mission.wait(lambda: mission.labels(nic).get(keys.HEALTH_LABEL) == "degraded", "degraded label")
    assert not mission.cordoned(links) and not mission.cordoned(nic), "taint and label rules cordon nothing"
    mission.wait(
        lambda: "PcieErrors" in (mission.gpunode_status(aer).get("issues") or "").split(","), "PcieErrors"
    )
    mission.wait(lambda: {"NvLinkDegraded"} <= mission.reasons(links), "NvLinkDegraded Event")
    mission.wait(lambda: {"PcieErrors", "NodeCordoned"} <= mission.reasons(aer), "AER Events")
    # The board without the features reports none of them and stays healthy.
    status = mission.wait(
        lambda: mission.gpunode_status(board).get("health") and mission.gpunode_status(board), "board"
    )
    assert status["health"] == vocabulary.Health.HEALTHY, status
    assert all("nvlink" not in gpu and "fabric" not in gpu for gpu in status["gpus"]), status["gpus"][0]
    assert not mission.cordoned(board) and tainted(board) is None
