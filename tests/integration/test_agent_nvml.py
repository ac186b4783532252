"""The production NVML path end to end: `gpu-health-agent --backend nvml` over the simulated library.

The real agent command runs as a process of its own whose LD_LIBRARY_PATH points at the simulated
libnvidia-ml.so.1 (hack/simnvml.sh), as a DaemonSet pod's points at the driver's: real pynvml, its
event thread waiting in nvmlEventSetWait_v2, the real Kubernetes client. A double-bit ECC error on
GPU 3 in the scenario must reach the GPUNode and make the real operator cordon the Node.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

import operator_fixtures
import operator_harness
import simnvml_build
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

operator = operator_fixtures.operator_fixture("nvml")
fleet = operator_fixtures.fleet_fixture("nvml")

SCENARIO = """\
gpus: 8
defaults: {temperatureCelsius: 44, utilizationPercent: 90}
timeline:
- {after: 4s, gpu: 3, xid: 48}
- {after: 4s, gpu: 3, set: {eccUncorrectedVolatile: 1, retiredPagesPending: true}}
"""


def test_the_nvml_backend_reports_a_double_bit_error_and_the_operator_cordons(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
    tmp_path: Path,
) -> None:
    env = simnvml_build.environment("full")
    name = f"{fleet.label}-n"
    fleet.add_node(name, report=False)  # the agent writes the GPUNode's status
    fleet.policy(
        fleet.label, {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]}
    )
    plan = tmp_path / "ecc.yaml"
    plan.write_text(SCENARIO)
    command = [
        sys.executable, "-m", "gpuhealth_agent.simnvml", "--scenario", str(plan), "--node-name", name, "--",
        "run", "--node-name", name, "--backend", "nvml", "--interval", "0.5", "--heartbeat", "10",
        "--metrics-port", "0", "--kubeconfig", str(crds.kubeconfig),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env | {"PYTHONUNBUFFERED": "1"}, stderr=subprocess.PIPE, text=True
    )
    try:
        waiting.wait_until(
            lambda: fleet.gpunode(name).get("status", {}).get("agent", {}).get("backend") == "nvml",
            timeout_seconds=120,  # a fresh Python process importing the Kubernetes client, on a busy CI box
            message=f"GPUNode {name} written by gpu-health-agent --backend nvml",
        )
        healthy = fleet.gpunode(name)["status"]
        assert healthy["summary"]["gpuCount"] == 8
        assert healthy["agent"]["driverVersion"] == "570.124.06"
        assert not fleet.node(name)["spec"].get("unschedulable")
        waiting.wait_until(
            lambda: fleet.node(name)["spec"].get("unschedulable") is True,
            timeout_seconds=60,
            message=f"the operator cordons {name} for GPU 3's double-bit error",
        )
        node = fleet.node(name)
        assert node["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == fleet.label
        gpu = fleet.gpunode(name)["status"]["gpus"][3]
        assert gpu["ecc"]["uncorrectedVolatile"] == 1
        assert gpu["retiredPages"]["pending"] is True
        assert [x["code"] for x in gpu.get("xids", [])] == [48]  # through nvmlEventSetWait_v2
        waiting.wait_until(
            lambda: "EccUncorrectable" in fleet.gpunode(name)["status"].get("issues", ""),
            timeout_seconds=30,
            message="the operator's verdict names EccUncorrectable on the GPUNode",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
