"""DeviceTaintRules and ResourceSlices as gpu-health reads and writes them."""

from typing import Any

import pytest

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import device_taints

Condition = vocabulary.Condition
NODE = "gpu-node-3"
DEVICES = {f"GPU-{i}": device_taints.Device("gpu.nvidia.com", NODE, f"gpu-{i}") for i in range(8)}


# --- what the cluster knows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "chosen"),
    [
        (["v1beta2"], "v1beta2"),
        (["v1alpha3"], "v1alpha3"),
        (["v1beta2", "v1"], "v1"),
        ([], None),
        (["v2"], None),
    ],
)
def test_served_version(versions: list[str], chosen: str | None) -> None:
    assert device_taints.served_version(versions) == chosen


def resource_slice(driver: str, pool: str, *devices: tuple[str, str | None]) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "pool": {"name": pool},
            "devices": [
                {
                    "name": name,
                    "attributes": {} if uuid is None else {"uuid": {"string": uuid}, "index": {"int": 0}},
                }
                for name, uuid in devices
            ],
        }
    }


def test_devices_by_uuid() -> None:
    slices = [
        resource_slice("gpu.nvidia.com", NODE, ("gpu-0", "GPU-0"), ("gpu-1", "GPU-1"), ("nic-0", None)),
        resource_slice("gpu.nvidia.com", "other", ("gpu-0", "GPU-1")),  # the same UUID twice: ambiguous
        {"spec": {"driver": "broken"}},
        {},
    ]
    assert device_taints.devices_by_uuid(slices) == {
        "GPU-0": device_taints.Device("gpu.nvidia.com", NODE, "gpu-0")
    }


# --- the DeviceTaintRule ---------------------------------------------------------------------------


def gpu_3_rule(**extra: Any) -> dict[str, Any]:
    return device_taints.device_taint_rule(
        api_version="v1beta2",
        policy="default",
        node=NODE,
        gpu_index=3,
        gpu_uuid="GPU-3",
        device=DEVICES["GPU-3"],
        condition=Condition.ECC_UNCORRECTABLE,
        effect=vocabulary.IsolationEffect.NO_EXECUTE,
        **extra,
    )


def test_device_taint_rule_selects_exactly_the_device() -> None:
    assert gpu_3_rule() == {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": "gpuhealth-gpu-node-3-gpu-3",
            "labels": {
                "gpuhealth.io/policy": "default",
                "gpuhealth.io/node": NODE,
                "gpuhealth.io/gpu-index": "3",
                "gpuhealth.io/gpu-uuid": "GPU-3",
            },
        },
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-3"},
            "taint": {"key": "gpuhealth.io/unhealthy", "value": "EccUncorrectable", "effect": "NoExecute"},
        },
    }


def test_device_taint_rule_is_owned_by_its_node() -> None:
    """The garbage collector deletes it with the Node (a replaced machine frees the GPU budget)."""
    assert gpu_3_rule(node_uid="uid-1")["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}
    ]


def test_device_taint_rule_refuses_an_unknown_version() -> None:
    with pytest.raises(ValueError, match=r"resource.k8s.io/v9 is not a version"):
        device_taints.device_taint_rule(
            api_version="v9",
            policy="p",
            node=NODE,
            gpu_index=0,
            gpu_uuid="GPU-0",
            device=DEVICES["GPU-0"],
            condition=Condition.GPU_LOST,
            effect=vocabulary.IsolationEffect.NO_SCHEDULE,
        )


def test_names_and_labels_of_long_nodes_stay_valid_and_distinct() -> None:
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    assert len(device_taints.rule_name(long_a, 63)) <= 253
    assert device_taints.rule_name(long_a, 1) != device_taints.rule_name(long_b, 1)
    assert device_taints.rule_name(long_a, 1).endswith("-gpu-1")
    assert len(device_taints.label_value(long_a)) <= 63
    assert device_taints.label_value(long_a) != device_taints.label_value(long_b)
    assert device_taints.label_value("short.node-1") == "short.node-1"


def test_the_probe_rule_taints_nothing_real() -> None:
    probe = device_taints.probe_rule("v1beta2", "default")
    assert probe["metadata"] == {
        "name": "gpuhealth-probe-default",
        "labels": {"gpuhealth.io/policy": "default"},
    }
    assert probe["spec"]["deviceSelector"] == {
        "driver": "probe.gpuhealth.io",
        "pool": "probe.gpuhealth.io",
        "device": "none",
    }
    assert probe["spec"]["taint"]["effect"] == "NoSchedule"


def condition(observed_generation: int, kind: str = "EvictionInProgress") -> dict[str, Any]:
    return {"type": kind, "status": "False", "observedGeneration": observed_generation}


@pytest.mark.parametrize(
    ("status", "generation", "acknowledged"),
    [
        ({"conditions": [condition(1)]}, 1, True),
        ({"conditions": [condition(1)]}, 2, False),  # the controller has not seen the change yet
        ({"conditions": [condition(1, "Other")]}, 1, False),
        ({}, 1, False),  # stored but ignored: the feature gate is off
        (None, 1, False),
        ({"conditions": "garbage"}, 1, False),
    ],
)
def test_acknowledged(status: dict[str, Any] | None, generation: int, acknowledged: bool) -> None:
    rule: dict[str, Any] = {"metadata": {"generation": generation}}
    if status is not None:
        rule["status"] = status
    assert device_taints.acknowledged(rule) is acknowledged
