"""NVLink, fabric, PCIe AER and InfiniBand facts from a scenario to the GPUNode on a real API server.

The agent runs in-process (real runner, reporter and Kubernetes client;
simulated GPUs whose sysfs tree the simulation writes and the agent's sysfs
reader reads). What is checked is what a user sees with `kubectl get gpunode
-o yaml`: the new fields survive the CRD's structural schema (the API server
prunes unknown fields), a link, fabric, AER or port fault shows without
waiting for the heartbeat, and a board without NVLink reports no `nvlink`.
"""

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuhealth_agent import reporter, runner, scenario, simulated
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

PREFIX = "itlinks"
HEARTBEAT = 300.0
"""Long: every fault below must be written as a change, not on a heartbeat."""


@pytest.fixture
def node(request: pytest.FixtureRequest, crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[str]:
    name = f"{PREFIX}-{request.node.name.removeprefix('test_').replace('_', '-')}"[:60].rstrip("-")
    core = client.CoreV1Api(k8s)
    core.create_node(
        body={
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"type": "kwok", "gpuhealth.io/test": PREFIX, keys.GPU_PRESENT_LABEL: "true"},
            },
            "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
            "status": {"capacity": {keys.GPU_RESOURCE: "2"}, "allocatable": {keys.GPU_RESOURCE: "2"}},
        }
    )
    try:
        yield name
    finally:
        core.delete_node(name)
        try:
            client.CustomObjectsApi(k8s).delete_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def status_of(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    try:
        found = client.CustomObjectsApi(k8s).get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    answer: dict[str, Any] = found.get("status") or {}
    return answer


class Agent:
    """A real agent loop on a thread; its scenario's time 0 is `.start`."""

    def __init__(self, k8s: client.ApiClient, node_name: str, text: str) -> None:
        plan = scenario.parse(text, f"<{node_name}>")
        self.start = time.time()
        self.lib = simulated.library(plan, start=self.start, identity_seed=node_name)
        settings = runner.Settings(
            node_name,
            runner.BACKEND_SIM,
            interval_seconds=0.5,
            heartbeat_seconds=HEARTBEAT,
            slow_period_seconds=2.0,
            expected_gpus=plan.expected_gpus,
            event_thread=False,
        )
        cluster = reporter.GPUNodeClient(k8s, node_name, request_timeout_seconds=5)
        self.agent = runner.Agent(
            settings, self.lib, report=reporter.Reporter(cluster, heartbeat_seconds=HEARTBEAT)
        )
        self.thread = threading.Thread(target=self.agent.run_forever, name=f"agent-{node_name}", daemon=True)

    def __enter__(self) -> "Agent":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.agent.stop.set()
        self.agent.wake.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the agent loop did not stop"


FAULTS_AT = 8.0
SCENARIO = f"""gpus: 2
defaults: {{fabricState: Completed, fabricCliqueId: 3, pcieAerCorrectable: 1}}
nics: [{{name: mlx5_0, port: 1, rateGbps: 400}}, {{name: mlx5_1, port: 1, rateGbps: 400}}]
timeline:
- {{after: {FAULTS_AT}s, gpu: 1, set: {{nvlinkLinksDown: 2}}}}
- {{after: {FAULTS_AT}s, gpu: 0, set: {{pcieAerFatal: 1, fabricState: InProgress}}}}
- {{after: {FAULTS_AT}s, nic: mlx5_1, set: {{state: DOWN, linkDowned: 1}}}}
"""


def test_link_fabric_aer_and_nic_faults_reach_the_gpunode_without_a_heartbeat(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    with Agent(k8s, node, SCENARIO) as running:
        healthy = waiting.wait_until(
            lambda: (s := status_of(k8s, node)).get("nics") and s,
            timeout_seconds=30,
            message=f"GPUNode {node} with its NICs",
        )
        assert time.time() < running.start + FAULTS_AT, "the box is too slow to see the healthy state first"
        gpu0, gpu1 = healthy["gpus"]
        assert gpu1["nvlink"] == {
            "linksUp": 18,
            "linksDown": 0,
            "crcErrors": 0,
            "replayErrors": 0,
            "recoveryErrors": 0,
        }
        assert gpu0["fabric"] == {"state": "Completed", "status": "Success", "cliqueId": 3}
        assert gpu0["pcie"]["aer"] == {"fatal": 0, "nonFatal": 0, "correctable": 1}
        assert [
            (n["name"], n["port"], n["state"], n["physState"], n["rateGbps"]) for n in healthy["nics"]
        ] == [
            ("mlx5_0", 1, "ACTIVE", "LinkUp", 400),
            ("mlx5_1", 1, "ACTIVE", "LinkUp", 400),
        ]

        def faulty() -> dict[str, Any] | None:
            status = status_of(k8s, node)
            gpus = status.get("gpus", [])
            nics = {n["name"]: n for n in status.get("nics", [])}
            seen = (
                len(gpus) == 2
                and gpus[1].get("nvlink", {}).get("linksDown") == 2
                and gpus[0].get("pcie", {}).get("aer", {}).get("fatal") == 1
                and gpus[0].get("fabric", {}).get("state") == "InProgress"
                and nics.get("mlx5_1", {}).get("state") == "DOWN"
                and nics.get("mlx5_1", {}).get("linkDowned") == 1  # the port's counters: slow tier
            )
            return status if seen else None

        # The slow tier (AER, fabric) is read every 2 s here; the heartbeat is 300 s away.
        after = waiting.wait_until(faulty, timeout_seconds=30, message="the faults on the GPUNode")
    assert time.time() - running.start < HEARTBEAT
    nics = {n["name"]: n for n in after["nics"]}
    assert (nics["mlx5_1"]["physState"], nics["mlx5_1"]["linkDowned"]) == ("Polling", 1)
    assert nics["mlx5_0"]["state"] == "ACTIVE"
    assert after["gpus"][1]["nvlink"]["linksUp"] == 16


def test_a_pcie_board_reports_no_nvlink_fabric_aer_or_nics(
    crds: local.ControlPlane, k8s: client.ApiClient, node: str
) -> None:
    with Agent(k8s, node, "gpus: 2\nmodel: NVIDIA H100 PCIe\n"):
        status = waiting.wait_until(
            lambda: (s := status_of(k8s, node)).get("gpus") and s,
            timeout_seconds=30,
            message=f"GPUNode {node} with GPU facts",
        )
    assert "nics" not in status
    for gpu in status["gpus"]:
        assert "nvlink" not in gpu and "fabric" not in gpu and "aer" not in gpu.get("pcie", {})
        assert "unreadable" not in gpu
        assert gpu["temperatureCelsius"] > 0
