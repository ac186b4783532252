"""The operator against a real API server: GPU faults in GPUNode status become Node actions.

One operator process serves the whole module (started once, as in
production: `python -m gpuhealth_operator --kubeconfig ...`). Each test makes
its own kwok Nodes with a label unique to the test and a policy selecting
only them, writes GPUNode status as the agent would (server-side apply under
the agent's field manager), and watches what a cluster user would see: Node
labels, taints, cordon, pods, Events, GPUNode and policy status.
"""

import contextlib
import datetime
import time
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ECC = {"ecc": {"uncorrectedVolatile": 1}}
HOT = {"temperatureCelsius": 93, "clockEventReasons": ["HwThermalSlowdown"], "smClockMHz": 1400}
COOL = {"temperatureCelsius": 80, "clockEventReasons": [], "smClockMHz": 1980}
TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"
"""Set on every new Node by kube-controller-manager's TTL controller, shortly after it is created."""


operator = operator_fixtures.operator_fixture("it")
fleet = operator_fixtures.fleet_fixture("op")


def policy_spec(*rules: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "maxUnavailable": spec.pop("maxUnavailable", 2),
        "rules": list(rules),
        "drain": spec.pop("drain", {"timeoutSeconds": 30, "force": True}),  # make_pod has no controller
        "recovery": spec.pop("recovery", {"uncordon": True, "healthyForSeconds": 1}),
        **spec,
    }


def node_name(fleet: operator_harness.Fleet, suffix: str) -> str:
    return f"{fleet.label}-{suffix}"[:63]


def cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))


def labels(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("labels") or {}


def settled_node(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    """The Node once Kubernetes' own controllers are done with it (the TTL controller annotates it)."""
    node: dict[str, Any] = waiting.wait_until(
        lambda: TTL_ANNOTATION in ((n := fleet.node(name))["metadata"].get("annotations") or {}) and n,
        timeout_seconds=TIMEOUT,
        message=f"{TTL_ANNOTATION} on Node {name}",
    )
    return node


def node_condition(fleet: operator_harness.Fleet, name: str) -> dict[str, Any] | None:
    for condition in fleet.node(name).get("status", {}).get("conditions") or []:
        if condition["type"] == keys.NODE_CONDITION_TYPE:
            return condition
    return None


def gpunode_status(fleet: operator_harness.Fleet, name: str) -> dict[str, Any]:
    return fleet.gpunode(name).get("status") or {}


def wait_action(fleet: operator_harness.Fleet, name: str, action: str) -> None:
    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("action") == action,
        timeout_seconds=TIMEOUT,
        message=f"action {action}",
    )


def reasons(fleet: operator_harness.Fleet, name: str) -> set[str]:
    return {e["reason"] for e in fleet.events(name)}


def make_pod(
    k8s: client.ApiClient, namespace: str, name: str, node: str, labels_: dict[str, str] | None = None
) -> None:
    body = client.V1Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": namespace, "labels": labels_ or {"app": name}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    assert body is not None
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)


def pod_phase(k8s: client.ApiClient, namespace: str, name: str) -> str | None:
    try:
        pod = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    if pod.metadata and pod.metadata.deletion_timestamp:
        return "Terminating"
    return pod.status.phase if pod.status else None


def pods_on(k8s: client.ApiClient, node: str) -> list[str]:
    pods = client.CoreV1Api(k8s).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
    return sorted(p.metadata.name for p in pods.items if p.metadata and p.metadata.name)


def test_ecc_uncorrectable_drains_node_but_keeps_daemonset_pods(
    fleet: operator_harness.Fleet, k8s: client.ApiClient, namespace: str
) -> None:
    name = node_name(fleet, "ecc")
    fleet.add_node(name)
    fleet.policy(
        fleet.label, policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"})
    )
    make_pod(k8s, namespace, "workload", name)
    daemonset = client.V1DaemonSet.from_dict(
        {
            "metadata": {"name": "node-agent", "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": {"app": "node-agent"}},
                "template": {
                    "metadata": {"labels": {"app": "node-agent"}},
                    "spec": {
                        "nodeSelector": {operator_harness.Fleet.LABEL_KEY: fleet.label},
                        "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }
    )
    assert daemonset is not None
    client.AppsV1Api(k8s).create_namespaced_daemon_set(namespace, daemonset)
    waiting.wait_until(
        lambda: pod_phase(k8s, namespace, "workload") == "Running",
        timeout_seconds=TIMEOUT,
        message="workload runs",
    )
    waiting.wait_until(
        lambda: any(p.startswith("node-agent") for p in pods_on(k8s, name)),
        timeout_seconds=TIMEOUT,
        message="daemonset pod on the node",
    )
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.HEALTH_LABEL) == "healthy",
        timeout_seconds=TIMEOUT,
        message="healthy label on a healthy node",
    )
    assert not cordoned(fleet, name)

    fleet.report(name, gpunode_facts.agent_status(overrides={3: ECC}))

    waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="node cordoned")
    node = fleet.node(name)
    assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
    assert node["metadata"]["labels"][keys.HEALTH_LABEL] == "unhealthy"
    waiting.wait_until(
        lambda: pod_phase(k8s, namespace, "workload") is None,
        timeout_seconds=TIMEOUT,
        message="workload evicted",
    )
    status = waiting.wait_until(
        lambda: (s := gpunode_status(fleet, name)).get("action") == "Drained" and s,
        timeout_seconds=TIMEOUT,
        message="action Drained",
    )
    assert status["health"] == "Unhealthy"
    assert status["issues"] == "EccUncorrectable"
    ecc = next(c for c in status["conditions"] if c["type"] == "EccUncorrectable")
    assert ecc["status"] == "True"
    assert any(p.startswith("node-agent") for p in pods_on(k8s, name)), "DaemonSet pod must not be evicted"
    # The healthy pass left GPUHealthy=True, and a pass writes the Node condition after the GPUNode
    # status: wait for the value itself, not for the condition to exist.
    waiting.wait_until(
        lambda: (
            ((c := node_condition(fleet, name) or {}).get("status"), c.get("reason"))
            == ("False", "EccUncorrectable")
        ),
        timeout_seconds=TIMEOUT,
        message="GPUHealthy False (EccUncorrectable)",
    )
    waiting.wait_until(
        lambda: {"EccUncorrectable", "NodeCordoned", "NodeDrained"} <= reasons(fleet, name),
        timeout_seconds=TIMEOUT,
        message="condition, cordon and drain Events",
    )
    event = fleet.events(name, "NodeCordoned")[0]
    assert event["related"]["kind"] == resources.GPUNODE_KIND
    assert event["reportingComponent"] == "gpu-health-operator"


@pytest.mark.parametrize(
    ("condition", "gpu", "rule", "expect"),
    [
        (
            "XidCritical",
            {"xids": [{"code": 79, "count": 1, "lastSeen": "NOW"}]},
            {"action": "Cordon"},
            "cordon",
        ),
        ("RowRemapFailure", {"remappedRows": {"failure": True}}, {"action": "Taint"}, "taint"),
        ("GPULost", {"lost": True}, {"action": "Cordon"}, "cordon"),
        ("RecoveryRequired", {"recoveryAction": "NodeReboot"}, {"action": "Taint"}, "taint"),
        ("ThermalThrottled", HOT, {"action": "Label", "forSeconds": 1}, "thermal-label"),
        (
            "PowerThrottled",
            {"clockEventReasons": ["HwPowerBrakeSlowdown"], "smClockMHz": 1200},
            {"action": "Event", "forSeconds": 1},
            "event",
        ),
        ("PcieDegraded", {"pcie": {"width": 4}}, {"action": "Event", "forSeconds": 1}, "event"),
    ],
)
def test_condition_triggers_its_rule_action(
    fleet: operator_harness.Fleet, condition: str, gpu: dict[str, Any], rule: dict[str, Any], expect: str
) -> None:
    name = node_name(fleet, "n")
    fleet.add_node(name)
    fleet.policy(fleet.label, policy_spec({"name": "rule", "condition": condition, **rule}))
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.HEALTH_LABEL) == "healthy",
        timeout_seconds=TIMEOUT,
        message="judged healthy",
    )
    if "xids" in gpu:
        gpu = {"xids": [{**gpu["xids"][0], "lastSeen": gpunode_facts.rfc3339()}]}
    fleet.report(name, gpunode_facts.agent_status(overrides={1: gpu}))

    waiting.wait_until(
        lambda: condition in reasons(fleet, name), timeout_seconds=TIMEOUT, message=f"{condition} Event"
    )
    status = waiting.wait_until(
        lambda: (s := gpunode_status(fleet, name)).get("issues") and s,
        timeout_seconds=TIMEOUT,
        message="issues in status",
    )
    assert condition in status["issues"].split(",")
    node = fleet.node(name)
    taints = {t["key"]: t.get("value") for t in node["spec"].get("taints") or []}
    if expect == "cordon":
        waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="cordoned")
        waiting.wait_until(
            lambda: gpunode_status(fleet, name).get("action") == "Cordoned",
            timeout_seconds=TIMEOUT,
            message="action Cordoned",
        )
    elif expect == "taint":
        node = waiting.wait_until(
            lambda: (n := fleet.node(name))["spec"].get("taints") and n,
            timeout_seconds=TIMEOUT,
            message="tainted",
        )
        taints = {t["key"]: (t.get("value"), t["effect"]) for t in node["spec"]["taints"]}
        assert taints[keys.UNHEALTHY_TAINT] == (condition, "NoSchedule")
        assert not node["spec"].get("unschedulable")
        wait_action(fleet, name, "Tainted")
    elif expect == "thermal-label":
        waiting.wait_until(
            lambda: labels(fleet, name).get(keys.THERMAL_LABEL) == "true",
            timeout_seconds=TIMEOUT,
            message="thermal label",
        )
        assert labels(fleet, name)[keys.HEALTH_LABEL] == "degraded"
        assert not cordoned(fleet, name)
        wait_action(fleet, name, "Labeled")
    else:
        assert not cordoned(fleet, name)
        assert keys.UNHEALTHY_TAINT not in taints
        wait_action(fleet, name, "Event")


def test_budget_holds_at_most_max_unavailable_and_admits_waiting_nodes_as_it_frees(
    fleet: operator_harness.Fleet,
) -> None:
    names = [node_name(fleet, f"b{i}") for i in range(4)]
    for name in names:
        fleet.add_node(name)
    fleet.policy(
        fleet.label,
        policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}, maxUnavailable=2),
    )
    for name in names:
        waiting.wait_until(
            lambda n=name: labels(fleet, n).get(keys.HEALTH_LABEL), timeout_seconds=TIMEOUT, message="judged"
        )

    for name in names:
        fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))

    def held() -> list[str]:
        return [n for n in names if cordoned(fleet, n)]

    waiting.wait_until(lambda: len(held()) == 2, timeout_seconds=TIMEOUT, message="two nodes cordoned")
    queued = [n for n in names if n not in held()]
    for name in queued:
        waiting.wait_until(
            lambda n=name: gpunode_status(fleet, n).get("action") == "Pending",
            timeout_seconds=TIMEOUT,
            message="Pending",
        )
        waiting.wait_until(
            lambda n=name: "DisruptionBudgetExceeded" in reasons(fleet, n),
            timeout_seconds=TIMEOUT,
            message="DisruptionBudgetExceeded",
        )
        # The Event says who holds the budget, so a human knows what to free (or, when it was
        # judged before the others were cordoned, that worse or older faults go first).
        (wait,) = fleet.events(name, "DisruptionBudgetExceeded")
        message = wait["message"]
        assert "maxUnavailable=2" in message, message
        assert all(f"{h} (" in message for h in held()) or "older faults first" in message, message
    waiting.holds(lambda: len(held()) <= 2, seconds=2, message="at most maxUnavailable=2 nodes held")
    # The timer writes the policy's status after the node passes: poll for the counts.
    counts = {"cordonedNodes": 2, "pendingNodes": 2, "selectedNodes": 4}

    def policy_counts() -> dict[str, Any]:
        policy = fleet.custom.get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
        )
        assert isinstance(policy, dict)
        return {k: (policy.get("status") or {}).get(k) for k in counts}

    waiting.wait_until(
        lambda: policy_counts() == counts, timeout_seconds=TIMEOUT, message=f"policy status counts {counts}"
    )

    # A cordoned node recovers (GPU reset: volatile count back to 0): uncordoned, a waiting one moves up.
    first = held()[0]
    fleet.report(first, gpunode_facts.agent_status())
    waiting.wait_until(
        lambda: not cordoned(fleet, first), timeout_seconds=TIMEOUT, message="recovered node uncordoned"
    )
    # The Event is posted after the uncordon patch: poll for it.
    waiting.wait_until(
        lambda: "NodeUncordoned" in reasons(fleet, first),
        timeout_seconds=TIMEOUT,
        message="NodeUncordoned Event",
    )
    assert keys.CORDONED_BY_ANNOTATION not in (fleet.node(first)["metadata"].get("annotations") or {})
    waiting.wait_until(
        lambda: len(held()) == 2 and first not in held(),
        timeout_seconds=TIMEOUT,
        message="a waiting node admitted",
    )
    # Which nodes were held first depends on reconcile order, so name the admitted one by what it was.
    (admitted,) = [n for n in held() if n in queued]
    assert len(fleet.events(admitted, "DisruptionBudgetExceeded")) == 1
    waiting.holds(lambda: len(held()) <= 2, seconds=1, message="at most maxUnavailable=2 nodes held")


def test_dry_run_records_decisions_and_changes_no_node(fleet: operator_harness.Fleet) -> None:
    name = node_name(fleet, "dry")
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        policy_spec(
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 0},
            dryRun=True,
        ),
    )
    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("health") == "Healthy",
        timeout_seconds=TIMEOUT,
        message="judged healthy",
    )
    before = settled_node(fleet, name)

    fleet.report(name, gpunode_facts.agent_status(overrides={2: {**ECC, **HOT}}))

    status = waiting.wait_until(
        lambda: (s := gpunode_status(fleet, name)).get("action") == "DryRun" and s,
        timeout_seconds=TIMEOUT,
        message="action DryRun",
    )
    assert status["health"] == "Unhealthy"
    dry = waiting.wait_until(
        lambda: fleet.events(name, "DryRun"), timeout_seconds=TIMEOUT, message="DryRun Event"
    )
    assert "would" in dry[0]["message"]
    assert "cordon and drain" in dry[0]["message"]
    after = fleet.node(name)
    assert after["metadata"].get("labels") == before["metadata"].get("labels")
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["spec"] == before["spec"]
    assert node_condition(fleet, name) is None
    assert "NodeCordoned" not in reasons(fleet, name)


def test_pdb_blocked_drain_fails_after_timeout_and_node_stays_cordoned(
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    namespace: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = node_name(fleet, "pdb")
    fleet.add_node(name)
    make_pod(k8s, namespace, "guarded", name, {"app": "guarded"})
    pdb = client.V1PodDisruptionBudget.from_dict(
        {
            "metadata": {"name": "guarded", "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        }
    )
    assert pdb is not None
    client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(namespace, pdb)
    waiting.wait_until(
        lambda: pod_phase(k8s, namespace, "guarded") == "Running", timeout_seconds=TIMEOUT, message="pod runs"
    )
    waiting.wait_until(
        lambda: (
            (s := client.PolicyV1Api(k8s).read_namespaced_pod_disruption_budget("guarded", namespace).status)
            and s.current_healthy == 1
        ),
        timeout_seconds=TIMEOUT,
        message="PDB sees the pod",
    )
    fleet.policy(
        fleet.label,
        policy_spec(
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
            drain={"timeoutSeconds": 3, "force": True},
        ),
    )
    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))

    waiting.wait_until(lambda: cordoned(fleet, name), timeout_seconds=TIMEOUT, message="cordoned")
    failed = waiting.wait_until(
        lambda: fleet.events(name, "DrainFailed"), timeout_seconds=TIMEOUT, message="DrainFailed Event"
    )
    assert f"{namespace}/guarded" in failed[0]["message"]
    assert pod_phase(k8s, namespace, "guarded") == "Running"
    assert cordoned(fleet, name)
    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("action") == "Cordoned",
        timeout_seconds=TIMEOUT,
        message="action Cordoned",
    )
    assert "NodeDrained" not in reasons(fleet, name)
    # GPUHealthDrainFailed's gauge: 1 for as long as the node stays stuck, 0 once a human moved it on.
    stuck = f'gpuhealth_operator_drain_failed_nodes{{policy="{fleet.label}"}} '

    def failed_drains() -> float | None:
        line = next((x for x in operator.metrics().splitlines() if x.startswith(stuck)), None)
        return None if line is None else float(line.split()[-1])

    waiting.wait_until(lambda: failed_drains() == 1, timeout_seconds=TIMEOUT, message="drain_failed_nodes 1")
    waiting.holds(
        lambda: failed_drains() == 1, seconds=3, interval_seconds=0.5, message="still stuck: still 1"
    )
    fleet.core.patch_node(name, {"spec": {"unschedulable": False}})  # a human takes over: kubectl uncordon
    waiting.wait_until(lambda: failed_drains() == 0, timeout_seconds=TIMEOUT, message="drain_failed_nodes 0")


def test_human_cordoned_node_is_not_uncordoned_on_recovery(fleet: operator_harness.Fleet) -> None:
    name = node_name(fleet, "human")
    fleet.add_node(name)
    fleet.core.patch_node(name, {"spec": {"unschedulable": True}})
    fleet.policy(
        fleet.label, policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"})
    )
    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.HEALTH_LABEL) == "unhealthy",
        timeout_seconds=TIMEOUT,
        message="unhealthy",
    )

    fleet.report(name, gpunode_facts.agent_status())
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.HEALTH_LABEL) == "healthy",
        timeout_seconds=TIMEOUT,
        message="healthy again",
    )
    # Well past healthyForSeconds (1 s) and several timer passes:
    waiting.holds(
        lambda: cordoned(fleet, name),
        seconds=3,
        interval_seconds=0.2,
        message="a node a human cordoned must stay cordoned",
    )
    assert keys.CORDONED_BY_ANNOTATION not in (fleet.node(name)["metadata"].get("annotations") or {})
    assert "NodeUncordoned" not in reasons(fleet, name)


def test_stale_agent_makes_node_unknown_and_never_cordons(fleet: operator_harness.Fleet) -> None:
    name = node_name(fleet, "stale")
    fleet.add_node(name, report=False)
    # The agent's last report (ECC) and then silence; staleness is timed from when the operator saw it.
    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}, heartbeat_seconds=1))
    waiting.holds(
        lambda: not cordoned(fleet, name),
        seconds=3.5,
        interval_seconds=0.5,
        message="no policy selects the node yet",
    )
    fleet.policy(
        fleet.label, policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"})
    )

    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("health") == "Unknown",
        timeout_seconds=TIMEOUT,
        message="health Unknown",
    )
    # The GPUNode status is written before the Node condition in a pass: wait for the condition itself.
    waiting.wait_until(
        lambda: (node_condition(fleet, name) or {}).get("status") == "Unknown",
        timeout_seconds=TIMEOUT,
        message="GPUHealthy Unknown",
    )
    waiting.wait_until(
        lambda: "AgentStale" in reasons(fleet, name), timeout_seconds=TIMEOUT, message="AgentStale Event"
    )
    waiting.holds(
        lambda: not cordoned(fleet, name),
        seconds=2,
        interval_seconds=0.2,
        message="a stale node is never cordoned",
    )
    assert "NodeCordoned" not in reasons(fleet, name)


def test_silent_agent_whose_clock_runs_a_day_ahead_turns_unknown_within_3_heartbeats(
    fleet: operator_harness.Fleet,
) -> None:
    name = node_name(fleet, "ahead")
    fleet.add_node(name, report=False)
    fleet.policy(
        fleet.label, policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"})
    )
    heartbeat_seconds = 2
    ahead = gpunode_facts.rfc3339(datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=24))
    fleet.report(name, gpunode_facts.agent_status(heartbeat=ahead, heartbeat_seconds=heartbeat_seconds))
    reported = time.monotonic()
    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("health") == "Healthy",
        timeout_seconds=TIMEOUT,
        message="health Healthy while the agent reports",
    )
    # The agent dies: no report after this one, whose timestamp says "tomorrow".
    waiting.wait_until(
        lambda: gpunode_status(fleet, name).get("health") == "Unknown",
        timeout_seconds=3 * heartbeat_seconds + 3,
        message="health Unknown within 3 heartbeats (the operator's clock, not the agent's)",
    )
    assert time.monotonic() - reported >= 3 * heartbeat_seconds - 0.5, "not stale before 3 heartbeats"
    assert not cordoned(fleet, name)


def test_straggler_among_eight_nodes_is_labelled_and_idle_node_is_not(fleet: operator_harness.Fleet) -> None:
    clocks = [1980, 1975, 1970, 1985, 1965, 1978]
    names = [node_name(fleet, f"s{i}") for i in range(8)]
    fleet.policy(
        fleet.label,
        policy_spec({"name": "straggler", "condition": "Straggler", "action": "Label", "forSeconds": 1}),
    )
    for name in names:
        fleet.add_node(name, report=False)
    for name, clock in zip(names, clocks, strict=False):
        fleet.report(name, gpunode_facts.agent_status(overrides={i: {"smClockMHz": clock} for i in range(8)}))
    slow, idle = names[6], names[7]
    fleet.report(
        idle,
        gpunode_facts.agent_status(
            overrides={i: {"utilizationPercent": 0, "smClockMHz": 345} for i in range(8)}
        ),
    )

    def heartbeat_then_labelled() -> bool:
        # The slow node's agent keeps reporting (its heartbeats): a node's score is evidence once it
        # rests on a few reports (decisions/stragglers.py SETTLED_SAMPLES), not on one report.
        fleet.report(slow, gpunode_facts.agent_status(overrides={5: {"smClockMHz": 1500}}))
        return labels(fleet, slow).get(keys.STRAGGLER_LABEL) == "true"

    waiting.wait_until(heartbeat_then_labelled, timeout_seconds=TIMEOUT, message="straggler label")
    status = waiting.wait_until(
        lambda: "Straggler" in ((s := gpunode_status(fleet, slow)).get("issues") or "") and s,
        timeout_seconds=TIMEOUT,
        message="Straggler in issues",
    )
    straggler = status["straggler"]
    assert straggler["zScore"] < -3.5
    assert straggler["peers"] >= 4
    for name in [*names[:6], idle]:
        assert keys.STRAGGLER_LABEL not in labels(fleet, name), name
        assert "Straggler" not in (gpunode_status(fleet, name).get("issues") or "")
    assert "straggler" not in gpunode_status(fleet, idle)


def test_flapping_temperature_does_not_flap_the_label(fleet: operator_harness.Fleet) -> None:
    name = node_name(fleet, "flap")
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        policy_spec(
            {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 2},
            recovery={"uncordon": True, "healthyForSeconds": 3},
        ),
    )
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.HEALTH_LABEL) == "healthy",
        timeout_seconds=TIMEOUT,
        message="judged",
    )

    def flap(seconds: float) -> list[str | None]:
        seen: list[str | None] = []
        hot = False
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            hot = not hot
            fleet.report(name, gpunode_facts.agent_status(overrides={4: HOT if hot else COOL}))
            for _ in range(4):
                seen.append(labels(fleet, name).get(keys.THERMAL_LABEL))
                time.sleep(0.1)
        return seen

    seen = flap(5)
    assert set(seen) == {None}, "a temperature crossing the threshold every 0.5 s never holds for forSeconds"

    fleet.report(name, gpunode_facts.agent_status(overrides={4: HOT}))
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.THERMAL_LABEL) == "true",
        timeout_seconds=TIMEOUT,
        message="sustained heat",
    )
    seen = flap(4)
    assert set(seen) == {"true"}, "a hot node cooling for less than healthyForSeconds keeps its label"
    assert len(fleet.events(name, "ThermalThrottled")) == 1
    with contextlib.suppress(Exception):
        fleet.report(name, gpunode_facts.agent_status())


def test_overlapping_acting_policies_do_not_undo_each_others_labels(fleet: operator_harness.Fleet) -> None:
    name = node_name(fleet, "overlap")
    fleet.add_node(name)
    fleet.policy(
        fleet.label, policy_spec({"name": "thermal", "condition": "ThermalThrottled", "action": "Label"})
    )
    fleet.policy(
        f"{fleet.label}-b", policy_spec({"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"})
    )
    fleet.report(name, gpunode_facts.agent_status(overrides={4: HOT}))
    waiting.wait_until(
        lambda: labels(fleet, name).get(keys.THERMAL_LABEL) == "true",
        timeout_seconds=TIMEOUT,
        message="thermal label",
    )

    # Observe, not synchronise: the label must hold on every look while both policies keep reconciling.
    seen: set[tuple[str | None, str | None]] = set()
    for _ in range(20):
        current = labels(fleet, name)
        seen.add((current.get(keys.THERMAL_LABEL), current.get(keys.HEALTH_LABEL)))
        time.sleep(0.1)
    assert seen == {("true", "degraded")}, "the policy without a thermal rule must not remove the label"
    assert not cordoned(fleet, name)


def test_nodes_deleted_while_reconciled_leave_the_operator_acting(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    """Nodes scaled down in a fault burst: no handler error, the timer lives, a later fault is acted on."""
    fleet.policy(
        fleet.label,
        policy_spec(
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}, maxUnavailable="100%"
        ),
    )
    log_start = len(operator.log())
    for round_ in range(3):
        names = [node_name(fleet, f"gone-{round_}-{i}") for i in range(10)]
        for name in names:
            fleet.add_node(name)
        for name in names:
            fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
        for name in names:  # while the operator cordons and drains them
            fleet.core.delete_node(name)
            fleet.names.remove(name)
    survivor = node_name(fleet, "after")
    fleet.add_node(survivor)
    fleet.report(survivor, gpunode_facts.agent_status(overrides={0: ECC}))
    waiting.wait_until(
        lambda: cordoned(fleet, survivor), timeout_seconds=TIMEOUT, message="a later fault acted on"
    )
    assert operator.alive() and operator.is_leading()
    logged = operator.log()[log_start:]
    assert "Traceback" not in logged and "KeyError" not in logged, logged[-5000:]


SHARED_GPU_NODES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # suffix: (GFD labels, Node capacity) of a node with 8 physical GPUs, all answering
    "ts4": ({keys.GPU_COUNT_LABEL: "8", keys.GPU_REPLICAS_LABEL: "4"}, {keys.GPU_RESOURCE: "32"}),
    "migsingle": (
        {keys.MIG_STRATEGY_LABEL: "single", keys.GPU_COUNT_LABEL: "56"},  # GFD counts the 8 x 7 MIG devices
        {keys.GPU_RESOURCE: "56"},
    ),
    "migmixed": (
        {keys.MIG_STRATEGY_LABEL: "mixed", keys.GPU_COUNT_LABEL: "8"},
        {keys.GPU_RESOURCE: "0", "nvidia.com/mig-1g.10gb": "56"},
    ),
}


def test_shared_gpus_are_not_lost_gpus_but_a_vanished_one_is(fleet: operator_harness.Fleet) -> None:
    fleet.policy(
        fleet.label,
        policy_spec({"name": "lost", "condition": "GPULost", "action": "Cordon"}, maxUnavailable=4),
    )
    for suffix, (gfd_labels, capacity) in SHARED_GPU_NODES.items():
        name = node_name(fleet, suffix)
        fleet.add_node(name, labels=gfd_labels, report=False)
        base = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        fleet.core.patch_node_status(
            name, body={"status": {"capacity": {**base, **capacity}, "allocatable": {**base, **capacity}}}
        )
        fleet.report(
            name, gpunode_facts.merge(gpunode_facts.agent_status(gpus=8), {"agent": {"maxGpuCountSeen": 8}})
        )
    gone = node_name(fleet, "gone")
    fleet.add_node(gone, labels={keys.GPU_COUNT_LABEL: "8"}, report=False)
    seven = gpunode_facts.agent_status(gpus=7)
    fleet.report(gone, gpunode_facts.merge(seven, {"agent": {"expectedGpuCount": 8, "maxGpuCountSeen": 8}}))

    waiting.wait_until(
        lambda: cordoned(fleet, gone),
        timeout_seconds=TIMEOUT,
        message="the node whose 8th GPU vanished is cordoned",
    )
    issues = waiting.wait_until(
        lambda: gpunode_status(fleet, gone).get("issues"), timeout_seconds=TIMEOUT, message="issues in status"
    )
    assert "GPULost" in issues.split(",")
    fleet.said(gone, "GPULost", "7 of 8 GPUs reported", timeout_seconds=TIMEOUT)
    for suffix in SHARED_GPU_NODES:
        name = node_name(fleet, suffix)
        status = waiting.wait_until(
            lambda n=name: (s := gpunode_status(fleet, n)).get("health") and s,
            timeout_seconds=TIMEOUT,
            message=f"{name} judged",
        )
        assert status["health"] == "Healthy", (suffix, status.get("issues"), status.get("conditions"))
        assert not cordoned(fleet, name), suffix
        assert not fleet.events(name, "GPULost"), suffix


def guarded_pod(k8s: client.ApiClient, namespace: str, pod: str, node: str) -> None:
    """A running pod on `node` that a PodDisruptionBudget (minAvailable 1) forbids evicting."""
    make_pod(k8s, namespace, pod, node, {"app": pod})
    pdb = client.V1PodDisruptionBudget.from_dict(
        {
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": pod}}},
        }
    )
    assert pdb is not None
    client.PolicyV1Api(k8s).create_namespaced_pod_disruption_budget(namespace, pdb)
    waiting.wait_until(
        lambda: (
            (s := client.PolicyV1Api(k8s).read_namespaced_pod_disruption_budget(pod, namespace).status)
            and s.current_healthy == 1
        ),
        timeout_seconds=TIMEOUT,
        message="the PDB sees the pod",
    )


def eviction_attempts(operator: operator_harness.OperatorProcess) -> float:
    """Eviction requests the operator has sent so far (every result), from its /metrics."""
    total = 0.0
    for line in operator.metrics().splitlines():
        if line.startswith("gpuhealth_operator_evictions_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def annotations(fleet: operator_harness.Fleet, name: str) -> dict[str, str]:
    return fleet.node(name)["metadata"].get("annotations") or {}


@pytest.mark.parametrize("stop", ["exclude", "dry-run", "delete-policy"])
def test_emergency_stop_ends_a_running_drain_within_2s_and_keeps_the_cordon(
    stop: str,
    fleet: operator_harness.Fleet,
    k8s: client.ApiClient,
    namespace: str,
    operator: operator_harness.OperatorProcess,
) -> None:
    name = node_name(fleet, "stop")
    fleet.add_node(name)
    guarded_pod(k8s, namespace, "guarded", name)
    rules = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]
    spec = policy_spec(*rules, maxUnavailable=1, drain={"timeoutSeconds": 600, "force": True})
    fleet.policy(fleet.label, spec)
    before = eviction_attempts(operator)
    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
    # The drain runs and keeps retrying the eviction the PDB refuses (backoff 1 s, 2 s, 4 s ...).
    waiting.wait_until(
        lambda: eviction_attempts(operator) >= before + 2,
        timeout_seconds=TIMEOUT,
        message="the drain retries the refused eviction",
    )

    if stop == "exclude":
        fleet.core.patch_node(name, {"metadata": {"labels": {keys.EXCLUDE_LABEL: "true"}}})
    elif stop == "dry-run":
        fleet.policy(fleet.label, {**spec, "dryRun": True})
    else:
        fleet.custom.delete_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
        )
    stopped_at = time.monotonic()
    paused = waiting.wait_until(
        lambda: fleet.events(name, "RemediationPaused"),
        timeout_seconds=TIMEOUT,
        message="RemediationPaused Event: the drain stopped",
    )
    assert time.monotonic() - stopped_at < 2.5, "the drain stops within 2 s"
    attempts = eviction_attempts(operator)
    # Longer than the next two backoff steps of the running drain: a drain left running would retry.
    waiting.holds(
        lambda: eviction_attempts(operator) == attempts and cordoned(fleet, name),
        seconds=8,
        interval_seconds=0.5,
        message="no eviction request after the stop, and the node stays cordoned",
    )
    assert pod_phase(k8s, namespace, "guarded") == "Running"
    message = " ".join(e["message"] for e in paused)

    if stop == "exclude":
        assert keys.EXCLUDE_LABEL in message
        # The excluded node keeps its budget slot (maxUnavailable 1): another faulty node waits.
        other = node_name(fleet, "other")
        fleet.add_node(other)
        fleet.report(other, gpunode_facts.agent_status(overrides={0: ECC}))
        wait_action(fleet, other, "Pending")
        assert not cordoned(fleet, other)
    elif stop == "dry-run":
        assert "dry run" in message
    else:
        # The cordon stays, with an Event saying how to release it; a new policy adopts it.
        assert "kubectl uncordon" in message
        assert annotations(fleet, name)[keys.CORDONED_BY_ANNOTATION] == fleet.label
        adopter = f"{fleet.label}-new"
        fleet.policy(adopter, spec)
        waiting.wait_until(
            lambda: annotations(fleet, name).get(keys.CORDONED_BY_ANNOTATION) == adopter,
            timeout_seconds=TIMEOUT,
            message="the new policy adopts the cordon",
        )
        fleet.said(name, "NodeCordoned", timeout_seconds=TIMEOUT)  # the adoption is said in an Event
        # Its own now: it drains (retries the refused eviction) and uncordons on recovery.
        waiting.wait_until(
            lambda: eviction_attempts(operator) > attempts,
            timeout_seconds=TIMEOUT,
            message="the adopting policy drains",
        )
        fleet.report(name, gpunode_facts.agent_status())
        waiting.wait_until(
            lambda: not cordoned(fleet, name), timeout_seconds=TIMEOUT, message="uncordoned on recovery"
        )
        assert keys.CORDONED_BY_ANNOTATION not in annotations(fleet, name)
