"""The fake NVIDIA DRA driver: which pools are DRA pools, and the slices and class it publishes."""

from pathlib import Path

import pytest

from gpuhealth_agent import scenario, simulated
from gpuhealth_api import keys
from gpuhealth_sim.fleet import dra, fleetfile, nodes

H100 = "NVIDIA H100 80GB HBM3"


def fleet(**pool: object) -> fleetfile.Fleet:
    return fleetfile.parse(
        {"pools": [{"name": "dra", "count": 2, "gpu": {"model": H100, "count": 8}, **pool}]}
    )


def test_pools_are_device_plugin_pools_unless_marked_dra() -> None:
    assert [plan.dra for plan in fleet().nodes] == [False, False]
    assert [plan.dra for plan in fleet(dra=True).nodes] == [True, True]


def test_a_non_boolean_dra_is_rejected_with_its_field(tmp_path: Path) -> None:
    with pytest.raises(fleetfile.FleetError) as caught:
        fleetfile.parse({"pools": [{"count": 1, "gpu": {"model": H100, "count": 8}, "dra": "yes"}]})
    assert caught.value.problems == ["pools[0].dra: expected true or false, got a string ('yes')"]


def test_a_dra_node_has_gpu_labels_but_no_device_plugin_capacity() -> None:
    plain, dra_plan = fleet().nodes[0], fleet(dra=True).nodes[0]
    assert nodes.resources(plain)[keys.GPU_RESOURCE] == "8"
    assert keys.GPU_RESOURCE not in nodes.resources(dra_plan)
    assert nodes.labels(dra_plan)[keys.GPU_COUNT_LABEL] == "8"


def test_the_slice_lists_every_gpu_with_the_uuid_its_agent_reports() -> None:
    plan = fleet(dra=True).nodes[1]
    body = dra.resource_slice(plan, node_uid="uid-1")
    spec = body["spec"]
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == ("gpu.nvidia.com", "dra-1", "dra-1")
    assert body["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "dra-1",
        "uid": "uid-1",
    }
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    lib = simulated.library(scenario.from_data(dict(plan.scenario), "test"), identity_seed=plan.name)
    gpu3 = spec["devices"][3]["attributes"]
    assert gpu3["uuid"] == {"string": lib.uuid(3)}  # type: ignore[attr-defined]
    assert gpu3["index"] == {"int": 3}
    assert gpu3["productName"] == {"string": H100}


def test_the_device_class_selects_the_driver() -> None:
    assert dra.device_class()["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}
    ]
