"""A check Job on a DRA node holds every GPU through its claim, never through `nvidia.com/gpu`
(`ladder.check.check_jobs.build`); on a device-plugin node, the other way round."""

from __future__ import annotations

from typing import Any

from gpuhealth_api import keys
from gpuhealth_operator.decisions import checks
from gpuhealth_operator.ladder.check import check_jobs

START = checks.Start(node="n1", policy="p", check="quick", template="QuickTest", timeout_seconds=60)
TEMPLATE: dict[str, Any] = {
    "spec": {
        "template": {
            "spec": {
                "resourceClaims": [{"name": "theirs", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [
                    {
                        "name": "check",
                        "image": "dcgm",
                        "resources": {
                            "limits": {keys.GPU_RESOURCE: "1", "cpu": "1"},
                            "claims": [{"name": "theirs"}],
                        },
                    },
                    {"name": "side", "image": "x", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}},
                ],
            }
        }
    }
}


def build(claim: str | None) -> dict[str, Any]:
    return check_jobs.build(TEMPLATE, START, namespace="ns", node_uid="uid-1", gpus=8, claim_template=claim)


def test_on_a_dra_node_the_first_container_holds_the_claim_of_every_gpu() -> None:
    job = build("gpuhealth-check-n1-x-abc")
    pod = job["spec"]["template"]
    spec = pod["spec"]
    assert spec["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "gpuhealth-check-n1-x-abc"}
    ]
    first, side = spec["containers"]
    assert first["resources"]["claims"] == [{"name": "gpus"}]
    assert "claims" not in side["resources"]
    for container in spec["containers"]:
        for part in ("limits", "requests"):
            assert keys.GPU_RESOURCE not in container["resources"][part], container["name"]
    assert first["resources"]["limits"]["cpu"] == "1"
    assert pod["metadata"]["annotations"][keys.CHECK_GPUS_ANNOTATION] == "8"
    assert spec["priorityClassName"] == check_jobs.PRIORITY_CLASS
    assert spec["automountServiceAccountToken"] is False


def test_on_a_device_plugin_node_the_first_container_requests_every_gpu_and_claims_nothing() -> None:
    spec = build(None)["spec"]["template"]["spec"]
    assert "resourceClaims" not in spec
    first, side = spec["containers"]
    assert (
        first["resources"]["limits"][keys.GPU_RESOURCE]
        == first["resources"]["requests"][keys.GPU_RESOURCE]
        == "8"
    )
    assert "claims" not in first["resources"]
    assert keys.GPU_RESOURCE not in side["resources"]["limits"]
