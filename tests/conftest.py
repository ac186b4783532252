"""Shared fixtures: one local Kubernetes control plane for the whole test session.

`make test` runs the suite in parallel workers (pytest-xdist, `--dist loadfile`): each worker is its
own session with its own control plane on free loopback ports, and a test file runs on one worker.

Fixtures are lazy: a session that selects only unit tests starts nothing.
When the binaries are missing the fixtures fail with what to do (never skip):
a silently skipped integration tier is worse than a red one.

The cluster is shared by every test, so cluster-scoped objects need names
unique to their test module, and namespaced ones belong in the `namespace`
fixture's throwaway namespace.
"""

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

import namespaces
from gpuhealth_sim.controlplane import binaries, local

ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = ROOT / "crds"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.ControlPlane]:
    """A running etcd + kube-apiserver + controller manager + scheduler + kwok; logs in its workdir."""
    directory = binaries.locate(cwd=ROOT)
    plane = local.ControlPlane(directory, tmp_path_factory.mktemp("control-plane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crds(control_plane: local.ControlPlane) -> local.ControlPlane:
    """The control plane with every crds/*.yaml applied and Established."""
    files = sorted(CRD_DIR.glob("*.yaml"))
    if not files:
        return control_plane
    file_args = [arg for path in files for arg in ("-f", str(path))]
    control_plane.kubectl("apply", "--server-side", "--field-manager=gpu-health-tests", *file_args)
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *file_args)
    return control_plane


@pytest.fixture(scope="session")
def k8s(control_plane: local.ControlPlane) -> Iterator[client.ApiClient]:
    """A Kubernetes API client authenticated as the cluster administrator."""
    api = control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, k8s: client.ApiClient) -> Iterator[str]:
    """A fresh namespace for one test, ready for pods (its default service account exists); deleted after."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    with namespaces.created(k8s, f"{base}-{secrets.token_hex(3)}") as name:
        yield name
