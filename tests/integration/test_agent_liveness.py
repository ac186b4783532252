"""Agent liveness from its pod's readiness: a dead agent is Unknown within 90 s on a 5-minute heartbeat.

The agents run as the chart runs them: a DaemonSet, one pod per kwok node (its
controller creates them, the scheduler binds them); kwok keeps the Ready
condition the test writes (the pods carry kwok's status annotation), standing
in for the kubelet's readiness probe of the agent's /readyz. Every GPUNode
reports once, with a 300 s heartbeat, and then stays quiet: by the heartbeat
alone none would turn stale for 15 minutes. The operator watches the pods
through `--agent-pod-selector`, in `--agent-pod-namespace`.
"""

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import agent_daemonset
import gpunode_facts
import namespaces
import operator_fixtures
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

DETECT_SECONDS = 90.0
"""The issue's bound: a dead agent is detected within this long."""
AGENT_LABEL = "gpuhealth.io/test-agent"
GRACE_SECONDS = 60.0
"""`liveness.NOT_READY_GRACE_SECONDS`: how long a NotReady agent pod is given."""


@pytest.fixture
def label() -> str:
    return f"live-{secrets.token_hex(3)}"


def _operator_args(request: pytest.FixtureRequest) -> list[str]:
    """The operator watches the agent pods of this test's DaemonSet, in its namespace."""
    label, namespace = request.getfixturevalue("label"), request.getfixturevalue("namespace")
    return [
        "--tick-seconds=0.5",
        f"--agent-pod-selector={AGENT_LABEL}={label}",
        f"--agent-pod-namespace={namespace}",
    ]


operator = operator_fixtures.operator_fixture("liveness", _operator_args, scope="function", log_tail=15000)


@pytest.fixture
def fleet(
    k8s: client.ApiClient, operator: operator_harness.OperatorProcess, label: str, namespace: str
) -> Iterator[operator_harness.Fleet]:
    """The test's nodes, and the agent DaemonSet on them in the operator's agent namespace."""
    agent_daemonset.create(
        k8s, namespace, "agent", {AGENT_LABEL: label}, {operator_harness.Fleet.LABEL_KEY: label}
    )
    with operator_harness.Fleet(k8s, label=label) as nodes:
        yield nodes


def agent_pod(core: client.CoreV1Api, namespace: str, node: str, label: str) -> str:
    """The node's agent pod, Ready."""
    name = agent_daemonset.pod_on(core, namespace, f"{AGENT_LABEL}={label}", node)
    agent_daemonset.set_ready(core, namespace, name, True)
    return name


set_ready = agent_daemonset.set_ready


def health(fleet: operator_harness.Fleet, name: str) -> str | None:
    return (fleet.gpunode(name).get("status") or {}).get("health")


def test_a_not_ready_or_gone_agent_pod_turns_its_node_unknown_a_ready_one_keeps_a_quiet_node_healthy(
    fleet: operator_harness.Fleet, namespace: str, label: str
) -> None:
    core = fleet.core
    names = {case: f"{label}-{case}" for case in ("notready", "deleted", "ready")}
    pods = {}
    for case, name in names.items():
        fleet.add_node(name, report=False)
        fleet.report(name, gpunode_facts.agent_status(heartbeat_seconds=300))  # then silence
        pods[case] = agent_pod(core, namespace, name, label)
    fleet.policy(
        f"{label}-policy", {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]}
    )
    for name in names.values():
        waiting.wait_until(
            lambda n=name: health(fleet, n) == "Healthy", timeout_seconds=30, message=f"{name} Healthy"
        )

    died = time.monotonic()
    set_ready(core, namespace, pods["notready"], False)  # the agent's probe fails (hung NVML, no API)
    core.delete_namespaced_pod(pods["deleted"], namespace, grace_period_seconds=0)  # the agent is gone
    for case in ("notready", "deleted"):
        waiting.wait_until(
            lambda c=case: health(fleet, names[c]) == "Unknown",
            timeout_seconds=DETECT_SECONDS - (time.monotonic() - died),
            message=f"the {case} agent's node turns Unknown within {DETECT_SECONDS:g}s",
        )
    detected = time.monotonic() - died
    print(f"stale agents detected after {detected:.1f}s")
    assert detected >= 55, f"Unknown after {detected:.0f}s: the grace must absorb an agent restart"
    conditions = {c["type"]: c for c in fleet.gpunode(names["notready"])["status"]["conditions"]}
    assert "is not Ready since" in conditions["AgentStale"]["message"]
    fleet.said(names["notready"], "AgentStale", timeout_seconds=30)
    for case in ("notready", "deleted"):
        node = fleet.node(names[case])
        assert not node["spec"].get("unschedulable"), "missing data is never a fault"
        gpu_healthy = {c["type"]: c for c in node["status"]["conditions"]}[keys.NODE_CONDITION_TYPE]
        assert gpu_healthy["status"] == "Unknown"

    # The Ready agent's node reported as long ago as the others and stays Healthy.
    assert health(fleet, names["ready"]) == "Healthy"

    # The agent comes back (its probe passes again): the node is judged on its facts again.
    set_ready(core, namespace, pods["notready"], True)
    waiting.wait_until(
        lambda: health(fleet, names["notready"]) == "Healthy", timeout_seconds=30, message="Healthy again"
    )


@pytest.fixture
def tenant(k8s: client.ApiClient) -> Iterator[str]:
    """Another namespace, a tenant's, where the operator's agents do not run."""
    with namespaces.created(k8s, f"tenant-{secrets.token_hex(3)}") as name:
        yield name


def test_a_tenants_pods_with_the_agents_labels_are_not_the_agent(
    fleet: operator_harness.Fleet, namespace: str, tenant: str, label: str
) -> None:
    """Issue 24, 6: pods of a tenant's, in its own namespace, carry the agent's labels (a bare pod and a
    DaemonSet of its own) and turn Ready, then NotReady. They are not the agent: the faulty node is not
    made Unknown (which never cordons), its sustained fault is acted on after forSeconds, and a quiet
    node whose own agent is Ready stays Healthy past the 60 s grace."""
    core = fleet.core
    faulty, quiet = f"{label}-faulty", f"{label}-quiet"
    hot = {0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
    for name in (faulty, quiet):
        fleet.add_node(name, report=False)
        agent_pod(core, namespace, name, label)  # the real agent, Ready
    # The tenant's DaemonSet selects on a label of its own too, so it does not adopt the bare pod.
    tenant_labels = {AGENT_LABEL: label, "app": "lookalike"}
    agent_daemonset.create(
        fleet.api, tenant, "lookalike", tenant_labels, {operator_harness.Fleet.LABEL_KEY: label}
    )
    bare: dict[str, Any] = {
        "metadata": {
            "name": "lookalike-bare",
            "labels": {AGENT_LABEL: label},
            "annotations": {local.KWOK_STATUS_ANNOTATION: "custom"},
        },
        "spec": {"nodeName": faulty, "containers": agent_daemonset.PAUSE, "terminationGracePeriodSeconds": 0},
    }
    core.create_namespaced_pod(tenant, bare)
    lookalikes = [
        "lookalike-bare",
        *(
            agent_daemonset.pod_on(core, tenant, f"{AGENT_LABEL}={label},app=lookalike", n)
            for n in (faulty, quiet)
        ),
    ]
    for pod in lookalikes:
        set_ready(core, tenant, pod, True)
    rule = {"name": "hot", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 70}
    fleet.policy(f"{label}-policy", {"rules": [rule], "maxUnavailable": 2})
    for name, overrides in ((faulty, hot), (quiet, None)):
        fleet.report(
            name, gpunode_facts.agent_status(heartbeat_seconds=300, overrides=overrides)
        )  # then silence
    for pod in lookalikes:
        set_ready(core, tenant, pod, False)
    went = time.monotonic()

    waiting.wait_until(
        lambda: bool(fleet.node(faulty)["spec"].get("unschedulable")),
        timeout_seconds=130,
        message="the faulty node is cordoned after forSeconds",
    )
    assert time.monotonic() - went > GRACE_SECONDS, "after the grace the lookalikes would have had"
    waiting.wait_until(
        lambda: health(fleet, faulty) == "Degraded", timeout_seconds=10, message="the faulty node is Degraded"
    )
    waiting.holds(
        lambda: health(fleet, quiet) == "Healthy", seconds=10, message="the quiet node stays Healthy"
    )
    assert "AgentStale" not in {e["reason"] for e in fleet.events(faulty) + fleet.events(quiet)}
