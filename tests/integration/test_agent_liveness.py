"""Agent liveness from its pod's readiness: a dead agent is Unknown within 90 s on a 5-minute heartbeat.

One agent pod per kwok node, as the chart's DaemonSet would run it; kwok keeps
the Ready condition the test writes (the pods carry kwok's status annotation),
standing in for the kubelet's readiness probe of the agent's /readyz. Every
GPUNode reports once, with a 300 s heartbeat, and then stays quiet: by the
heartbeat alone none would turn stale for 15 minutes. The operator watches the
pods through `--agent-pod-selector`.
"""

import datetime
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_harness
from gpuhealth_api import keys
from gpuhealth_sim import controlplane, waiting

pytestmark = pytest.mark.integration

DETECT_SECONDS = 90.0
"""The issue's bound: a dead agent is detected within this long."""
AGENT_LABEL = "gpuhealth.io/test-agent"
PAUSE = [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]


@pytest.fixture
def label() -> str:
    return f"live-{secrets.token_hex(3)}"


@pytest.fixture
def operator(
    crds: controlplane.ControlPlane, k8s: client.ApiClient, tmp_path: Path, label: str
) -> Iterator[operator_harness.OperatorProcess]:
    operator_harness.ensure_namespace(k8s, "gpu-health")
    process = operator_harness.OperatorProcess(
        kubeconfig=Path(crds.kubeconfig),
        log_path=tmp_path / "operator.log",
        lease_name=f"gpu-health-liveness-{secrets.token_hex(2)}",
        identity=f"liveness-{secrets.token_hex(2)}",
        extra_args=["--tick-seconds=0.5", f"--agent-pod-selector={AGENT_LABEL}={label}"],
    ).start()
    try:
        waiting.wait_until(process.is_leading, timeout_seconds=30, message="operator leads")
        yield process
    finally:
        process.stop()
        print(process.log()[-15000:])


@pytest.fixture
def fleet(
    k8s: client.ApiClient, operator: operator_harness.OperatorProcess, label: str
) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=label) as nodes:
        yield nodes


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_ready(core: client.CoreV1Api, namespace: str, pod: str, ready: bool) -> None:
    """What the kubelet writes when the readiness probe of the agent's /readyz passes or fails."""
    value = "True" if ready else "False"
    conditions = [
        {"type": kind, "status": value, "lastTransitionTime": now()} for kind in ("Ready", "ContainersReady")
    ]
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": {"phase": "Running", "conditions": conditions}}
    )


def agent_pod(core: client.CoreV1Api, namespace: str, node: str, label: str) -> str:
    name = f"agent-{node}"[:63]
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {AGENT_LABEL: label},
            "annotations": {controlplane.KWOK_STATUS_ANNOTATION: "custom"},
        },
        "spec": {"nodeName": node, "containers": PAUSE, "terminationGracePeriodSeconds": 0},
    }
    core.create_namespaced_pod(namespace, body)
    set_ready(core, namespace, name, True)
    return name


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
    assert "AgentStale" in {e["reason"] for e in fleet.events(names["notready"])}
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
