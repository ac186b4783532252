"""How a check holds every GPU of its node: device plugin, DRA claim, or no check (`decisions.check_gpus`),
and which nodes a pending GPU pod waits for (`decisions.waiting_pods`): a DRA check makes way there."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth_operator.decisions import check_gpus, waiting_pods

DRIVER = "gpu.nvidia.com"


def slice_of(node: str, *types: str | None, driver: str = DRIVER) -> dict[str, Any]:
    devices = [
        {"name": f"gpu-{i}", "attributes": {} if kind is None else {"type": {"string": kind}}}
        for i, kind in enumerate(types)
    ]
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def test_the_device_plugin_wins_where_the_node_advertises_gpus() -> None:
    assert check_gpus.access("a", 8, 8, driver=DRIVER) == check_gpus.Access(check_gpus.DEVICE_PLUGIN, 8)


def test_a_node_with_gpus_only_in_resource_slices_is_checked_through_dra() -> None:
    assert check_gpus.access("a", 0, 4, driver=DRIVER) == check_gpus.Access(check_gpus.DRA, 4)


def test_a_node_with_neither_gets_no_check_and_says_why() -> None:
    found = check_gpus.access("a", 0, 0, driver=DRIVER)
    assert (found.kind, found.gpus) == (None, 0)
    assert "nvidia.com/gpu" in found.why and DRIVER in found.why and "node a" in found.why


def test_only_whole_gpus_of_the_driver_on_the_node_are_counted() -> None:
    slices = [
        slice_of("a", "gpu", "gpu", "mig", None),  # no type attribute: a GPU
        slice_of("a", "gpu", driver="compute-domain.nvidia.com"),
        slice_of("b", "gpu"),
        {"spec": None},
        "junk",
    ]
    assert check_gpus.gpu_devices(slices, "a", driver=DRIVER) == 3  # type: ignore[arg-type]
    v1beta1 = {"spec": {"driver": DRIVER, "nodeName": "a", "devices": [{"basic": {"attributes": {}}}]}}
    assert check_gpus.gpu_devices([v1beta1], "a", driver=DRIVER) == 1


def test_the_template_version_is_the_best_one_served() -> None:
    assert check_gpus.served_version(["v1beta1", "v1", "v1beta2"]) == "v1"
    assert check_gpus.served_version(["v1beta1"]) == "v1beta1"
    assert check_gpus.served_version(["v1alpha3"]) is None


JOB = {"metadata": {"name": "gpuhealth-check-a-1", "uid": "u-1", "labels": {"gpuhealth.io/check": "quick"}}}


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_the_claim_template_claims_every_device_of_the_class_and_is_owned_by_the_job(version: str) -> None:
    body = check_gpus.claim_template(
        api_version=version, name="t", namespace="ns", device_class="gpu.example.com", job=JOB
    )
    assert body["apiVersion"] == f"resource.k8s.io/{version}"
    assert body["kind"] == "ResourceClaimTemplate"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"] == {"gpuhealth.io/check": "quick"}
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "gpuhealth-check-a-1", "uid": "u-1"}
    ]
    assert body["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "All"}}
    ]


def test_v1beta1_has_the_request_fields_on_the_request() -> None:
    body = check_gpus.claim_template(
        api_version="v1beta1", name="t", namespace="ns", device_class="c", job=JOB
    )
    assert body["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "deviceClassName": "c", "allocationMode": "All"}
    ]
    with pytest.raises(ValueError, match="v9"):
        check_gpus.claim_template(api_version="v9", name="t", namespace="ns", device_class="c", job=JOB)


def test_a_jobs_claim_template_is_read_back_from_its_pod_spec() -> None:
    claims = [
        {"name": "other", "resourceClaimTemplateName": "x"},
        {"name": "gpus", "resourceClaimTemplateName": "t"},
    ]
    assert check_gpus.claimed_template({"spec": {"template": {"spec": {"resourceClaims": claims}}}}) == "t"
    assert check_gpus.claimed_template({"spec": {"template": {"spec": {}}}}) is None
    assert check_gpus.claimed_template({}) is None


def test_each_job_gets_a_template_name_of_its_own() -> None:
    assert check_gpus.template_name("gpuhealth-check-a-1", "abc123") == "gpuhealth-check-a-1-abc123"


def pending(**spec: Any) -> dict[str, Any]:
    status = {"nominatedNodeName": spec.pop("nominated")} if "nominated" in spec else {}
    return {"metadata": {"name": "p"}, "spec": {"containers": [], **spec}, "status": status}


def gpu_pods(pod: Any) -> bool:
    return bool(pod["spec"].get("resourceClaims"))


CLAIMS = [{"name": "g", "resourceClaimTemplateName": "t"}]


def test_a_pending_gpu_pod_waits_for_the_nodes_it_names() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2", "n3"]}]},
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h4"]}
                        ]
                    },
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n5"]}]},
                ]
            }
        }
    }
    found = waiting_pods.waits(
        [
            pending(resourceClaims=CLAIMS, nominated="n1"),
            pending(resourceClaims=CLAIMS, affinity=affinity),
            pending(resourceClaims=CLAIMS, nodeSelector={"kubernetes.io/hostname": "h6"}),
        ],
        gpu_pods,
    )
    assert found.names == {"n1", "n2", "n3"}
    assert found.hostnames == {"h4", "h6"}
    assert found.for_node("n2", {})
    assert found.for_node("node-6", {"kubernetes.io/hostname": "h6"})
    assert not found.for_node("n5", {"kubernetes.io/hostname": "n5"})


def test_bound_deleted_unpinned_or_gpu_less_pods_wait_for_no_node() -> None:
    deleted = pending(resourceClaims=CLAIMS, nominated="n1")
    deleted["metadata"]["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    found = waiting_pods.waits(
        [
            pending(resourceClaims=CLAIMS, nodeName="n1", nominated="n1"),
            deleted,
            pending(resourceClaims=CLAIMS),
            pending(nominated="n2", nodeSelector={"kubernetes.io/hostname": "n2"}),
        ],
        gpu_pods,
    )
    assert found == waiting_pods.Waits()
