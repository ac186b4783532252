"""`helm upgrade` keeps the CRDs current (issue 49, item 7): Helm itself never upgrades a chart's crds/.

A copy of the chart is installed, then upgraded with a changed CRD (a new printer column) and a higher
chart version. Helm leaves the cluster's CRD as it was; the operator pod's init container
(`gpu-health-operator apply-crds`, run here as a real process with the command line the Deployment
declares and a token of the chart's operator ServiceAccount, so the chart's RBAC is what is tested)
applies the chart's copy. A rollback to the older chart does not take the column away again.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
CRD: Final = "gpunodes.gpuhealth.io"
CRD_FILE: Final = "gpuhealth.io_gpunodes.yaml"
COLUMN: Final = {"name": "E2E-UPGRADE", "type": "string", "jsonPath": ".status.agent.backend", "priority": 1}
NEWER: Final = "99.0.0"


def crd(cp: local.ControlPlane) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "crd", CRD, "-o", "json").stdout)
    return out


def columns(cp: local.ControlPlane) -> list[str]:
    (version,) = crd(cp)["spec"]["versions"]
    return [c["name"] for c in version.get("additionalPrinterColumns", [])]


def kubeconfig_for(cp: local.ControlPlane, token: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_cert)}}
        ],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def namespace(control_plane: local.ControlPlane) -> Iterator[str]:
    name = "crd-upgrade-" + secrets.token_hex(3)
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        # Give the session back the CRD it had: the source of truth, replaced whole (column and stamp go).
        control_plane.kubectl("replace", "-f", str(ROOT / "crds" / CRD_FILE))
        control_plane.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def run_init_container(cp: local.ControlPlane, namespace: str, release: str, kubeconfig: Path) -> str:
    """The Deployment's init container, as a process: its command and args, as the operator."""
    deployment = json.loads(
        cp.kubectl(
            "get", "deployment", f"{release}-gpu-health-operator", "-n", namespace, "-o", "json"
        ).stdout
    )
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{release}-gpu-health-operator"
    command = [*init["command"], *init["args"], f"--kubeconfig={kubeconfig}"]
    binary = shutil.which(command[0], path=str(Path(sys.executable).parent))  # this checkout's console script
    assert binary is not None
    done = subprocess.run([binary, *command[1:]], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_helm_upgrade_with_a_changed_crd_changes_the_crd_in_the_cluster_and_a_rollback_does_not(
    control_plane: local.ControlPlane, namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "gpu-health"
    shutil.copytree(CHART, chart)
    release = "crdup"
    pin = ["--set-string", "agent.nodeSelector.e2e\\.gpuhealth\\.io/none=x"]
    pin += ["--set-string", "operator.nodeSelector.e2e\\.gpuhealth\\.io/none=x"]
    control_plane.helm("install", release, str(chart), "-n", namespace, *pin, timeout=180)
    assert COLUMN["name"] not in columns(control_plane)

    # The next release of the chart: a new column in the GPUNode CRD, a higher version.
    manifest = yaml.safe_load((chart / "crds" / CRD_FILE).read_text())
    manifest["spec"]["versions"][0].setdefault("additionalPrinterColumns", []).append(COLUMN)
    (chart / "crds" / CRD_FILE).write_text(yaml.safe_dump(manifest, sort_keys=False))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = NEWER
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    control_plane.helm("upgrade", release, str(chart), "-n", namespace, "--reuse-values", timeout=180)
    assert COLUMN["name"] not in columns(control_plane)  # Helm alone never upgrades crds/

    token = control_plane.kubectl(
        "create", "token", f"{release}-gpu-health-operator", "-n", namespace, "--duration=30m"
    ).stdout.strip()
    kubeconfig = kubeconfig_for(control_plane, token, tmp_path / "operator.kubeconfig")
    run_init_container(control_plane, namespace, release, kubeconfig)
    assert COLUMN["name"] in columns(control_plane)
    assert crd(control_plane)["metadata"]["annotations"]["gpuhealth.io/crds-version"] == NEWER

    # A rollback (the older chart's ConfigMap and pods) leaves the newer CRD in place.
    control_plane.helm("rollback", release, "1", "-n", namespace, timeout=180)
    said = run_init_container(control_plane, namespace, release, kubeconfig)
    assert "left as it is" in said
    assert COLUMN["name"] in columns(control_plane)
    control_plane.helm("uninstall", release, "-n", namespace, check=False, timeout=180)
