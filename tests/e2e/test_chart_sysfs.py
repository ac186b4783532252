"""Where the agent reads PCIe AER and InfiniBand ports (`agent.sysfs.source`), as the chart renders it.

`container` (default) reads the pod's own read-only /sys: no hostPath, so the
default install stays Pod Security `restricted`; `host` mounts the host's
whole /sys read-only (both sysfs trees are symlinks into /sys/devices);
`none` reads no sysfs. The simulated backend never mounts it: its scenario
writes its own tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

CHART: Final = Path(__file__).resolve().parents[2] / "charts" / "gpu-health"


def agent_pod(cp: local.ControlPlane, *args: str) -> dict[str, Any]:
    out = cp.helm("template", "sysfs", str(CHART), "--kube-version", "1.36.0", *args).stdout
    (daemonset,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def sysfs_args(pod: dict[str, Any]) -> list[str]:
    (container,) = pod["containers"]
    return [a for a in container["args"] if a.startswith("--sysfs-root")]


def host_paths(pod: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}


def test_the_default_reads_the_pods_own_sys_without_a_host_path(
    control_plane: local.ControlPlane,
) -> None:
    pod = agent_pod(control_plane)
    assert sysfs_args(pod) == ["--sysfs-root=/sys"]
    assert host_paths(pod) == {}


def test_host_mounts_the_hosts_sys_read_only(control_plane: local.ControlPlane) -> None:
    pod = agent_pod(control_plane, "--set", "agent.sysfs.source=host")
    assert sysfs_args(pod) == ["--sysfs-root=/host/sys"]
    assert host_paths(pod) == {"host-sys": "/sys"}
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "host-sys"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/host/sys", True)


def test_none_reads_no_sysfs(control_plane: local.ControlPlane) -> None:
    pod = agent_pod(control_plane, "--set", "agent.sysfs.source=none")
    assert sysfs_args(pod) == ["--sysfs-root="]
    assert host_paths(pod) == {}


def test_the_simulated_backend_uses_its_own_tree(control_plane: local.ControlPlane) -> None:
    pod = agent_pod(
        control_plane,
        *("--set", "agent.backend=sim", "--set", "agent.sysfs.source=host"),
        *("--set-string", "agent.sim.scenario=gpus: 1"),
    )
    assert sysfs_args(pod) == []
    assert host_paths(pod) == {}


def test_an_unknown_source_is_refused(control_plane: local.ControlPlane) -> None:
    with pytest.raises(Exception, match="container"):
        agent_pod(control_plane, "--set", "agent.sysfs.source=bogus")
