"""What a developer sees when the control plane cannot start, and that nothing is left running."""

import os
import stat
import tempfile
from pathlib import Path

import pytest

from gpuhealth_sim.controlplane import local, processes

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")


def fake_binaries(directory: Path, **scripts: str) -> Path:
    """Shell scripts standing in for the binaries: each records its pid, then runs its script or waits."""
    directory.mkdir()
    for name in COMPONENTS:
        body = scripts.get(name.replace("-", "_"), "exec sleep 60")
        path = directory / name
        path.write_text(f'#!/bin/sh\necho $$ > "{directory}/{name}.pid"\n{body}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def assert_not_running(pid_file: Path) -> None:
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    plane = local.ControlPlane(tmp_path, with_kwok=False)

    with pytest.raises(local.ControlPlaneError) as raised:
        plane.start()

    message = str(raised.value)
    assert "lacks etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler" in message
    assert "make testbin" in message


def test_crashing_apiserver_reports_its_log_and_stops_the_rest(tmp_path: Path) -> None:
    bin_dir = fake_binaries(
        tmp_path / "bin", kube_apiserver='echo "Error: unknown flag: --frobnicate" >&2; exit 1'
    )
    workdir = tmp_path / "work"

    with pytest.raises(processes.ProcessError) as raised:
        local.ControlPlane(bin_dir, workdir).start(timeout_seconds=30)

    message = str(raised.value)
    assert "kube-apiserver exited while waiting for kube-apiserver /readyz (exited with 1)" in message
    assert "unknown flag: --frobnicate" in message
    assert str(workdir / "kube-apiserver.log") in message
    assert_not_running(bin_dir / "etcd.pid")


def test_startup_timeout_names_the_step_and_removes_the_temporary_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_binaries(tmp_path / "bin", kube_apiserver='echo "still warming up"; exec sleep 60')
    plane = local.ControlPlane(bin_dir)
    # A temp dir of its own: other control planes on the machine (other tests, other runs) come and go.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    with pytest.raises(local.ControlPlaneError) as raised:
        plane.start(timeout_seconds=4)

    message = str(raised.value)
    assert "waiting for kube-apiserver /readyz" in message
    assert "still warming up" in message
    assert_not_running(bin_dir / "kube-apiserver.pid")
    assert_not_running(bin_dir / "etcd.pid")
    assert not list(temp.glob("gpuhealth-cp-*"))


def test_accessors_explain_that_the_control_plane_is_not_running(tmp_path: Path) -> None:
    plane = local.ControlPlane(tmp_path)

    with pytest.raises(local.ControlPlaneError, match="not running"):
        _ = plane.kubeconfig
    plane.stop()  # idempotent, harmless before start


def test_port_taken_meanwhile_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    bin_dir = fake_binaries(
        tmp_path / "bin",
        kube_apiserver='echo "failed to listen on 127.0.0.1:6443: bind: address already in use" >&2; exit 1',
    )
    workdir = tmp_path / "work"

    with pytest.raises(processes.ProcessError, match="address already in use"):
        local.ControlPlane(bin_dir, workdir).start(timeout_seconds=60)

    starts = [
        line for line in (workdir / "kube-apiserver.log").read_text().splitlines() if "===== starting" in line
    ]
    assert len(starts) == local.PORT_ATTEMPTS
    assert len({line.split("--secure-port=")[1].split()[0] for line in starts}) == local.PORT_ATTEMPTS
