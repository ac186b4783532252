"""The repair Job templates per platform (issue 48, item 4), rendered with the real helm from each preset.

What a platform engineer installing with `-f platforms/<preset>.yaml --set repair.enabled=true` gets in
the ConfigMap the operator reads: on the GPU Operator every repair pod in its `nvidia` RuntimeClass; on GKE
(no NVIDIA container toolkit) the ResetGPU and Validation containers see the host's driver directory
`/home/kubernetes/bin/nvidia` at `/usr/local/nvidia` with its tools on PATH and its libraries on
LD_LIBRARY_PATH; on Bottlerocket the reboot goes through its API (`apiclient reboot` in the host's mount
namespace), not systemd; on OpenShift the repair namespace's `default` ServiceAccount may use the
privileged SCC; and everywhere the reboot step runs a small image (no CUDA image pulled onto a sick node).
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
PRESETS = CHART / "platforms"
GKE_DRIVER = "/home/kubernetes/bin/nvidia"
CUDA_IMAGE = "nvcr.io/nvidia/cuda"


def templates(cp: local.ControlPlane, preset: str) -> dict[str, dict[str, Any]]:
    out = cp.helm(
        "template", "render", str(CHART), "--namespace", "gpu-health", "--kube-version", "1.36.0",
        "-f", str(PRESETS / f"{preset}.yaml"), "--set", "repair.enabled=true",
    ).stdout  # fmt: skip
    objects = [doc for doc in yaml.safe_load_all(out) if doc]
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-repair-templates")
    ]
    return {key: yaml.safe_load(text) for key, text in config_map["data"].items()}


def pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS.glob("*.yaml")))
def test_the_reboot_step_runs_a_small_image_on_every_platform(
    control_plane: local.ControlPlane, preset: str
) -> None:
    (container,) = pod(templates(control_plane, preset)["RebootNode"])["containers"]
    assert not container["image"].startswith(CUDA_IMAGE), container["image"]


def test_gpu_operator_runs_every_repair_pod_in_the_nvidia_runtime_class(
    control_plane: local.ControlPlane,
) -> None:
    found = templates(control_plane, "gpu-operator")
    assert {key: pod(job).get("runtimeClassName") for key, job in found.items()} == dict.fromkeys(
        found, "nvidia"
    )


def test_gke_gives_the_reset_and_validation_the_host_driver(control_plane: local.ControlPlane) -> None:
    found = templates(control_plane, "gke-cos")
    for key in ("ResetGPU", "Validation"):
        spec = pod(found[key])
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        (driver,) = [v for v in volumes.values() if (v.get("hostPath") or {}).get("path") == GKE_DRIVER]
        for container in spec["containers"]:
            mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
            assert mounts[driver["name"]]["mountPath"] == "/usr/local/nvidia", key
            assert mounts[driver["name"]].get("readOnly") is True, key
            variables = env(container)
            assert variables["PATH"].startswith("/usr/local/nvidia/bin:"), key
            assert variables["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/nvidia/lib64", key
        assert not spec.get("runtimeClassName"), key
    assert not pod(found["RebootNode"]).get("volumes"), "the reboot needs no driver"


def test_bottlerocket_reboots_through_its_api(control_plane: local.ControlPlane) -> None:
    spec = pod(templates(control_plane, "eks-bottlerocket")["RebootNode"])
    (container,) = spec["containers"]
    command = [*container.get("command", []), *container.get("args", [])]
    assert command[-2:] == ["apiclient", "reboot"], command
    assert "systemctl" not in command
    assert spec.get("hostPID") is True  # nsenter into the host's PID 1 for its mount namespace


def test_other_platforms_keep_systemd_reboot(control_plane: local.ControlPlane) -> None:
    for preset in ("gpu-operator", "eks-al2023", "aks", "openshift"):
        (container,) = pod(templates(control_plane, preset)["RebootNode"])["containers"]
        assert container["command"][-2:] == ["systemctl", "reboot"], preset
