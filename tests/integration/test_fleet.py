"""The simulated fleet on a real API server: GPU Nodes as a real cluster has them, GPUNodes with facts.

And the demo, end to end: its summary must show the product doing its job.
"""

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import sim_fleets
from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import agentpool, fleetfile

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"
PREFIX = "itfleet"
FLEET = {
    "seed": 3,
    "agent": {"intervalSeconds": 0.5, "heartbeatSeconds": 5},
    "labels": {"gpuhealth.io/test": PREFIX},
    "pools": [
        {
            "name": PREFIX,
            "nodes": f"{PREFIX}-{{0..2}}",
            "gpu": {"model": H100, "count": 8},
            "resources": {"cpu": "96", "memory": "1Ti"},
            "scenario": {"defaults": {"temperatureCelsius": 45, "utilizationPercent": 95}},
        }
    ],
    "overrides": [
        {
            "nodes": f"{PREFIX}-2",
            "scenario": {
                "defaults": {"utilizationPercent": 95},
                "timeline": [{"after": "2s", "gpu": 3, "set": {"eccUncorrectedVolatile": 1}}],
            },
        }
    ],
}


@pytest.fixture
def running_fleet(crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[agentpool.Fleet]:
    with sim_fleets.running(k8s, fleetfile.parse(FLEET, source="test fleet"), workers=2) as sim:
        yield sim


def gpunode(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(k8s)
    obj = custom.get_cluster_custom_object(resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, name)
    assert isinstance(obj, dict)
    return obj


def test_nodes_look_like_real_gpu_nodes_and_agents_report_facts(
    running_fleet: agentpool.Fleet, k8s: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s)
    for i in range(3):
        name = f"{PREFIX}-{i}"
        node = core.read_node(name)
        labels = node.metadata.labels
        assert labels[keys.GPU_PRESENT_LABEL] == "true"
        assert labels[keys.GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
        assert labels[keys.GPU_COUNT_LABEL] == "8"
        assert labels["gpuhealth.io/test"] == PREFIX
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert node.status.capacity[keys.GPU_RESOURCE] == "8"
        assert node.status.allocatable[keys.GPU_RESOURCE] == "8"
        assert node.status.capacity["cpu"] == "96"

        def reported(name: str = name) -> dict[str, Any] | None:
            status = gpunode(k8s, name).get("status") or {}
            return status if len(status.get("gpus") or []) == 8 else None

        status = waiting.wait_until(reported, timeout_seconds=30, message=f"GPUNode {name} with 8 GPUs")
        assert status["summary"]["model"] == H100
        assert status["agent"]["backend"] == "sim"
        assert all(gpu["observedTime"] for gpu in status["gpus"])
        owner = gpunode(k8s, name)["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", name, node.metadata.uid)
    # Baselines differ from node to node, while every value stays healthy.
    temperatures = {
        i: [g["temperatureCelsius"] for g in gpunode(k8s, f"{PREFIX}-{i}")["status"]["gpus"]]
        for i in range(3)
    }
    assert len({tuple(t) for t in temperatures.values()}) == 3
    assert all(35 <= t <= 55 for ts in temperatures.values() for t in ts)


def test_a_scripted_fault_reaches_the_gpunode(running_fleet: agentpool.Fleet, k8s: client.ApiClient) -> None:
    def ecc() -> int:
        gpus = (gpunode(k8s, f"{PREFIX}-2").get("status") or {}).get("gpus") or []
        return int(gpus[3]["ecc"]["uncorrectedVolatile"]) if len(gpus) == 8 else 0

    waiting.wait_until(ecc, timeout_seconds=30, message="uncorrectable ECC error on GPU 3 of itfleet-2")
    assert running_fleet.stats.failed_turns == 0


def test_the_demo_shows_the_main_job_done(tmp_path: Path) -> None:
    """`gpu-health-sim demo`, as `make demo` runs it: its summary is the product's acceptance test."""
    script = Path(sys.executable).parent / "gpu-health-sim"
    summary_path = tmp_path / "summary.json"
    command = [str(script), "demo", "--duration", "60", "--plain", "--summary-json", str(summary_path)]
    output: list[str] = []
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ)
    ) as process:
        assert process.stdout is not None
        reader = threading.Thread(target=lambda: output.extend(process.stdout or []), daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait(timeout=30)
            raise
        reader.join(timeout=10)
    text = "".join(output)
    assert code == 0, text
    result = json.loads(summary_path.read_text())["nodes"]

    def did(node: str) -> list[str]:
        return [a["what"] for a in result[node]["actions"]]

    ecc, thermal, xid, straggler, human = (f"gpu-node-{i}" for i in (3, 5, 7, 9, 11))
    assert "EccUncorrectable" in result[ecc]["detected"], text
    assert {"cordoned", "drained"} <= set(did(ecc)), text
    assert result[ecc]["unschedulable"] and result[ecc]["cordonedBy"] == "demo", text
    assert "XidCritical" in result[xid]["detected"], text
    assert {"cordoned", "drained"} <= set(did(xid)), text
    # Repair (the policy's spec.repair, the simulator playing the Jobs): the XID node's GPU reset,
    # validated, back in service at once; the ECC node's validation fails after the reset and after the
    # reboot: retired, still cordoned, marked for a human.
    xid_story = did(xid)  # Events and Node changes come by two watches: no order between the two
    assert xid_story.count("repair started") == 1 and "validation failed" not in xid_story, text
    assert xid_story.index("drained") < xid_story.index("repair started") < xid_story.index("uncordoned"), (
        text
    )
    assert xid_story.index("repair started") < xid_story.index("validation passed"), text
    assert not result[xid]["unschedulable"] and result[xid]["action"] == "None", text
    ecc_story = did(ecc)
    assert ecc_story.count("repair started") == 2 and ecc_story.count("validation failed") == 2, text
    assert {"retired", "needs-repair set"} <= set(ecc_story) and "uncordoned" not in ecc_story, text
    assert result[ecc]["labels"].get(keys.NEEDS_REPAIR_LABEL) == keys.NEEDS_REPAIR_MANUAL, text
    assert result[ecc]["action"] == "Retired", text
    thermal_actions = did(thermal)
    assert "thermal-throttled set" in thermal_actions, text
    assert "thermal-throttled removed" in thermal_actions, text
    assert thermal_actions.index("thermal-throttled set") < thermal_actions.index("thermal-throttled removed")
    assert keys.THERMAL_LABEL not in result[thermal]["labels"], text
    assert "straggler set" in did(straggler), text
    assert result[straggler]["labels"].get(keys.STRAGGLER_LABEL) == "true", text
    assert result[human]["unschedulable"] and result[human]["cordonedBy"] is None, text
    assert result[human]["humanCordoned"] and did(human) == [] and result[human]["gpuHealthEvents"] == 0, text
    healthy = [f"gpu-node-{i}" for i in (0, 1, 2, 4, 6, 8, 10)]  # gpu-node-12: below
    assert not [n for n in healthy if n in result and did(n)], text
    assert "Summary after" in text and "cordoned by a human: still cordoned" in text
    # Active checks on the idle nodes (no training there): one passes, one is preempted by real work.
    passing, preempted = "gpu-node-13", "gpu-node-14"
    assert "check passed" in did(passing) and not result[passing]["unschedulable"], text
    assert "check preempted" in did(preempted) and "check failed" not in did(preempted), text
    assert f"real work arrived on {preempted} while its check ran" in text, text
    # A node whose check fails (its scenario's `checks:`): ActiveCheckFailed, drained by the rule `check`,
    # repaired (every GPU reset: a check names none), validated and back in service.
    failing = "gpu-node-15"
    assert "ActiveCheckFailed" in result[failing]["detected"], text
    failed_story = did(failing)
    assert "check failed" in failed_story and {"cordoned", "drained"} <= set(failed_story), text
    assert "validation passed" in failed_story and "uncordoned" in failed_story, text
    assert not result[failing]["unschedulable"], text
    # The DRA node: only its faulty GPU isolated, the node itself schedulable; GPU-hours saved stated.
    dra_node = "gpu-node-12"
    assert did(dra_node) == ["GPU isolated"], text
    assert not result[dra_node]["unschedulable"] and result[dra_node]["action"] == "Isolated", text
    (isolation,) = json.loads(summary_path.read_text())["isolations"]
    assert (isolation["node"], isolation["gpus"], isolation["isolated"]) == (dra_node, 8, 1), text
    assert isolation["gpuHoursSavedVsDrain"] > 0, text
    assert "7 of 8 GPUs kept in service" in text and "GPU-hours saved against a whole-node drain" in text
    # Its own run, recorded and backtested under the same policy: one line. The trace holds the DRA
    # node's ResourceSlice, so the replay isolates its GPU as live did (and drains nothing there).
    # Issue 48: the reset that returned gpu-node-7 waited for the GPU Operator's operands and the agent.
    assert (
        "gpu-node-7: the GPU reset started after the GPU Operator's device-plugin, dcgm-exporter left "
        "and the agent released the GPUs"
    ) in text, text
    (verdict,) = [line for line in text.splitlines() if line.startswith("backtest of this run")]
    # Every node, the XID node included, as live did: the DRA node's isolation no longer takes the
    # budget in the replay (it took the XID node's place once), so nothing may differ.
    assert "Node actions; same as live: yes" in verdict, verdict
    assert re.findall(r"(gpu-node-\d+) \(replay:", verdict) == [], verdict
    figures = re.search(r"fatal faults acted on (\d+)/(\d+)", verdict)
    assert figures is not None, verdict
    acted, faults = map(int, figures.groups())
    # The failed check is a fault the trace holds (its check record) and the replay drains it as live did.
    assert faults == 4 and acted == 4 and "false disruptive 0" in verdict, verdict
    assert "stragglers labelled 1/1" in verdict, verdict
