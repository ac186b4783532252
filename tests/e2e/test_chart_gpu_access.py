"""How the agent reaches the node's GPUs (`agent.gpuAccess.mode`), one render per platform family.

The NVIDIA runtime honouring `NVIDIA_VISIBLE_DEVICES` in an unprivileged pod
(`envvar`, the default) is switched off on Bottlerocket's NVIDIA variants and
by NVIDIA's hardened setting, and absent on GKE's Google-managed drivers. Each
other mode renders the least the platform needs, and the local API server
accepts each DaemonSet (server-side dry run) at the Pod Security level the
mode claims: `restricted` where no host access is needed, `privileged` (the
namespace label) where a hostPath or a privileged container is unavoidable.
kwok runs no containers, so whether a GPU is then visible is for a real node
(`gpu-health-agent check`); these tests pin what is asked of the runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
RELEASE: Final = "access"
KUBE_VERSION: Final = "1.36.0"
MODES: Final = ["envvar", "volumeMounts", "cdi", "hostDriver", "privileged"]
# The least Pod Security level whose namespace admits the agent in each mode.
POD_SECURITY: Final = {
    "envvar": "restricted",
    "cdi": "restricted",
    "volumeMounts": "privileged",  # a hostPath (/dev/null) volume
    "hostDriver": "privileged",  # a hostPath driver directory, a privileged container
    "privileged": "privileged",
}


def render(cp: local.ControlPlane, *args: str, namespace: str = "gpu-health") -> list[dict[str, Any]]:
    out = cp.helm(
        "template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def agent(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return daemonset


def container_of(daemonset: dict[str, Any]) -> dict[str, Any]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def host_paths(daemonset: dict[str, Any]) -> dict[str, str]:
    return {
        v["name"]: v["hostPath"]["path"]
        for v in daemonset["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }


def test_the_default_is_the_env_var_mode_unprivileged(control_plane: local.ControlPlane) -> None:
    daemonset = agent(render(control_plane))
    container = container_of(daemonset)
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(container)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert container["securityContext"]["privileged"] is False
    assert host_paths(daemonset) == {}


def test_volume_mounts_mode_asks_the_runtime_through_a_dev_null_mount(
    control_plane: local.ControlPlane,
) -> None:
    """Bottlerocket and hardened toolkits: `accept-nvidia-visible-devices-as-volume-mounts`."""
    daemonset = agent(render(control_plane, "--set", "agent.gpuAccess.mode=volumeMounts"))
    container = container_of(daemonset)
    (name,) = [n for n, p in host_paths(daemonset).items() if p == "/dev/null"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts[name]["mountPath"] == "/var/run/nvidia-container-devices/all"
    assert mounts[name]["readOnly"] is True
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container)
    assert env_of(container)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert container["securityContext"]["privileged"] is False


def test_cdi_mode_annotates_the_cdi_device_and_can_name_a_runtime_class(
    control_plane: local.ControlPlane,
) -> None:
    daemonset = agent(
        render(
            control_plane,
            "--set",
            "agent.gpuAccess.mode=cdi",
            "--set",
            "agent.runtimeClassName=nvidia-cdi",
        )
    )
    pod = daemonset["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    # The NVIDIA toolkit's NRI plugin reads the per-container key; runtimes
    # applying CDI annotations from the OCI spec read the cdi.k8s.io/ one.
    assert annotations["nvidia.cdi.k8s.io/container.agent"] == "nvidia.com/gpu=all"
    assert annotations["cdi.k8s.io/gpu-health-agent"] == "nvidia.com/gpu=all"
    assert pod["spec"]["runtimeClassName"] == "nvidia-cdi"
    container = container_of(daemonset)
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container)
    assert container["securityContext"]["privileged"] is False
    assert host_paths(daemonset) == {}


def test_host_driver_mode_mounts_the_driver_read_only_and_finds_nvml_there(
    control_plane: local.ControlPlane,
) -> None:
    """GKE's Google-managed drivers: no NVIDIA toolkit, the driver under /home/kubernetes/bin/nvidia."""
    daemonset = agent(render(control_plane, "--set", "agent.gpuAccess.mode=hostDriver"))
    container = container_of(daemonset)
    (name,) = [n for n, p in host_paths(daemonset).items() if p == "/home/kubernetes/bin/nvidia"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts[name] == {"name": name, "mountPath": "/usr/local/nvidia", "readOnly": True}
    assert env_of(container)["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    security = container["securityContext"]
    # Privileged only for the device cgroup (/dev/nvidia*); still not root,
    # no capability, read-only root filesystem.
    assert security["privileged"] is True
    assert "allowPrivilegeEscalation" not in security
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert daemonset["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_privileged_mode_is_privileged_and_nothing_more(control_plane: local.ControlPlane) -> None:
    daemonset = agent(render(control_plane, "--set", "agent.gpuAccess.mode=privileged"))
    container = container_of(daemonset)
    assert container["securityContext"]["privileged"] is True
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert host_paths(daemonset) == {}
    pod = daemonset["spec"]["template"]["spec"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "agent.gpuAccess.mode=magic"], "/agent/gpuAccess/mode"),
        (["--set", "agent.gpuAccess.mode=cdi", "--set", "agent.gpuAccess.cdiDevice=gpu"], "cdiDevice"),
        (
            ["--set", "agent.gpuAccess.mode=hostDriver", "--set", "agent.gpuAccess.hostDriverPath=relative"],
            "hostDriverPath",
        ),
        (["--set", "agent.securityContext.privileged=true"], "set agent.gpuAccess.mode=privileged"),
    ],
    ids=["unknown-mode", "bad-cdi-device", "relative-driver-path", "privileged-by-hand"],
)
def test_bad_gpu_access_values_are_refused(
    control_plane: local.ControlPlane, args: list[str], message: str
) -> None:
    result = control_plane.helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args, check=False
    )
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_is_accepted_by_the_api_server_at_its_pod_security_level(
    crds: local.ControlPlane, namespace: str, mode: str
) -> None:
    level = POD_SECURITY[mode]
    crds.kubectl(
        "label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}", "--overwrite"
    )
    crds.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted", "--overwrite")
    objects = render(crds, "--set", f"agent.gpuAccess.mode={mode}", namespace=namespace)
    daemonset = agent(objects)
    result = crds.kubectl(
        "apply", "--dry-run=server", "--server-side", "--field-manager=chart-test", "-o", "yaml", "-f", "-",
        input=yaml.safe_dump(daemonset),
    )  # fmt: skip
    accepted = yaml.safe_load(result.stdout)
    assert accepted["kind"] == "DaemonSet"
    assert container_of(accepted)["securityContext"] == container_of(daemonset)["securityContext"]
    # `restricted` warns exactly for the modes that need more than it allows.
    assert ("would violate PodSecurity" in result.stderr) == (level != "restricted"), result.stderr
