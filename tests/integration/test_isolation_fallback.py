"""IsolateGPU on a cluster without the DeviceTaintRule API: the node ladder, and the policy says why.

A second local control plane runs without the `DRADeviceTaintRules` feature
gate and without `resource.k8s.io/v1beta2` (Kubernetes 1.36's defaults), so
no version serves DeviceTaintRules. The GPUs are still DRA devices (a
ResourceSlice lists them), yet a DBE on one GPU makes the operator cordon
and drain the node, as a Drain rule would, and the policy's `GPUIsolation`
condition is False with the reason in words.
"""

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local
from gpuhealth_sim.fleet import dra

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent.parent
TIMEOUT = 30.0
GPUS = 8


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.ControlPlane]:
    """etcd and kube-apiserver only, with DeviceTaintRules off; the CRDs applied."""
    cluster = local.ControlPlane(
        binaries.locate(cwd=ROOT),
        tmp_path_factory.mktemp("no-taint-rules"),
        with_kwok=False,
        with_scheduler=False,
        with_controller_manager=False,
        device_taint_rules=False,
    )
    cluster.start()
    try:
        files = [arg for path in sorted((ROOT / "crds").glob("*.yaml")) for arg in ("-f", str(path))]
        cluster.kubectl("apply", "--server-side", "--field-manager=gpu-health-tests", *files)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *files)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def api(plane: local.ControlPlane) -> Iterator[client.ApiClient]:
    api_client = plane.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


operator = operator_fixtures.operator_fixture("fallback", plane="plane", api="api")


def _policy_condition(fleet: operator_harness.Fleet) -> dict[str, Any] | None:
    policy = fleet.custom.get_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    conditions = (policy.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "GPUIsolation" and c["status"] != "Unknown"), None)


def test_without_the_api_isolate_gpu_drains_and_the_policy_says_why(
    api: client.ApiClient, operator: operator_harness.OperatorProcess
) -> None:
    fleet = operator_harness.Fleet(api, label=f"nodtr-{secrets.token_hex(3)}")
    node = f"{fleet.label}-dra"
    try:
        fleet.add_node(node, gpus=GPUS)
        objects = client.CustomObjectsApi(api)
        objects.create_cluster_custom_object(
            dra.GROUP,
            dra.VERSION,
            "resourceslices",
            gpunode_facts.resource_slice(node, GPUS),
        )
        fleet.policy(
            fleet.label,
            {
                "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
                "drain": {"timeoutSeconds": 30, "force": True},
            },
        )
        condition = waiting.wait_until(
            lambda: _policy_condition(fleet), timeout_seconds=TIMEOUT, message="policy condition GPUIsolation"
        )
        assert (condition["status"], condition["reason"]) == ("False", "NodeLadderFallback")
        assert "serves no DeviceTaintRule version" in condition["message"]

        fleet.report(
            node, gpunode_facts.agent_status(gpus=GPUS, overrides={3: {"ecc": {"uncorrectedVolatile": 1}}})
        )
        waiting.wait_until(
            lambda: fleet.gpunode(node).get("status", {}).get("action") == "Drained",
            timeout_seconds=TIMEOUT,
            message="the node ladder: cordoned and drained",
        )
        assert fleet.node(node)["spec"].get("unschedulable") is True
        assert fleet.events(node, "GPUIsolated") == []
        assert "isolatedGPUs" not in fleet.gpunode(node)["status"]
    finally:
        fleet.cleanup()
