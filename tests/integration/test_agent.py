"""The agent against a real kube-apiserver: its GPUNode, its writes, and an API outage.

Agents run in-process (real runner, reporter and Kubernetes client; simulated
GPUs) so the test knows each scenario's time zero exactly, plus one run of the
real `gpu-health-agent` command. Every Node here is a kwok fake named
`itagent-…`, created and deleted by its test.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

import operator_harness
from gpuhealth_agent import reporter, runner, scenario, simulated
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

PREFIX = "itagent"
H100 = "NVIDIA H100 80GB HBM3"


def node_manifest(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "gpuhealth.io/test": PREFIX, keys.GPU_PRESENT_LABEL: "true"},
        },
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {"capacity": {keys.GPU_RESOURCE: str(gpus)}, "allocatable": {keys.GPU_RESOURCE: str(gpus)}},
    }


@pytest.fixture
def node(request: pytest.FixtureRequest, crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[str]:
    """A fresh fake GPU Node (8 GPUs advertised); deleted afterwards, with its GPUNode."""
    name = f"{PREFIX}-{request.node.name.removeprefix('test_').replace('_', '-')}"[:60].rstrip("-")
    core = client.CoreV1Api(k8s)
    core.create_node(body=node_manifest(name))
    try:
        yield name
    finally:
        core.delete_node(name)
        custom = client.CustomObjectsApi(k8s)
        try:
            custom.delete_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def gpunode(k8s: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


class InProcessAgent:
    """A real agent loop on a thread, with simulated GPUs whose scenario time 0 is `.start`."""

    def __init__(
        self,
        k8s: client.ApiClient,
        node_name: str,
        text: str,
        interval: float,
        heartbeat: float,
        *,
        count_from_scenario: bool = True,
    ) -> None:
        plan = scenario.parse(text, f"<{node_name}>")
        self.start = time.time()
        lib = simulated.library(plan, start=self.start, identity_seed=node_name)
        settings = runner.Settings(
            node_name,
            runner.BACKEND_SIM,
            interval_seconds=interval,
            heartbeat_seconds=heartbeat,
            # The sim backend knows the GPU count up front; the NVML backend learns it from the Node.
            expected_gpus=plan.expected_gpus if count_from_scenario else None,
            event_thread=False,
        )
        cluster = reporter.GPUNodeClient(k8s, node_name, request_timeout_seconds=5)
        self.agent = runner.Agent(
            settings, lib, report=reporter.Reporter(cluster, heartbeat_seconds=heartbeat)
        )
        self.thread = threading.Thread(target=self.agent.run_forever, name=f"agent-{node_name}", daemon=True)

    def __enter__(self) -> "InProcessAgent":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.agent.stop.set()
        self.agent.wake.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the agent loop did not stop"


HEALTHY = "gpus: 8\ndefaults: {temperatureCelsius: 47, utilizationPercent: 93}\n"


def test_agent_creates_its_gpunode_owned_by_the_node(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    uid = client.CoreV1Api(k8s).read_node(node).metadata.uid
    with InProcessAgent(k8s, node, HEALTHY, interval=0.5, heartbeat=30):
        found = waiting.wait_until(
            lambda: (g := gpunode(k8s, node)) and g.get("status", {}).get("gpus") and g,
            timeout_seconds=30,
            message=f"GPUNode {node} with GPU facts",
        )
    owners = found["metadata"]["ownerReferences"]
    assert owners == [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    status = found["status"]
    assert status["agent"]["backend"] == "sim"
    assert status["agent"]["expectedGpuCount"] == 8
    assert status["agent"]["heartbeatSeconds"] == 30
    assert status["summary"] == {"gpuCount": 8, "model": H100, "maxTemperatureCelsius": 47}
    assert [g["index"] for g in status["gpus"]] == list(range(8))
    assert all(g["temperatureCelsius"] == 47 for g in status["gpus"])
    managers = {m["manager"] for m in found["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert managers == {resources.AGENT_FIELD_MANAGER}


def test_a_fault_reaches_the_gpunode_within_a_second_of_its_scenario_time(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    fault_at = 10.0  # well after the GPUNode exists and the watch is open, even on a busy CI box
    text = HEALTHY + f"timeline:\n- {{after: {fault_at}s, gpu: 3, set: {{eccUncorrectedVolatile: 1}}}}\n"
    custom = client.CustomObjectsApi(k8s)
    with InProcessAgent(k8s, node, text, interval=0.2, heartbeat=60) as running:
        waiting.wait_until(lambda: gpunode(k8s, node), timeout_seconds=30, message=f"GPUNode {node}")
        stream = watch.Watch()
        seen_at = None
        for event in stream.stream(
            custom.list_cluster_custom_object,
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            field_selector=f"metadata.name={node}",
            timeout_seconds=30,
        ):
            gpus = event["object"].get("status", {}).get("gpus", [])
            if len(gpus) > 3 and gpus[3].get("ecc", {}).get("uncorrectedVolatile", 0) > 0:
                seen_at = time.time()
                stream.stop()
        assert seen_at is not None, "the fault never reached the GPUNode"
        latency = seen_at - (running.start + fault_at)
        assert latency <= 1.0, f"fault visible {latency:.2f}s after its scenario time"


def test_kubectl_get_gpunodes_shows_the_facts_from_the_real_command(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str, tmp_path: Path
) -> None:
    plan = tmp_path / "thermal.yaml"
    plan.write_text(
        "gpus: 8\ndefaults: {temperatureCelsius: 50}\ntimeline:\n"
        "- {after: 0s, gpu: 5, set: {temperatureCelsius: 93, clockEventReasons: [HwThermalSlowdown]}}\n"
    )
    command = [
        sys.executable, "-m", "gpuhealth_agent.cli", "run",
        "--node-name", node, "--backend", "sim", "--sim-scenario", str(plan),
        "--interval", "0.5", "--heartbeat", "10", "--metrics-port", "0", "--kubeconfig", str(crds.kubeconfig),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=os.environ | {"PYTHONUNBUFFERED": "1"}, stderr=subprocess.PIPE, text=True
    )
    try:
        waiting.wait_until(
            lambda: (
                (g := gpunode(k8s, node))
                and g.get("status", {}).get("summary", {}).get("maxTemperatureCelsius")
            ),
            timeout_seconds=120,  # a fresh Python process importing the Kubernetes client, on a busy CI box
            message=f"GPUNode {node} written by gpu-health-agent",
        )
        table = crds.kubectl("get", "gpunodes", node).stdout
        header, row = table.splitlines()
        assert header.split()[:3] == ["NAME", "GPUS", "MODEL"]
        assert row.split()[:2] == [node, "8"]
        assert H100 in row
        assert row.split()[-2] == "93"  # MAXTEMP
        wide = crds.kubectl("get", "gn", node, "-o", "wide").stdout
        assert scenario.DEFAULT_DRIVER_VERSION in wide
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "stopping" in stderr


def test_api_server_outage_then_the_latest_state_lands_without_restarting_the_agent(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    text = (
        HEALTHY
        + "timeline:\n- {after: 12s, gpu: 6, set: {remappedRowsFailure: true, eccUncorrectedVolatile: 2}}\n"
    )
    with InProcessAgent(k8s, node, text, interval=0.5, heartbeat=5) as running:
        waiting.wait_until(lambda: gpunode(k8s, node), timeout_seconds=30, message=f"GPUNode {node}")
        crds.stop_apiserver()
        try:
            outage_started = time.monotonic()
            # The fault happens during the outage; the agent keeps collecting and failing to write.
            waiting.wait_until(
                lambda: time.monotonic() - outage_started >= 30 or None,
                timeout_seconds=40,
                interval_seconds=0.5,
                message="a 30 s API server outage",
            )
            assert running.thread.is_alive(), "the agent died during the outage"
            assert running.agent.reporter is not None and running.agent.reporter.retry.failures > 0
        finally:
            crds.start_apiserver()
        restarted = time.monotonic()
        found = waiting.wait_until(
            lambda: (
                (g := gpunode(k8s, node))
                and g["status"]["gpus"][6].get("remappedRows", {}).get("failure")
                and g
            ),
            timeout_seconds=60,
            interval_seconds=0.5,
            message="the fault from the outage lands on the GPUNode",
        )
        landed_after = time.monotonic() - restarted
        assert running.thread.is_alive()
    assert found["status"]["gpus"][6]["ecc"]["uncorrectedVolatile"] == 2
    assert landed_after <= 35, f"latest state landed {landed_after:.1f}s after the API server came back"


def test_steady_state_writes_only_on_the_heartbeat(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    heartbeat = 3.0
    custom = client.CustomObjectsApi(k8s)
    with InProcessAgent(k8s, node, HEALTHY, interval=0.2, heartbeat=heartbeat):
        first = waiting.wait_until(
            lambda: (g := gpunode(k8s, node)) and g.get("status", {}).get("agent") and g,
            timeout_seconds=30,
            message=f"first status write on {node}",
        )
        writes = 0
        window = 10.0
        started = time.monotonic()
        stream = watch.Watch()
        for event in stream.stream(
            custom.list_cluster_custom_object,
            resources.GROUP,
            resources.VERSION,
            resources.GPUNODE_PLURAL,
            field_selector=f"metadata.name={node}",
            resource_version=first["metadata"]["resourceVersion"],
            timeout_seconds=int(window) + 2,
        ):
            if time.monotonic() - started > window:
                stream.stop()
                break
            if event["type"] == "MODIFIED":
                writes += 1
    # 50 collections in the window; only the heartbeats (one per 3 s) may reach the API server.
    assert 2 <= writes <= int(window / heartbeat) + 1, f"{writes} writes in {window}s"


def test_a_restarted_agent_keeps_the_xids_on_its_gpunode(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    with InProcessAgent(
        k8s, node, HEALTHY + "timeline:\n- {after: 1s, gpu: 4, xid: 94}\n", interval=0.2, heartbeat=60
    ):
        waiting.wait_until(
            lambda: (g := gpunode(k8s, node)) and g.get("status", {}).get("gpus", [{}] * 5)[4].get("xids"),
            timeout_seconds=30,
            message="XID 94 on GPU 4",
        )
    # A new agent process (an upgrade): NVML will not repeat the XID, the GPUNode remembers it.
    with InProcessAgent(k8s, node, HEALTHY, interval=0.2, heartbeat=60) as second:
        waiting.wait_until(
            lambda: second.agent.reporter is not None and second.agent.reporter.state.written_at is not None,
            timeout_seconds=30,
            message="the restarted agent's first write",
        )
        found = gpunode(k8s, node)
    assert found is not None
    assert [x["code"] for x in found["status"]["gpus"][4]["xids"]] == [94]


def test_a_time_sliced_node_beyond_64_replicas_keeps_reporting_its_8_gpus(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    # 8 GPUs shared 16 ways, no GFD labels: the Node advertises 128. Padding the status with
    # "lost" GPUs up to that broke the CRD's 64-GPU limit: after its first write the agent's
    # every write was rejected, and the node went stale.
    capacity = {keys.GPU_RESOURCE: "128"}
    client.CoreV1Api(k8s).patch_node_status(node, {"status": {"capacity": capacity, "allocatable": capacity}})
    with InProcessAgent(k8s, node, HEALTHY, interval=0.2, heartbeat=1, count_from_scenario=False) as agent:
        first = waiting.wait_until(
            lambda: (g := gpunode(k8s, node)) and g.get("status", {}).get("gpus") and g,
            timeout_seconds=30,
            message=f"GPUNode {node} with GPU facts",
        )["status"]["agent"]["lastHeartbeatTime"]
        found = waiting.wait_until(
            lambda: (g := gpunode(k8s, node)) and g["status"]["agent"]["lastHeartbeatTime"] > first and g,
            timeout_seconds=15,
            message=f"GPUNode {node} written again after {first}",
        )
        assert agent.agent.reporter is not None and agent.agent.reporter.retry.failures == 0
    status = found["status"]
    assert [g["index"] for g in status["gpus"]] == list(range(8))
    assert not any(g.get("lost") for g in status["gpus"])
    assert status["agent"]["expectedGpuCount"] == 8
    assert status["agent"]["maxGpuCountSeen"] == 8


def test_an_agent_that_sees_no_gpu_makes_its_node_unknown_and_nothing_is_cordoned(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str, tmp_path: Path
) -> None:
    """Issue 24, item 16: the container runtime hides the GPUs from the agent (`visibleGpus: 0`)
    on a Node labelled with 8 GPUs. Before, the agent reported 8 lost GPUs and the operator drained
    the node (GPULost) - on every node at once. Now the agent reports its own error and the node is
    Unknown (condition AgentError) while the operator drains a real fault beside it."""
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    selector = {"gpuhealth.io/test-blind": node[-40:]}
    faulty = f"{node[:50]}-ctl"
    core.create_node(body=node_manifest(faulty))
    labels = {keys.GPU_COUNT_LABEL: "8", **selector}
    for name in (node, faulty):
        core.patch_node(name, {"metadata": {"labels": labels}})
    policy = f"blind-{abs(hash(node)) % 10**6}"
    spec = {
        "nodeSelector": {"matchLabels": selector},
        "maxUnavailable": 2,
        "breaker": {"maxNewUnhealthy": "100%"},
        "rules": [
            {"name": "lost", "condition": "GPULost", "action": "Drain"},
            {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"},
        ],
    }
    body = {"apiVersion": resources.API_VERSION, "kind": resources.POLICY_KIND, "metadata": {"name": policy}}
    custom.create_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, {**body, "spec": spec}
    )
    blind = HEALTHY + "visibleGpus: 0\n"
    ecc = HEALTHY + "timeline:\n- {after: 1s, gpu: 2, set: {eccUncorrectedVolatile: 1}}\n"
    try:
        with (
            operator_harness.leading_operator(crds.kubeconfig, k8s, tmp_path / "operator.log", "blind"),
            InProcessAgent(k8s, node, blind, interval=0.5, heartbeat=60, count_from_scenario=False),
            InProcessAgent(k8s, faulty, ecc, interval=0.5, heartbeat=60, count_from_scenario=False),
        ):
            waiting.wait_until(
                lambda: core.read_node(faulty).spec.unschedulable,
                timeout_seconds=60,
                message=f"the operator cordons {faulty} for its ECC fault",
            )
            found = waiting.wait_until(
                lambda: (g := gpunode(k8s, node)) and g.get("status", {}).get("health") == "Unknown" and g,
                timeout_seconds=30,
                message=f"GPUNode {node} Unknown",
            )
            status = found["status"]
            assert status["agent"]["error"]["reason"] == "NoGPUsVisible"
            assert status["gpus"] == []
            conditions = {c["type"]: c["status"] for c in status["conditions"]}
            assert conditions["AgentError"] == "True"
            assert conditions.get("GPULost") != "True"
            blind_node = core.read_node(node)
            assert not blind_node.spec.unschedulable
            assert keys.CORDONED_BY_ANNOTATION not in (blind_node.metadata.annotations or {})
    finally:
        custom.delete_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, policy
        )
        core.delete_node(faulty)
